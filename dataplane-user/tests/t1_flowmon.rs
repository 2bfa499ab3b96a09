//! T1: the real flow monitor in the kernel, run with `BPF_PROG_TEST_RUN` on crafted frames.
//!
//! Each test takes an instance of the embedded object for itself ([`Monitor::load`]), writes
//! `CONFIG` / `MATCH_PREFIXES`, runs frames through `flowmon`, and asserts the exact contents of
//! `FLOWS`, `STATS` and `EVENTS`. Nothing is attached to an interface. Every run also checks the
//! fail-open contract: verdict `TC_ACT_PIPE` and the packet bytes unchanged.
//!
//! Instances are reused: loading `flowmon` is nearly all of a test's time (the verifier walks
//! about 200,000 instructions: 0.2 s on this machine's 6.18, 12-30 s per load in the kernel
//! matrix's TCG guests, where a load per test made `t1_flowmon` take 15 minutes on 6.1). A test
//! holds the binary's one turn ([`TURN`]) while its `Monitor`s live, so tests run one at a time,
//! and each gets an instance whose every map was reset first ([`reset`]): `FLOWS` all `EMPTY`,
//! `STATS` and the log budgets zero on every CPU, `EVENTS` drained, `MATCH_PREFIXES` empty, then
//! its own `CONFIG` and prefixes. An instance whose debug log was read (aya-log takes `AYA_LOGS`
//! out of the object), which ran with the debug log on, or whose test panicked is dropped instead
//! of reused.
//!
//! Needs root (CAP_BPF + CAP_NET_ADMIN) and an object built by `cargo xtask build`; without either
//! the tests fail with a message saying so, they never pass vacuously. Run:
//! `RINGSIDE_EBPF_OBJECT=target/ebpf/bpfel-unknown-none/release/flowmon cargo test -p dataplane-user --test t1_flowmon`
//! (what `cargo xtask test` does).
use std::{
    mem::ManuallyDrop,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    thread,
    time::{Duration, Instant},
};

use aya::{
    maps::{lpm_trie::Key, Array, LpmTrie, MapData, PerCpuArray, PerCpuValues, RingBuf},
    programs::SchedClassifier,
    Ebpf, EbpfLoader,
};
use dataplane_common::{
    config_flags, direction, event_kind, flow_kind, ipv4_mapped, maps, programs, stats,
    wire::{self, bth_opcode},
    flow_hash, slot_state, track, BurstState, Config, Event, FlowKey, FlowSlot, FlowStats, PortRange,
    PrefixValue, DEBUG_LOG_PER_SEC, FLOW_PROBES, MAP_FULL_EVENTS_PER_SEC, ROCEV2_UDP_PORT,
};
use zerocopy::FromBytes as _;
use ringside_test_support::{
    frames::{self, Ipv4Opts, VlanTag, MAC_A, MAC_B},
    testrun::{self, SkbContext, LOOPBACK_IFINDEX},
};

/// TC_ACT_PIPE (include/uapi/linux/pkt_cls.h).
const TC_ACT_PIPE: u32 = 3;
const TC_ACT_OK: u32 = 0;

const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];
const NCCL_PORT: u16 = 29500;

/// One loaded instance of the monitor, this test's alone while it lives (see the module docs).
struct Monitor {
    ebpf: ManuallyDrop<Ebpf>,
    /// `FLOWS` capacity it was loaded with (`None`: the object's default).
    slots: Option<u32>,
    /// Whether it can go back to [`POOL`] when the test ends.
    reusable: bool,
    _turn: Turn,
}

/// Held by the test whose `Monitor`s live: one test at a time uses instances.
static TURN: Mutex<()> = Mutex::new(());

thread_local! {
    /// This thread's live `Turn`s and, while there is one, its hold on [`TURN`] (a test may hold
    /// two monitors at once).
    static HELD: std::cell::RefCell<(u32, Option<MutexGuard<'static, ()>>)> = const { std::cell::RefCell::new((0, None)) };
}

/// One monitor's share of its thread's hold on [`TURN`].
struct Turn;

impl Turn {
    fn take() -> Turn {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if h.0 == 0 {
                h.1 = Some(TURN.lock().unwrap_or_else(PoisonError::into_inner));
            }
            h.0 += 1;
        });
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            h.0 -= 1;
            if h.0 == 0 {
                h.1 = None;
            }
        });
    }
}

/// Loaded instances free for the next test, with the `FLOWS` capacity each was loaded with.
static POOL: Mutex<Vec<(Option<u32>, Ebpf)>> = Mutex::new(Vec::new());

impl Drop for Monitor {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used after.
        let ebpf = unsafe { ManuallyDrop::take(&mut self.ebpf) };
        if self.reusable && !thread::panicking() {
            POOL.lock().unwrap_or_else(PoisonError::into_inner).push((self.slots, ebpf));
        }
    }
}

/// Puts every map of an instance back as a fresh load has it, but `CONFIG` (the caller writes it).
fn reset(ebpf: &mut Ebpf) {
    clear_flows(ebpf);
    let cpus = aya::util::nr_cpus().expect("the number of possible CPUs");
    {
        let mut st: PerCpuArray<&mut MapData, u64> = PerCpuArray::try_from(ebpf.map_mut(maps::STATS).unwrap()).unwrap();
        for i in 0..stats::COUNT {
            st.set(i, PerCpuValues::try_from(vec![0u64; cpus]).unwrap(), 0).unwrap();
        }
    }
    {
        // The program's `LogBudget { credit_ns, last_ns }` per CPU; all zero is a full bucket.
        let mut budgets: PerCpuArray<&mut MapData, [u64; 2]> = PerCpuArray::try_from(ebpf.map_mut("LOG_BUDGET").expect("the LOG_BUDGET map")).unwrap();
        for i in 0..budgets.len() {
            budgets.set(i, PerCpuValues::try_from(vec![[0u64; 2]; cpus]).unwrap(), 0).unwrap();
        }
    }
    {
        let mut rb = RingBuf::try_from(ebpf.map_mut(maps::EVENTS).unwrap()).unwrap();
        while rb.next().is_some() {}
    }
    let mut trie: LpmTrie<&mut MapData, [u8; 16], PrefixValue> = LpmTrie::try_from(ebpf.map_mut(maps::MATCH_PREFIXES).unwrap()).unwrap();
    let keys: Vec<Key<[u8; 16]>> = trie.keys().map(|k| k.unwrap()).collect();
    for k in keys {
        trie.remove(&k).unwrap();
    }
}

/// Writes a zeroed slot over every slot of `FLOWS` that is not all zero (found through one mmap:
/// a syscall per slot would be slow in the kernel matrix's guests).
fn clear_flows(ebpf: &mut Ebpf) {
    let Some(aya::maps::Map::Array(data)) = ebpf.map(maps::FLOWS) else { panic!("FLOWS is an array map") };
    let used: Vec<u32> = testrun::flow_slots(data).expect("mmap FLOWS").iter().enumerate().filter(|(_, s)| **s != FlowSlot::default()).map(|(i, _)| i as u32).collect();
    let mut flows: Array<&mut MapData, FlowSlot> = Array::try_from(ebpf.map_mut(maps::FLOWS).unwrap()).unwrap();
    for i in used {
        flows.set(i, FlowSlot::default(), 0).unwrap();
    }
}

impl Monitor {
    fn load(config: Config, prefixes: &[(u32, [u8; 16])]) -> Self {
        Self::load_sized(config, prefixes, None)
    }

    /// `load` with `FLOWS` sized `slots` at load time (and `CONFIG`'s mask to match): an instance
    /// of that capacity from [`POOL`], its maps reset, or a new one.
    fn load_sized(mut config: Config, prefixes: &[(u32, [u8; 16])], slots: Option<u32>) -> Self {
        let turn = Turn::take();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!(
                "T1 tests load eBPF programs and run BPF_PROG_TEST_RUN, which needs root \
                 (CAP_BPF + CAP_NET_ADMIN): run them as root, e.g. with `cargo xtask test`"
            );
        }
        let object = dataplane_user::object::flowmon_object().unwrap_or_else(|e| {
            panic!("{e} (for T1: set RINGSIDE_EBPF_OBJECT to the built flowmon object)")
        });
        if let Some(n) = slots {
            config.flow_slot_mask = n - 1;
        }
        let pooled = {
            let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
            pool.iter().position(|(n, _)| *n == slots).map(|i| pool.swap_remove(i).1)
        };
        let mut ebpf = match pooled {
            Some(mut ebpf) => {
                reset(&mut ebpf);
                ebpf
            }
            None => {
                let mut loader = EbpfLoader::new();
                if let Some(n) = slots {
                    loader.map_max_entries(maps::FLOWS, n);
                }
                let mut ebpf = loader.load(object).expect("the flowmon object loads");
                for name in [programs::FLOWMON, programs::NOOP] {
                    let prog: &mut SchedClassifier = ebpf.program_mut(name).unwrap().try_into().unwrap();
                    prog.load().unwrap_or_else(|e| panic!("verifier rejected {name}: {e:?}"));
                }
                ebpf
            }
        };
        {
            let mut cfg: Array<&mut MapData, Config> =
                Array::try_from(ebpf.map_mut(maps::CONFIG).unwrap()).unwrap();
            cfg.set(0, config, 0).unwrap();
        }
        {
            let mut trie: LpmTrie<&mut MapData, [u8; 16], PrefixValue> =
                LpmTrie::try_from(ebpf.map_mut(maps::MATCH_PREFIXES).unwrap()).unwrap();
            for (i, (len, addr)) in prefixes.iter().enumerate() {
                trie.insert(&Key::new(*len, *addr), i as PrefixValue + 1, 0).unwrap();
            }
        }
        // STATS is per CPU and a test run executes on the caller's CPU: keep the test on one CPU
        // (tests of several CPUs re-pin with `on_cpu`).
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() }.max(0) as usize;
        testrun::pin_current_thread(cpu).expect("pin the test thread to its CPU");
        // A test that turns the debug log on leaves records in AYA_LOGS; reset does not drain it.
        let reusable = config.flags & config_flags::DEBUG_LOG == 0;
        Self { ebpf: ManuallyDrop::new(ebpf), slots, reusable, _turn: turn }
    }

    fn program(&self, name: &str) -> &SchedClassifier {
        self.ebpf.program(name).unwrap().try_into().unwrap()
    }

    /// Runs `flowmon` on `frame` `repeat` times and checks the fail-open contract.
    fn run_n(&self, frame: &[u8], ctx: &SkbContext, repeat: u32) {
        let out = testrun::run(self.program(programs::FLOWMON), frame, Some(ctx), repeat)
            .expect("BPF_PROG_TEST_RUN");
        assert!(
            out.return_value == TC_ACT_PIPE || out.return_value == TC_ACT_OK,
            "verdict {} is not TC_ACT_PIPE/OK",
            out.return_value
        );
        assert_eq!(out.data_out, frame, "the monitor changed the packet");
    }

    /// Like `run`, for frames `BPF_PROG_TEST_RUN` may refuse (see [`kernel_refuses`]).
    fn run_or_refused(&self, frame: &[u8]) -> bool {
        if kernel_refuses(frame) {
            let err = testrun::run(self.program(programs::FLOWMON), frame, Some(&SkbContext::ingress()), 1);
            assert!(err.is_err(), "the kernel was expected to refuse a {}-byte frame", frame.len());
            false
        } else {
            self.run(frame);
            true
        }
    }

    fn run(&self, frame: &[u8]) {
        self.run_n(frame, &SkbContext::ingress(), 1);
    }

    fn stats(&self) -> [u64; stats::COUNT as usize] {
        let arr: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(self.ebpf.map(maps::STATS).unwrap()).unwrap();
        let mut out = [0u64; stats::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = arr.get(&(i as u32), 0).unwrap().iter().sum();
        }
        out
    }

    /// Every slot of `FLOWS`, by index.
    /// Every slot, through one mmap (`testrun::flow_slots`): by index it is a syscall per slot.
    fn slots(&self) -> Vec<FlowSlot> {
        let Some(aya::maps::Map::Array(data)) = self.ebpf.map(maps::FLOWS) else { panic!("FLOWS is an array map") };
        testrun::flow_slots(data).expect("mmap FLOWS")
    }

    fn set_slot(&mut self, index: u32, slot: FlowSlot) {
        let mut m: Array<&mut MapData, FlowSlot> = Array::try_from(self.ebpf.map_mut(maps::FLOWS).unwrap()).unwrap();
        m.set(index, slot, 0).unwrap();
    }

    /// Keys of the live slots (each key at most once: asserted).
    fn flow_keys(&self) -> Vec<FlowKey> {
        let keys: Vec<FlowKey> = self.slots().iter().filter(|s| s.state & slot_state::TAG_MASK == slot_state::LIVE).map(|s| s.key).collect();
        let mut dedup = keys.clone();
        dedup.sort_by_key(|k| zerocopy::IntoBytes::as_bytes(k).to_vec());
        dedup.dedup();
        assert_eq!(dedup.len(), keys.len(), "a flow is live in two slots");
        keys
    }

    /// Index and contents of the live slot holding `key`, probing its window as the program does
    /// (at most FLOW_PROBES reads; reading the whole table is one syscall per slot and too slow
    /// between runs that must fall in one burst).
    fn find(&self, key: &FlowKey) -> Option<(u32, FlowSlot)> {
        let m: Array<&MapData, FlowSlot> = Array::try_from(self.ebpf.map(maps::FLOWS).unwrap()).unwrap();
        let h = flow_hash(key, 0);
        (0..FLOW_PROBES).map(|p| (h as u32).wrapping_add(p) & (m.len() - 1)).find_map(|i| {
            let s = m.get(&i, 0).unwrap();
            (s.state & slot_state::TAG_MASK == slot_state::LIVE && s.key == *key).then_some((i, s))
        })
    }

    /// Index of the live slot holding `key`, if any.
    fn slot_of(&self, key: &FlowKey) -> Option<u32> {
        self.find(key).map(|(i, _)| i)
    }

    /// The flow's entry in `FLOWS` (shared by all CPUs): counters, open burst, tracking words.
    fn flow(&self, key: &FlowKey) -> FlowStats {
        self.find(key).unwrap_or_else(|| panic!("flow {key:?} not in FLOWS")).1.stats
    }

    /// Empties every slot that is not empty.
    fn clear_flows(&mut self) {
        clear_flows(&mut self.ebpf);
    }

    /// The flow's open burst, as a `BURST_END` event would report it if it ended now.
    fn burst(&self, key: &FlowKey) -> BurstState {
        let s = self.flow(key);
        BurstState {
            start_ns: s.burst_start_ns,
            last_ns: s.last_seen_ns,
            bytes: s.bytes - s.burst_start_bytes,
            packets: s.packets - s.burst_start_packets,
        }
    }

    fn events(&mut self) -> Vec<Event> {
        let mut rb = RingBuf::try_from(self.ebpf.map_mut(maps::EVENTS).unwrap()).unwrap();
        let mut out = Vec::new();
        while let Some(item) = rb.next() {
            // A copy (any alignment); `Event: FromBytes` makes any bytes a valid value.
            out.push(Event::read_from_bytes(&item).expect("a record is exactly one Event"));
        }
        out
    }
}

/// Frames `BPF_PROG_TEST_RUN` refuses with EINVAL before the program runs (net/bpf/test_run.c,
/// bpf_prog_test_run_skb): an untagged IPv4/IPv6 EtherType without a complete fixed IP header.
/// (Frames under 14 bytes are refused too; `testrun::run` does not send them.) Truncated IP headers are therefore exercised behind a VLAN
/// tag, where the kernel does not look.
fn kernel_refuses(frame: &[u8]) -> bool {
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    (ethertype == wire::ETH_P_IP && frame.len() < wire::ETH_HLEN + wire::IPV4_MIN_HLEN)
        || (ethertype == wire::ETH_P_IPV6 && frame.len() < wire::ETH_HLEN + wire::IPV6_HLEN)
}

/// A config matching TCP and UDP on the NCCL port range.
fn nccl_config() -> Config {
    let mut c = Config::default();
    c.n_port_ranges = 1;
    c.port_ranges[0] = PortRange { lo: NCCL_PORT, hi: NCCL_PORT + 10, protocol: 0, _pad: [0; 3] };
    c
}

fn key4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, protocol: u8, kind: u8) -> FlowKey {
    key6(ipv4_mapped(src), ipv4_mapped(dst), sport, dport, protocol, kind)
}

fn key6(src: [u8; 16], dst: [u8; 16], sport: u16, dport: u16, protocol: u8, kind: u8) -> FlowKey {
    FlowKey {
        src_addr: src,
        dst_addr: dst,
        src_port: sport,
        dst_port: dport,
        ifindex: LOOPBACK_IFINDEX,
        protocol,
        direction: direction::INGRESS,
        kind,
        _pad: 0,
    }
}

fn rkey(src: [u8; 4], dst: [u8; 4], sport: u16) -> FlowKey {
    key4(src, dst, sport, ROCEV2_UDP_PORT, wire::IPPROTO_UDP, flow_kind::ROCEV2)
}

/// L3 length of an untagged Ethernet frame.
fn l3(frame: &[u8]) -> u64 {
    (frame.len() - wire::ETH_HLEN) as u64
}

fn write(psn: u32) -> Vec<u8> {
    frames::rocev2_4(A, B, 50000, bth_opcode::RC_RDMA_WRITE_MIDDLE, 0x11, psn, &[], &[0xab; 256])
}

fn v6(last: u8) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[0] = 0xfd;
    a[15] = last;
    a
}

fn assert_stats(m: &Monitor, expect: &[(u32, u64)]) {
    let s = m.stats();
    for &(i, v) in expect {
        assert_eq!(s[i as usize], v, "STATS[{i}] (all: {s:?})");
    }
    // Every packet ends in exactly one outcome.
    assert_eq!(
        s[stats::SEEN as usize],
        s[stats::PARSED as usize]
            + s[stats::MALFORMED as usize]
            + s[stats::UNSUPPORTED as usize]
            + s[stats::UNREADABLE as usize],
        "outcomes do not add up: {s:?}"
    );
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn rocev2_psn_gaps_out_of_order_naks_and_cnps() {
    let m = Monitor::load(Config::default(), &[]);
    let mut l3_total = 0;
    // 10 11 12 | 15 (skips 13,14) 16 | 14 (behind) | 17 | 20 (skips 18,19)
    for psn in [10, 11, 12, 15, 16, 14, 17, 20] {
        let f = write(psn);
        l3_total += l3(&f);
        m.run(&f);
    }
    let s = m.flow(&rkey(A, B, 50000));
    assert_eq!(s.packets, 8);
    assert_eq!(s.bytes, l3_total);
    assert_eq!(s.payload_bytes, 8 * (12 + 256 + 4));
    assert_eq!(s.roce_psn_gap_events, 2);
    assert_eq!(s.roce_psn_gap_packets, 4);
    assert_eq!(s.roce_psn_out_of_order, 1);
    assert_eq!((s.roce_naks, s.roce_cnps), (0, 0));
    assert_eq!(track::psn(m.flow(&rkey(A, B, 50000)).roce_psn), Some((21, 0x11)));
    assert!(s.first_seen_ns > 0 && s.first_seen_ns <= s.last_seen_ns);

    // The responder's direction: ACK, NAK (PSN sequence error), RNR NAK (not a NAK), CNP.
    let ack = |syndrome: u8, psn: u32| {
        frames::rocev2_4(B, A, 50001, bth_opcode::RC_ACK, 0x22, psn, &frames::aeth(syndrome, 1), &[])
    };
    m.run(&ack(0x1f, 12));
    m.run(&ack(0x60, 13));
    m.run(&ack(0x60, 13));
    m.run(&ack(0x20 | 0x0e, 13));
    m.run(&frames::rocev2_4(B, A, 50001, bth_opcode::CNP, 0x22, 0, &[], &[0; 16]));
    let r = m.flow(&rkey(B, A, 50001));
    assert_eq!(r.packets, 5);
    assert_eq!(r.roce_naks, 2);
    assert_eq!(r.roce_cnps, 1);
    // ACK PSNs are not a sequence: no gap or reorder accounting on them.
    assert_eq!((r.roce_psn_gap_events, r.roce_psn_out_of_order), (0, 0));
    assert_stats(&m, &[(stats::SEEN, 13), (stats::PARSED, 13), (stats::MATCHED, 13), (stats::MALFORMED, 0)]);
    assert_eq!(m.flow_keys().len(), 2);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn rocev2_psn_wraps_at_2_pow_24_and_resets_on_new_qp() {
    let m = Monitor::load(Config::default(), &[]);
    let qp = |qp: u32, psn: u32| {
        frames::rocev2_4(A, B, 50000, bth_opcode::RC_SEND_MIDDLE, qp, psn, &[], &[0; 64])
    };
    for psn in [0xff_fffe, 0xff_ffff, 0, 1] {
        m.run(&qp(7, psn));
    }
    let s = m.flow(&rkey(A, B, 50000));
    assert_eq!((s.roce_psn_gap_events, s.roce_psn_out_of_order), (0, 0), "wrap is not a gap");
    m.run(&qp(7, 0xff_fffd)); // behind, across the wrap
    m.run(&qp(7, 4)); // expected 2: skips 2, 3
    let s = m.flow(&rkey(A, B, 50000));
    assert_eq!(s.roce_psn_out_of_order, 1);
    assert_eq!((s.roce_psn_gap_events, s.roce_psn_gap_packets), (1, 2));
    // A new QP on the same 5-tuple starts its own PSN space: no gap, no reorder, even though
    // 0xfffffe is far from the old QP's expectation.
    m.run(&qp(9, 0xff_fffe));
    m.run(&qp(9, 0xff_ffff));
    let s = m.flow(&rkey(A, B, 50000));
    assert_eq!((s.roce_psn_gap_events, s.roce_psn_out_of_order), (1, 1));
    // Gap across the wrap: expected 0xffffff + 1 = 0, got 2 (0 and 1 skipped).
    m.run(&qp(9, 2));
    let s = m.flow(&rkey(A, B, 50000));
    assert_eq!(s.packets, 9);
    assert_eq!(s.roce_psn_out_of_order, 1);
    assert_eq!((s.roce_psn_gap_events, s.roce_psn_gap_packets), (2, 4));
    assert_eq!(track::psn(m.flow(&rkey(A, B, 50000)).roce_psn), Some((3, 9)));
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn tcp_retransmissions_acks_flags_and_ce() {
    let m = Monitor::load(nccl_config(), &[]);
    let data = |seq: u32, len: usize, tos: u8| {
        frames::tcp4(A, B, 40000, NCCL_PORT, seq, 1, wire::TCP_ACK | wire::TCP_PSH, tos, &vec![0x5a; len])
    };
    let mut bytes = 0;
    let mut send = |f: Vec<u8>| {
        bytes += l3(&f);
        m.run(&f);
    };
    send(data(1000, 100, 0x02)); // ECT(0)
    send(data(1100, 100, 0x03)); // CE
    send(data(1200, 100, 0x03)); // CE
    send(data(1100, 100, 0x00)); // retransmission: below the highest end (1300)
    send(data(1300, 100, 0x00));
    send(data(1250, 50, 0x00)); // partial retransmission
    send(frames::tcp4(A, B, 40000, NCCL_PORT, 1400, 1, wire::TCP_ACK | wire::TCP_FIN, 0, &[]));
    let s = m.flow(&key4(A, B, 40000, NCCL_PORT, wire::IPPROTO_TCP, flow_kind::TCP));
    assert_eq!(s.packets, 7);
    assert_eq!(s.bytes, bytes);
    assert_eq!(s.payload_bytes, 550);
    assert_eq!(s.ce_marks, 2);
    assert_eq!(s.tcp_retrans, 2);
    assert_eq!(s.tcp_fin, 1);
    assert_eq!(s.tcp_pure_acks, 0, "FIN is not a pure ACK");
    let st = m.flow(&key4(A, B, 40000, NCCL_PORT, wire::IPPROTO_TCP, flow_kind::TCP));
    assert_eq!(track::tcp(st.tcp_seq_end), Some(1400));

    // Reverse direction: pure ACKs with and without D-SACKs (Linux's option layout), ECE/CWR,
    // RST, SYN, and option bytes that are not a SACK or are malformed.
    let ts = Some((7, 9));
    let ack = |ackno: u32, flags: u8, options: Vec<u8>| frames::tcp4_with_options(B, A, NCCL_PORT, 40000, 1, ackno, flags, &options, &[]);
    for (ackno, flags, options, what) in [
        (1100, wire::TCP_ACK, vec![], "no options"),
        (1200, wire::TCP_ACK, frames::linux_ack_options(ts, &[]), "the timestamp alone"),
        (1200, wire::TCP_ACK, frames::linux_ack_options(ts, &[(1100, 1200)]), "D-SACK: the retransmitted 1100..1200, below the ACK"),
        (1200, wire::TCP_ACK | wire::TCP_ECE, frames::linux_ack_options(ts, &[(1300, 1400)]), "SACK above the ACK: a hole, not a D-SACK"),
        (1400, wire::TCP_ACK | wire::TCP_CWR, frames::linux_ack_options(None, &[(1250, 1300)]), "D-SACK without timestamps (32-byte header)"),
        (1400, wire::TCP_ACK, frames::linux_ack_options(ts, &[(1250, 1300), (1500, 1600)]), "D-SACK, two blocks"),
        (1400, wire::TCP_ACK, vec![1, 1, wire::TCP_OPT_SACK, 2], "SACK option without a block"),
        (1400, wire::TCP_ACK, vec![1, 1, 30, 0], "an option of length 0"),
        (1400, wire::TCP_ACK, vec![1, 1, 30, 40], "an option longer than the header"),
        (1400, wire::TCP_ACK, vec![1; 40], "40 NOPs"),
        (1400, wire::TCP_ACK, [vec![2, 4, 5, 180], frames::linux_ack_options(None, &[(1250, 1300)])].concat(), "a SACK after an MSS option: not where Linux puts it, not read"),
        (1400, wire::TCP_ACK | wire::TCP_RST, frames::linux_ack_options(ts, &[(1250, 1300)]), "RST: not a pure ACK"),
        (0, wire::TCP_SYN, vec![], "SYN: not a pure ACK"),
    ] {
        let dsacks = || m.find(&key4(B, A, NCCL_PORT, 40000, wire::IPPROTO_TCP, flow_kind::TCP)).map_or(0, |(_, slot)| slot.stats.tcp_dsacks);
        let before = dsacks();
        m.run(&ack(ackno, flags, options));
        let after = dsacks();
        let expected = u64::from(what.starts_with("D-SACK"));
        assert_eq!(after - before, expected, "{what}");
    }
    let r = m.flow(&key4(B, A, NCCL_PORT, 40000, wire::IPPROTO_TCP, flow_kind::TCP));
    assert_eq!(r.packets, 13);
    assert_eq!(r.payload_bytes, 0);
    assert_eq!(r.tcp_pure_acks, 11);
    assert_eq!(r.tcp_dsacks, 3);
    assert_eq!((r.tcp_ece, r.tcp_cwr, r.tcp_rst, r.tcp_syn, r.tcp_fin), (1, 1, 1, 1, 0));
    assert_eq!(r.tcp_retrans, 0);
    let st = m.flow(&key4(B, A, NCCL_PORT, 40000, wire::IPPROTO_TCP, flow_kind::TCP));
    assert_eq!(track::tcp(st.tcp_seq_end), None);
    assert_stats(&m, &[(stats::SEEN, 20), (stats::MATCHED, 20)]);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn tcp_sequence_comparison_wraps_at_2_pow_32() {
    let m = Monitor::load(nccl_config(), &[]);
    let data = |seq: u32, len: usize| {
        frames::tcp4(A, B, 40001, NCCL_PORT + 3, seq, 1, wire::TCP_ACK, 0, &vec![0; len])
    };
    m.run(&data(0xffff_ff00, 0x80));
    m.run(&data(0xffff_ff80, 0x100)); // ends at 0x80 after the wrap
    m.run(&data(0x80, 0x10));
    let key = key4(A, B, 40001, NCCL_PORT + 3, wire::IPPROTO_TCP, flow_kind::TCP);
    assert_eq!(m.flow(&key).tcp_retrans, 0, "wrapping forward is not a retransmission");
    m.run(&data(0xffff_ffa0, 0x10)); // before the wrap: behind
    let s = m.flow(&key);
    assert_eq!(s.tcp_retrans, 1);
    assert_eq!(track::tcp(m.flow(&key).tcp_seq_end), Some(0x90));
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn tcp_options_and_gso_super_packets() {
    let m = Monitor::load(nccl_config(), &[]);
    // Data offset 8 (12 option bytes): payload excludes options.
    let seg = frames::tcp_with_options(40002, NCCL_PORT, 1, 1, wire::TCP_ACK, &[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2], &[7; 300]);
    let f = frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IP, &frames::ipv4(A, B, 6, &Ipv4Opts::default(), &seg));
    m.run(&f);
    let key = key4(A, B, 40002, NCCL_PORT, wire::IPPROTO_TCP, flow_kind::TCP);
    assert_eq!(m.flow(&key).payload_bytes, 300);
    // A GSO skb standing for 3 segments of 1000 bytes: 3 packets, headers counted 3 times.
    // (Test-run frames must fit a page, hence 3 segments.)
    let gso = frames::tcp4(A, B, 40002, NCCL_PORT, 301, 1, wire::TCP_ACK, 0, &[1; 3000]);
    m.run_n(&gso, &SkbContext { gso_segs: 3, gso_size: 1000, ..SkbContext::ingress() }, 1);
    let s = m.flow(&key);
    assert_eq!(s.packets, 1 + 3);
    assert_eq!(s.payload_bytes, 300 + 3000);
    assert_eq!(s.bytes, l3(&f) + l3(&gso) + 2 * 40);
    assert_eq!(s.tcp_retrans, 0);
    assert_eq!(track::tcp(m.flow(&key).tcp_seq_end), Some(3301));

    // Retransmissions inside GSO super-packets count the wire segments below the highest end
    // (3301), as the sender's RetransSegs does: [1301, 4301) overlaps 2 segments of old data and
    // carries 1 new one; [301, 3301) is entirely old: 3.
    let gso_ctx = SkbContext { gso_segs: 3, gso_size: 1000, ..SkbContext::ingress() };
    m.run_n(&frames::tcp4(A, B, 40002, NCCL_PORT, 1301, 1, wire::TCP_ACK, 0, &[1; 3000]), &gso_ctx, 1);
    assert_eq!(m.flow(&key).tcp_retrans, 2);
    assert_eq!(track::tcp(m.flow(&key).tcp_seq_end), Some(4301));
    m.run_n(&gso, &gso_ctx, 1);
    assert_eq!(m.flow(&key).tcp_retrans, 2 + 3);
    // A partial overlap rounds up: [4001, 5001) has 300 old bytes in its first segment of 500.
    let half = SkbContext { gso_segs: 2, gso_size: 500, ..SkbContext::ingress() };
    m.run_n(&frames::tcp4(A, B, 40002, NCCL_PORT, 4001, 1, wire::TCP_ACK, 0, &[1; 1000]), &half, 1);
    let s = m.flow(&key);
    assert_eq!((s.tcp_retrans, s.packets), (2 + 3 + 1, 1 + 3 + 3 + 3 + 2));
    assert_eq!(track::tcp(m.flow(&key).tcp_seq_end), Some(5001));
}

/// The detections compare against state shared by all CPUs: a retransmission or PSN gap is seen on a CPU that never saw the packets before it. Counters stay per CPU.
#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn detections_see_packets_handled_by_other_cpus() {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    assert!(cpus >= 2, "this test needs 2 CPUs to run packets on two of them; this machine has {cpus}");
    let on_cpu = |cpu: usize| testrun::pin_current_thread(cpu).expect("pin the test thread");
    // A burst gap far above the time the test takes (migrating between CPUs takes milliseconds
    // on a loaded machine), so all packets of a flow fall into one burst.
    let m = Monitor::load(Config { burst_gap_ns: 60_000_000_000, ..nccl_config() }, &[]);
    let data = |seq: u32| frames::tcp4(A, B, 40003, NCCL_PORT, seq, 1, wire::TCP_ACK, 0, &[0; 100]);
    let ack = |ackno: u32| frames::tcp4(B, A, NCCL_PORT, 40003, 1, ackno, wire::TCP_ACK, 0, &[]);

    on_cpu(0);
    m.run(&data(1000));
    m.run(&data(1100));
    m.run(&ack(1100));
    m.run(&write(10));
    m.run(&write(11));
    on_cpu(1);
    m.run(&data(1000)); // original on CPU 0
    m.run(&data(1200)); // new data
    m.run(&ack(1100));
    m.run(&write(13)); // 12 never seen: gap of 1
    m.run(&write(11)); // behind the expectation (14) CPU 1 set from CPU 0's state
    on_cpu(0);
    m.run(&data(1250)); // starts below the end (1300) CPU 1 raised; ends at 1350
    m.run(&write(14)); // in order after CPU 1's 13: no gap

    // One shared entry per flow, counting all CPUs' packets: CPU 0's 3 data segments and CPU 1's
    // 2, one retransmission seen on each CPU.
    let tcp_key = key4(A, B, 40003, NCCL_PORT, wire::IPPROTO_TCP, flow_kind::TCP);
    let tcp = m.flow(&tcp_key);
    assert_eq!((tcp.packets, tcp.tcp_retrans), (5, 2));
    let acks = m.flow(&key4(B, A, NCCL_PORT, 40003, wire::IPPROTO_TCP, flow_kind::TCP));
    assert_eq!((acks.packets, acks.tcp_pure_acks), (2, 2));
    let roce = m.flow(&rkey(A, B, 50000));
    let psn = |s: &FlowStats| (s.packets, s.roce_psn_gap_events, s.roce_psn_gap_packets, s.roce_psn_out_of_order);
    assert_eq!(psn(&roce), (5, 1, 1, 1));

    // The tracking state and the open burst of all CPUs' packets.
    assert_eq!(track::tcp(tcp.tcp_seq_end), Some(1350));
    assert_eq!(m.burst(&tcp_key).packets, 5, "one burst across CPUs");
    assert_eq!(track::psn(roce.roce_psn), Some((15, 0x11)));
    assert_eq!(m.burst(&rkey(A, B, 50000)).packets, 5);
    assert_eq!(m.flow_keys().len(), 3);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn direction_comes_from_ingress_ifindex() {
    let m = Monitor::load(Config::default(), &[]);
    m.run_n(&write(1), &SkbContext::ingress(), 1);
    m.run_n(&write(2), &SkbContext::egress(), 3);
    let mut keys = m.flow_keys();
    keys.sort_by_key(|k| k.direction);
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], rkey(A, B, 50000));
    assert_eq!(keys[1], FlowKey { direction: direction::EGRESS, ..rkey(A, B, 50000) });
    assert_eq!(m.flow(&keys[1]).packets, 3);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn unmatched_packets_leave_no_flow_state() {
    // All-zero config (the kernel's initial value): only RoCEv2.
    let m = Monitor::load(Config { burst_gap_ns: 0, ..Config::default() }, &[]);
    m.run(&frames::tcp4(A, B, 40000, NCCL_PORT, 1, 1, wire::TCP_ACK, 0, &[0; 10]));
    m.run(&frames::udp4(A, B, 40000, NCCL_PORT, &[0; 10]));
    assert!(m.flow_keys().is_empty());
    assert_stats(&m, &[(stats::SEEN, 2), (stats::PARSED, 2), (stats::MATCHED, 0)]);
    m.run(&write(5));
    assert_stats(&m, &[(stats::SEEN, 3), (stats::PARSED, 3), (stats::MATCHED, 1)]);

    // A port range that does not cover the packet.
    let m = Monitor::load(nccl_config(), &[]);
    m.run(&frames::tcp4(A, B, 22, 40000, 1, 1, wire::TCP_ACK, 0, &[0; 10]));
    m.run(&frames::tcp4(A, B, 22, NCCL_PORT + 11, 1, 1, wire::TCP_ACK, 0, &[0; 10]));
    assert!(m.flow_keys().is_empty());
    assert_stats(&m, &[(stats::SEEN, 2), (stats::PARSED, 2), (stats::MATCHED, 0)]);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn port_ranges_match_either_port_and_respect_protocol() {
    let mut c = Config::default();
    c.n_port_ranges = 3;
    c.port_ranges[0] = PortRange { lo: 100, hi: 100, protocol: wire::IPPROTO_UDP, _pad: [0; 3] };
    c.port_ranges[1] = PortRange { lo: 200, hi: 299, protocol: wire::IPPROTO_TCP, _pad: [0; 3] };
    c.port_ranges[2] = PortRange { lo: 1000, hi: 1000, protocol: 0, _pad: [0; 3] };
    // Beyond n_port_ranges: must be ignored.
    c.port_ranges[3] = PortRange { lo: 0, hi: 65535, protocol: 0, _pad: [0; 3] };
    let m = Monitor::load(c, &[]);
    let tcp = |s: u16, d: u16| frames::tcp4(A, B, s, d, 1, 1, wire::TCP_ACK, 0, &[]);
    let udp = |s: u16, d: u16| frames::udp4(A, B, s, d, &[1, 2, 3]);
    m.run(&udp(5000, 100)); // range 0 by dport
    m.run(&tcp(5000, 100)); // range 0 is UDP only
    m.run(&tcp(250, 5000)); // range 1 by sport
    m.run(&udp(250, 5000)); // range 1 is TCP only
    m.run(&udp(1000, 7)); // range 2, any protocol
    m.run(&tcp(7, 1000));
    m.run(&tcp(7, 8)); // only range 3 would match, and it is not configured
    let mut got: Vec<(u16, u16, u8)> =
        m.flow_keys().iter().map(|k| (k.src_port, k.dst_port, k.protocol)).collect();
    got.sort();
    assert_eq!(got, vec![(7, 1000, 6), (250, 5000, 6), (1000, 7, 17), (5000, 100, 17)]);
    let k = key4(A, B, 5000, 100, wire::IPPROTO_UDP, flow_kind::UDP);
    assert_eq!(m.flow(&k).payload_bytes, 3);
    assert_stats(&m, &[(stats::SEEN, 7), (stats::MATCHED, 4)]);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn prefixes_match_source_or_destination() {
    let mut c = Config::default();
    c.n_prefixes = 2;
    let m = Monitor::load(c, &[(96 + 16, ipv4_mapped([10, 1, 0, 0])), (8, v6(0))]);
    let tcp = |s: [u8; 4], d: [u8; 4]| frames::tcp4(s, d, 1234, 5678, 1, 1, wire::TCP_ACK, 0, &[]);
    m.run(&tcp([10, 1, 2, 3], [10, 9, 9, 9]));
    m.run(&tcp([10, 9, 9, 9], [10, 1, 0, 7]));
    m.run(&tcp([10, 2, 0, 1], [10, 3, 0, 1])); // neither
    let six = frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IPV6, &frames::ipv6(v6(1), v6(2), 17, 0, &frames::udp(1, 2, &[0; 8])));
    m.run(&six);
    let mut other = v6(1);
    other[0] = 0xfe;
    let six_no = frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IPV6, &frames::ipv6(other, other, 17, 0, &frames::udp(1, 2, &[0; 8])));
    m.run(&six_no);
    assert_eq!(m.flow_keys().len(), 3);
    m.flow(&key6(v6(1), v6(2), 1, 2, wire::IPPROTO_UDP, flow_kind::UDP));
    assert_stats(&m, &[(stats::SEEN, 5), (stats::MATCHED, 3)]);

    // Ports AND prefixes: both must hold.
    let mut c = nccl_config();
    c.n_prefixes = 1;
    let m = Monitor::load(c, &[(96 + 24, ipv4_mapped([10, 1, 2, 0]))]);
    m.run(&frames::tcp4([10, 1, 2, 3], B, 1, NCCL_PORT, 1, 1, wire::TCP_ACK, 0, &[]));
    m.run(&frames::tcp4([10, 1, 3, 3], B, 1, NCCL_PORT, 1, 1, wire::TCP_ACK, 0, &[]));
    m.run(&frames::tcp4([10, 1, 2, 3], B, 1, 80, 1, 1, wire::TCP_ACK, 0, &[]));
    assert_eq!(m.flow_keys(), vec![key4([10, 1, 2, 3], B, 1, NCCL_PORT, 6, flow_kind::TCP)]);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn vlan_single_and_double_tags() {
    let m = Monitor::load(Config::default(), &[]);
    let ip = frames::ipv4(A, B, 17, &Ipv4Opts::default(), &frames::udp(50000, ROCEV2_UDP_PORT, &frames::rocev2_payload(&frames::bth(0x07, 3, 1, false), &[], &[0; 32])));
    let one = frames::ethernet(MAC_B, MAC_A, &[VlanTag::c_tag(10)], wire::ETH_P_IP, &ip);
    let two = frames::ethernet(MAC_B, MAC_A, &[VlanTag::s_tag(20), VlanTag::c_tag(10)], wire::ETH_P_IP, &ip);
    let three = frames::ethernet(MAC_B, MAC_A, &[VlanTag::s_tag(20), VlanTag::c_tag(10), VlanTag::c_tag(5)], wire::ETH_P_IP, &ip);
    m.run(&one);
    m.run(&two);
    m.run(&three);
    let s = m.flow(&rkey(A, B, 50000));
    assert_eq!(s.packets, 2);
    assert_eq!(s.bytes, 2 * ip.len() as u64, "bytes are L3: tags excluded");
    assert_stats(&m, &[(stats::SEEN, 3), (stats::MATCHED, 2), (stats::UNSUPPORTED, 1)]);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn ipv6_transport_ecn_and_extension_headers() {
    let m = Monitor::load(nccl_config(), &[]);
    let seg = frames::tcp(40000, NCCL_PORT, 5, 1, wire::TCP_ACK, &[0; 100]);
    let ce = frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IPV6, &frames::ipv6(v6(1), v6(2), 6, 0xb8 | 0x03, &seg));
    m.run(&ce);
    let s = m.flow(&key6(v6(1), v6(2), 40000, NCCL_PORT, 6, flow_kind::TCP));
    assert_eq!((s.packets, s.bytes, s.payload_bytes, s.ce_marks), (1, 40 + 120, 100, 1));
    // Hop-by-hop options before TCP: not walked, counted unsupported.
    let mut ext = frames::ipv6_options_header(6);
    ext.extend_from_slice(&seg);
    let hbh = frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IPV6, &frames::ipv6(v6(1), v6(3), 0, 0, &ext));
    m.run(&hbh);
    // RoCEv2 over IPv6 needs no configuration.
    let roce = frames::udp(50000, ROCEV2_UDP_PORT, &frames::rocev2_payload(&frames::bth(0x81, 1, 0, false), &[], &[0; 16]));
    m.run(&frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IPV6, &frames::ipv6(v6(4), v6(5), 17, 0, &roce)));
    assert_eq!(m.flow(&key6(v6(4), v6(5), 50000, ROCEV2_UDP_PORT, 17, flow_kind::ROCEV2)).roce_cnps, 1);
    assert_eq!(m.flow_keys().len(), 2);
    assert_stats(&m, &[(stats::SEEN, 3), (stats::MATCHED, 2), (stats::UNSUPPORTED, 1)]);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn ipv4_fragments_and_other_protocols_are_unsupported() {
    let m = Monitor::load(nccl_config(), &[]);
    let seg = frames::tcp(40000, NCCL_PORT, 5, 1, wire::TCP_ACK, &[0; 64]);
    let frag = |flags_frag: u16| {
        frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IP, &frames::ipv4(A, B, 6, &Ipv4Opts { flags_frag, ..Ipv4Opts::default() }, &seg))
    };
    m.run(&frag(wire::IPV4_MF)); // first fragment
    m.run(&frag(wire::IPV4_MF | 100)); // middle
    m.run(&frag(200)); // last
    m.run(&frag(0)); // not a fragment (DF clear): parsed
    let icmp = frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IP, &frames::ipv4(A, B, 1, &Ipv4Opts::default(), &[8, 0, 0, 0]));
    m.run(&icmp);
    let arp = frames::ethernet(MAC_B, MAC_A, &[], 0x0806, &[0; 28]);
    m.run(&arp);
    assert_stats(&m, &[(stats::SEEN, 6), (stats::UNSUPPORTED, 5), (stats::PARSED, 1), (stats::MATCHED, 1)]);
    assert_eq!(m.flow(&key4(A, B, 40000, NCCL_PORT, 6, flow_kind::TCP)).packets, 1);
}

/// Frames that exercise every header the parser reads, for the truncation sweep.
fn full_frames() -> Vec<(&'static str, Vec<u8>)> {
    let opts = Ipv4Opts { options: vec![0x01, 0x01, 0x01, 0x00, 0x44, 0x04, 0x05, 0x00], ..Ipv4Opts::default() };
    let nak = frames::rocev2_payload(&frames::bth(bth_opcode::RC_ACK, 3, 9, false), &frames::aeth(0x60, 1), &[]);
    vec![
        ("tcp4", frames::tcp4(A, B, 40000, NCCL_PORT, 1, 1, wire::TCP_ACK, 0, &[0; 8])),
        (
            "qinq ipv4-options roce nak",
            frames::ethernet(MAC_B, MAC_A, &[VlanTag::s_tag(2), VlanTag::c_tag(3)], wire::ETH_P_IP, &frames::ipv4(A, B, 17, &opts, &frames::udp(1, ROCEV2_UDP_PORT, &nak))),
        ),
        (
            "vlan tcp6",
            frames::ethernet(MAC_B, MAC_A, &[VlanTag::c_tag(3)], wire::ETH_P_IPV6, &frames::ipv6(v6(1), v6(2), 6, 0, &frames::tcp(1, NCCL_PORT, 1, 1, wire::TCP_ACK, &[0; 4]))),
        ),
        ("udp4", frames::udp4(A, B, 1, NCCL_PORT, &[0; 3])),
        (
            "vlan udp4 (cuts inside the IPv4 header reach the program)",
            frames::ethernet(MAC_B, MAC_A, &[VlanTag::c_tag(3)], wire::ETH_P_IP, &frames::ipv4(A, B, 17, &opts, &frames::udp(1, NCCL_PORT, &[0; 3]))),
        ),
    ]
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn truncated_frames_at_every_length_are_malformed() {
    for (name, full) in full_frames() {
        let m = Monitor::load(nccl_config(), &[]);
        let mut n = 0;
        for len in wire::ETH_HLEN..full.len() {
            if m.run_or_refused(&full[..len]) {
                n += 1;
            }
        }
        assert!(m.flow_keys().is_empty(), "{name}: a truncated frame was counted");
        assert_stats(&m, &[(stats::SEEN, n), (stats::MALFORMED, n), (stats::PARSED, 0)]);
        m.run(&full);
        assert_eq!(m.flow_keys().len(), 1, "{name}: the full frame is counted");
        assert_stats(&m, &[(stats::SEEN, n + 1), (stats::MALFORMED, n), (stats::MATCHED, 1)]);
    }
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn inconsistent_headers_are_malformed() {
    let m = Monitor::load(nccl_config(), &[]);
    let good = frames::tcp4(A, B, 40000, NCCL_PORT, 1, 1, wire::TCP_ACK, 0, &[0; 8]);
    let mut bad = Vec::new();
    let mut edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut v = good.clone();
        f(&mut v);
        bad.push(v);
    };
    edit(&|v| v[14] = 0x44); // IHL 4
    edit(&|v| v[14] = 0x55); // version 5
    edit(&|v| v[14] = 0x4f); // IHL 15 > total length
    edit(&|v| v[16..18].copy_from_slice(&200u16.to_be_bytes())); // total length beyond the frame
    edit(&|v| v[16..18].copy_from_slice(&19u16.to_be_bytes())); // total length below the header
    edit(&|v| v[14 + 20 + 12] = 0x40); // TCP data offset 4
    edit(&|v| v[14 + 20 + 12] = 0xf0); // TCP data offset 60 > segment
    let udp = frames::udp4(A, B, 1, NCCL_PORT, &[0; 3]);
    let mut short_len = udp.clone();
    short_len[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&7u16.to_be_bytes());
    bad.push(short_len);
    let mut long_len = udp.clone();
    long_len[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&12u16.to_be_bytes());
    bad.push(long_len);
    // RoCEv2 port without a full BTH.
    bad.push(frames::udp4(A, B, 1, ROCEV2_UDP_PORT, &[0; 11]));
    let v6_bad = frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IPV6, &{
        let mut p = frames::ipv6(v6(1), v6(2), 6, 0, &frames::tcp(1, NCCL_PORT, 1, 1, wire::TCP_ACK, &[]));
        p[0] = 0x40; // version 4 in an IPv6 EtherType
        p
    });
    bad.push(v6_bad);
    let n = bad.len() as u64;
    for f in &bad {
        m.run(f);
    }
    assert!(m.flow_keys().is_empty());
    assert_stats(&m, &[(stats::SEEN, n), (stats::MALFORMED, n)]);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn garbage_never_breaks_the_contract() {
    let m = Monitor::load(nccl_config(), &[(96 + 8, ipv4_mapped([10, 0, 0, 0]))]);
    // Deterministic xorshift: reproducible garbage.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut n = 0u64;
    for i in 0..400 {
        let len = 14 + (next() % 180) as usize;
        let mut f: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        // Steer a share of them past the EtherType check so the IP/L4 parsers see garbage too.
        match i % 4 {
            0 => f[12..14].copy_from_slice(&wire::ETH_P_IP.to_be_bytes()),
            1 => f[12..14].copy_from_slice(&wire::ETH_P_IPV6.to_be_bytes()),
            2 => f[12..14].copy_from_slice(&wire::ETH_P_8021Q.to_be_bytes()),
            _ => {}
        }
        if m.run_or_refused(&f) {
            n += 1;
        }
    }
    assert!(n > 300, "most garbage frames reach the program ({n})");
    let s = m.stats();
    assert_eq!(s[stats::SEEN as usize], n);
    assert!(s[stats::MATCHED as usize] <= s[stats::PARSED as usize]);
    assert!(m.flow_keys().len() as u64 <= s[stats::MATCHED as usize]);
    assert_stats(&m, &[]);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn bursts_end_after_the_idle_gap_and_reach_the_ring_buffer() {
    // A gap large enough that back-to-back runs on a loaded 2-core machine stay in one burst.
    const GAP_NS: u64 = 150_000_000;
    let config = Config {
        burst_gap_ns: GAP_NS,
        flags: config_flags::BURST_EVENTS | config_flags::FLOW_START_EVENTS,
        ..Config::default()
    };
    let mut m = Monitor::load(config, &[]);
    let f = write(1);
    let key = rkey(A, B, 50000);
    // One syscall, five runs: microseconds apart, one burst.
    m.run_n(&f, &SkbContext::ingress(), 5);
    let first = m.burst(&key);
    assert_eq!((first.packets, first.bytes), (5, 5 * l3(&f)));
    assert!(first.start_ns <= first.last_ns && first.last_ns - first.start_ns < GAP_NS);
    let ev = m.events();
    assert_eq!(ev.len(), 1, "only FLOW_START so far: {ev:?}");
    assert_eq!(ev[0].kind, event_kind::FLOW_START);
    assert_eq!(ev[0].key, key);
    assert_eq!(ev[0].burst.start_ns, m.flow(&key).first_seen_ns);
    assert_eq!(first.start_ns, m.flow(&key).first_seen_ns, "the first packet starts the first burst");

    thread::sleep(Duration::from_nanos(GAP_NS) + Duration::from_millis(100));
    m.run(&f);
    let ev = m.events();
    assert_eq!(ev.len(), 1, "one BURST_END: {ev:?}");
    assert_eq!(ev[0].kind, event_kind::BURST_END);
    assert_eq!(ev[0].key, key);
    assert_eq!(ev[0].burst, first, "the event carries the burst that ended");
    let second = m.burst(&key);
    assert_eq!((second.packets, second.bytes), (1, l3(&f)));
    assert!(second.start_ns >= first.last_ns + GAP_NS);
    // More packets right away extend the new burst without an event.
    m.run_n(&f, &SkbContext::ingress(), 2);
    assert!(m.events().is_empty());
    assert_eq!(m.burst(&key).packets, 3);
    assert_eq!(m.flow(&key).packets, 8);
    assert_stats(&m, &[(stats::EVENTS, 2), (stats::RINGBUF_FULL, 0)]);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn burst_events_are_off_unless_configured() {
    const GAP_NS: u64 = 20_000_000;
    let mut m = Monitor::load(Config { burst_gap_ns: GAP_NS, flags: 0, ..Config::default() }, &[]);
    let f = write(1);
    m.run_n(&f, &SkbContext::ingress(), 3);
    thread::sleep(Duration::from_nanos(GAP_NS) + Duration::from_millis(30));
    m.run(&f);
    assert!(m.events().is_empty());
    // The burst still restarted.
    assert_eq!(m.burst(&rkey(A, B, 50000)).packets, 1);
    assert_stats(&m, &[(stats::EVENTS, 0)]);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn noop_baseline_passes_packets_untouched() {
    let m = Monitor::load(Config::default(), &[]);
    let f = write(1);
    let out = testrun::run(m.program(programs::NOOP), &f, None, 10).unwrap();
    assert_eq!(out.return_value, TC_ACT_PIPE);
    assert_eq!(out.data_out, f);
    assert_stats(&m, &[(stats::SEEN, 0)]);
}


/// Collects aya-log records as `(level, message)`.
#[derive(Clone, Default)]
struct LogCapture(Arc<Mutex<Vec<(log::Level, String)>>>);

impl log::Log for LogCapture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        self.0.lock().unwrap().push((r.level(), r.args().to_string()));
    }
    fn flush(&self) {}
}

impl Monitor {
    /// Every record on the classifier's debug log (`AYA_LOGS`) so far, decoded by aya-log. Takes
    /// the map out of the object (the loaded program keeps it alive): call it once per monitor.
    fn log_records(&mut self) -> Vec<(log::Level, String)> {
        self.reusable = false;
        let capture = LogCapture::default();
        let mut logger = aya_log::EbpfLogger::init_with_logger(&mut *self.ebpf, capture.clone())
            .expect("the object has the AYA_LOGS ring buffer");
        logger.flush();
        drop(logger);
        let out = capture.0.lock().unwrap().clone();
        out
    }
}

/// A frame the parser rejects as malformed: IPv4 header length 4 words.
fn malformed_frame() -> Vec<u8> {
    let mut f = frames::tcp4(A, B, 40000, NCCL_PORT, 1, 1, wire::TCP_ACK, 0, &[0; 8]);
    f[14] = 0x44;
    f
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn debug_log_is_off_unless_configured() {
    let mut m = Monitor::load(nccl_config(), &[]);
    m.run_n(&malformed_frame(), &SkbContext::ingress(), 20);
    m.run(&frames::tcp4(A, B, 40000, NCCL_PORT, 1, 1, wire::TCP_ACK, 0, &[0; 8]));
    assert_stats(&m, &[(stats::SEEN, 21), (stats::MALFORMED, 20), (stats::MATCHED, 1)]);
    assert_eq!(m.log_records(), vec![], "the debug log wrote records while off");
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn debug_log_records_new_flows_and_skipped_packets() {
    let mut m = Monitor::load(Config { flags: config_flags::DEBUG_LOG, ..nccl_config() }, &[]);
    m.run(&frames::tcp4(A, B, 40000, NCCL_PORT, 1, 1, wire::TCP_ACK, 0, &[0; 8]));
    // Not a new flow: no record.
    m.run(&frames::tcp4(A, B, 40000, NCCL_PORT, 9, 1, wire::TCP_ACK, 0, &[0; 8]));
    m.run(&malformed_frame());
    let arp = frames::ethernet(MAC_B, MAC_A, &[], 0x0806, &[0; 28]);
    m.run(&arp);
    let records = m.log_records();
    let messages: Vec<&str> = records.iter().map(|(_, msg)| msg.as_str()).collect();
    assert_eq!(
        messages,
        vec![
            "new flow [::ffff:10.0.0.1]:40000 -> [::ffff:10.0.0.2]:29500 proto 6 kind 1 ifindex 1 direction 0",
            "skipped malformed packet: len 62 ifindex 1",
            "skipped unsupported packet: len 42 ifindex 1",
        ]
    );
    assert!(records.iter().all(|(level, _)| *level == log::Level::Debug));
    // The counters are the same as with the log off.
    assert_stats(&m, &[(stats::SEEN, 4), (stats::MATCHED, 2), (stats::MALFORMED, 1), (stats::UNSUPPORTED, 1)]);
    assert_eq!(m.flow(&key4(A, B, 40000, NCCL_PORT, 6, flow_kind::TCP)).packets, 2);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn debug_log_is_rate_limited_per_cpu() {
    let mut m = Monitor::load(Config { flags: config_flags::DEBUG_LOG, ..nccl_config() }, &[]);
    let started = Instant::now();
    m.run_n(&malformed_frame(), &SkbContext::ingress(), 1000);
    let elapsed = started.elapsed();
    let records = m.log_records();
    // A full bucket (one second's worth), plus what refilled while the runs went on.
    let refill = (elapsed.as_secs_f64() * DEBUG_LOG_PER_SEC as f64).ceil() as usize;
    assert!(
        records.len() >= DEBUG_LOG_PER_SEC as usize && records.len() <= DEBUG_LOG_PER_SEC as usize + refill,
        "{} records for 1000 skipped packets in {elapsed:?}",
        records.len()
    );
    // Every packet is still counted and passed (run_n checks the verdict and the bytes).
    assert_stats(&m, &[(stats::SEEN, 1000), (stats::MALFORMED, 1000)]);
}

/// Frames the fuzzer mutates: every shape the parser handles, matched and not.
fn fuzz_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = full_frames().into_iter().map(|(_, f)| f).collect();
    seeds.push(write(7));
    seeds.push(frames::rocev2_4(A, B, 50001, bth_opcode::CNP, 0x12, 0, &[], &[0; 16]));
    seeds.push(frames::rocev2_4(A, B, 50002, bth_opcode::RC_ACK, 0x13, 9, &frames::aeth(0x60, 1), &[]));
    seeds.push(frames::ethernet(
        MAC_B,
        MAC_A,
        &[],
        wire::ETH_P_IPV6,
        &frames::ipv6(v6(1), v6(2), 0, 0, &{
            let mut p = frames::ipv6_options_header(wire::IPPROTO_UDP);
            p.extend(frames::udp(1, NCCL_PORT, &[0; 8]));
            p
        }),
    ));
    let frag = Ipv4Opts { flags_frag: 0x2000 | 3, ..Ipv4Opts::default() };
    seeds.push(frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IP, &frames::ipv4(A, B, 6, &frag, &frames::tcp(1, NCCL_PORT, 1, 1, wire::TCP_ACK, &[0; 8]))));
    seeds.push(frames::tcp4(A, B, 40000, 22, 1, 1, wire::TCP_ACK | wire::TCP_PSH, 3, &[0; 64]));
    seeds
}

/// Applies one random mutation: the kinds a fuzzer finds parser bugs with (bit flips, boundary
/// values in bytes and 16-bit length/port fields, truncation, extension, inserted VLAN tags).
fn mutate(f: &mut Vec<u8>, r: &mut impl FnMut() -> u64) {
    const BYTES: [u8; 12] = [0, 0xff, 0x40, 0x45, 0x4f, 0x60, 0x81, 0x08, 0x86, 0xdd, 0x11, 0x06];
    const WORDS: [u16; 10] = [0, 0xffff, 4791, NCCL_PORT, 0x0800, 0x86dd, 0x8100, 0x88a8, 20, 1500];
    let at = |r: &mut dyn FnMut() -> u64, len: usize| (r() % len.max(1) as u64) as usize;
    match r() % 8 {
        0 => {
            let i = at(r, f.len());
            f[i] ^= 1 << (r() % 8);
        }
        1 => {
            let i = at(r, f.len());
            f[i] = BYTES[(r() % BYTES.len() as u64) as usize];
        }
        2 if f.len() >= 2 => {
            let i = at(r, f.len() - 1);
            f[i..i + 2].copy_from_slice(&WORDS[(r() % WORDS.len() as u64) as usize].to_be_bytes());
        }
        3 => {
            let len = wire::ETH_HLEN + at(r, f.len() + 1 - wire::ETH_HLEN);
            f.truncate(len);
        }
        4 => {
            let n = at(r, 64) + 1;
            f.extend((0..n).map(|_| r() as u8));
        }
        5 if f.len() >= wire::ETH_HLEN => {
            let tpid = if r() % 2 == 0 { wire::ETH_P_8021Q } else { 0x88a8 };
            let mut tag = tpid.to_be_bytes().to_vec();
            tag.extend((r() as u16 & 0x0fff).to_be_bytes());
            f.splice(12..12, tag);
        }
        6 => {
            let i = at(r, f.len());
            let n = at(r, 8) + 1;
            for b in f.iter_mut().skip(i).take(n) {
                *b = r() as u8;
            }
        }
        _ => {
            let i = at(r, f.len());
            f[i] = f[i].wrapping_add(1 + (r() % 3) as u8);
        }
    }
}

/// Issue 11's hostile input: random and mutated frames through the real program. No frame may
/// crash it or change its verdict or bytes (checked on every run), and every frame is counted
/// exactly once: SEEN = PARSED + MALFORMED + UNSUPPORTED + UNREADABLE, and the packets in FLOWS add
/// up to MATCHED. Checked per batch of 4,000 frames (FLOWS is emptied between batches, so LRU
/// eviction cannot hide a count). CI runs 200,000 frames; `RINGSIDE_FUZZ_FRAMES=5000000` and
/// `RINGSIDE_FUZZ_SEED=N` run more, or another sequence (the seed is printed).
#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn fuzzed_frames_are_all_counted_and_pass_untouched() {
    let total: u64 = std::env::var("RINGSIDE_FUZZ_FRAMES").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000);
    let seed: u64 = std::env::var("RINGSIDE_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5eed_0f_f1e5);
    eprintln!("fuzzing {total} frames, RINGSIDE_FUZZ_SEED={seed}");
    let mut m = Monitor::load(nccl_config(), &[(96 + 8, ipv4_mapped([10, 0, 0, 0]))]);
    let seeds = fuzz_seeds();
    let mut x = seed | 1;
    let mut r = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    const BATCH: u64 = 4_000;
    let started = Instant::now();
    let (mut done, mut refused, mut matched_total) = (0u64, 0u64, 0u64);
    while done < total {
        let before = m.stats();
        let mut ran = 0u64;
        let n = BATCH.min(total - done);
        for _ in 0..n {
            let mut f = if r() % 10 == 0 {
                let len = wire::ETH_HLEN + (r() % 200) as usize;
                (0..len).map(|_| r() as u8).collect()
            } else {
                seeds[(r() % seeds.len() as u64) as usize].clone()
            };
            for _ in 0..1 + r() % 4 {
                mutate(&mut f, &mut r);
            }
            if f.len() < wire::ETH_HLEN || kernel_refuses(&f) {
                refused += 1;
                continue;
            }
            let ctx = if r() % 2 == 0 { SkbContext::ingress() } else { SkbContext::egress() };
            m.run_n(&f, &ctx, 1);
            ran += 1;
        }
        done += n;
        let after = m.stats();
        let d = |i: u32| after[i as usize] - before[i as usize];
        let frame = || format!("batch ending at frame {done} (RINGSIDE_FUZZ_SEED={seed})");
        assert_eq!(d(stats::SEEN), ran, "{}: frames run vs SEEN", frame());
        assert_eq!(
            d(stats::SEEN),
            d(stats::PARSED) + d(stats::MALFORMED) + d(stats::UNSUPPORTED) + d(stats::UNREADABLE),
            "{}: every frame is parsed, malformed, unsupported or unreadable, exactly once",
            frame()
        );
        assert!(d(stats::MATCHED) <= d(stats::PARSED), "{}", frame());
        assert_eq!(d(stats::MAP_FULL), 0, "{}: FLOWS is emptied between batches", frame());
        // Every matched frame is in FLOWS (one packet each: no GSO context here).
        // One read of the table (a slot read is a syscall per slot; not one per key).
        let _unique = m.flow_keys();
        let packets: u64 = m
            .slots()
            .iter()
            .filter(|s| s.state & slot_state::TAG_MASK == slot_state::LIVE)
            .map(|s| s.stats.packets)
            .sum();
        assert_eq!(packets, d(stats::MATCHED), "{}: packets in FLOWS vs MATCHED", frame());
        matched_total += d(stats::MATCHED);
        m.clear_flows();
        let _ = m.events();
    }
    let s = m.stats();
    eprintln!(
        "fuzzed {total} frames in {:.1} s: {} ran ({refused} refused by the kernel before the program), parsed {}, matched {matched_total}, malformed {}, unsupported {}, unreadable {}",
        started.elapsed().as_secs_f64(),
        s[stats::SEEN as usize],
        s[stats::PARSED as usize],
        s[stats::MALFORMED as usize],
        s[stats::UNSUPPORTED as usize],
        s[stats::UNREADABLE as usize]
    );
    // The mix must reach every outcome, or the fuzzer is not exercising the parser.
    for (what, i) in [("parsed", stats::PARSED), ("matched", stats::MATCHED), ("malformed", stats::MALFORMED), ("unsupported", stats::UNSUPPORTED)] {
        assert!(s[i as usize] > total / 100, "only {} of {total} frames were {what}", s[i as usize]);
    }
}

// --- FLOWS as an open-addressing table (layout 3) ---

/// A UDP frame of flow `i` (distinct source ports) and its key.
fn udp_flow(i: u16) -> (Vec<u8>, FlowKey) {
    let f = frames::udp4(A, B, 40000 + i, NCCL_PORT, &[0x5a; 64]);
    (f, key4(A, B, 40000 + i, NCCL_PORT, wire::IPPROTO_UDP, flow_kind::UDP))
}

fn home(key: &FlowKey, slots: u32) -> u32 {
    flow_hash(key, 0) as u32 & (slots - 1)
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn flows_take_their_home_slot_or_the_next_free_one_and_a_full_window_is_counted() {
    // 16 slots: collisions are certain with a few dozen flows.
    const SLOTS: u32 = 16;
    // `load_sized` pins the test to one CPU, so one MAP_FULL token bucket (they are per CPU)
    // serves every run: the rate bound below is exact.
    let started = std::time::Instant::now();
    let mut m = Monitor::load_sized(nccl_config(), &[], Some(SLOTS));
    let mut expect_occupied = [false; SLOTS as usize];
    let (mut placed, mut full) = (0u64, 0u64);
    let mut untracked = Vec::new();
    for i in 0..64u16 {
        let (frame, key) = udp_flow(i);
        m.run(&frame);
        let h = home(&key, SLOTS);
        // Where the program must have put it: the first free slot of its probe window.
        let want = (0..FLOW_PROBES).map(|p| (h + p) & (SLOTS - 1)).find(|&s| !expect_occupied[s as usize]);
        match want {
            Some(s) => {
                assert_eq!(m.slot_of(&key), Some(s), "flow {i}: home {h}");
                expect_occupied[s as usize] = true;
                placed += 1;
                // A second packet finds it again (no second slot).
                m.run(&frame);
                assert_eq!(m.flow(&key).packets, 2, "flow {i}");
            }
            None => {
                assert_eq!(m.slot_of(&key), None, "flow {i}: its probe window is full");
                full += 2;
                m.run(&frame);
                untracked.push((frame, key));
            }
        }
    }
    assert!(full > 0 && placed as u32 <= SLOTS, "64 flows in 16 slots: some windows fill ({placed} placed)");
    assert_eq!(m.flow_keys().len() as u64, placed);
    // MATCHED counts every matched packet, the uncounted ones included (MAP_FULL says which).
    assert_stats(&m, &[(stats::MATCHED, 2 * placed + full), (stats::MAP_FULL, full), (stats::CONTENDED, 0)]);

    // MAP_FULL events name the untracked flows, at most MAP_FULL_EVENTS_PER_SEC per CPU per
    // second (a bucket that starts full), while STATS[MAP_FULL] counts every packet.
    const FLOOD: u64 = 1000;
    for _ in 0..FLOOD {
        m.run(&untracked[0].0);
    }
    let events = m.events();
    let elapsed_s = started.elapsed().as_secs() + 1;
    let map_full: Vec<&Event> = events.iter().filter(|e| e.kind == event_kind::MAP_FULL).collect();
    assert_eq!(map_full.len(), events.len(), "only MAP_FULL events are on (no flow-start/burst flags)");
    assert!(!map_full.is_empty(), "a full window emits MAP_FULL events");
    for e in &map_full {
        assert!(untracked.iter().any(|(_, k)| *k == e.key), "MAP_FULL event for a tracked flow: {:?}", e.key);
    }
    // Bound: one bucket (one CPU), full at the start and refilled for the time the whole test
    // took, rounded up.
    let bound = MAP_FULL_EVENTS_PER_SEC * (1 + elapsed_s);
    assert!(
        (map_full.len() as u64) <= bound.min(full + FLOOD),
        "{} MAP_FULL events for {} untracked packets in {elapsed_s} s: the rate limit ({MAP_FULL_EVENTS_PER_SEC}/s per CPU) does not hold",
        map_full.len(),
        full + FLOOD
    );
    assert!(full + FLOOD > bound, "the flood must exceed what the bucket allows, or the bound proves nothing");
    assert_stats(&m, &[(stats::MAP_FULL, full + FLOOD)]);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn a_slot_being_claimed_by_another_cpu_is_contended_and_the_packet_passes() {
    const SLOTS: u32 = 64;
    let mut m = Monitor::load_sized(nccl_config(), &[], Some(SLOTS));
    let (frame, key) = udp_flow(1);
    let h = flow_hash(&key, 0);
    let home = h as u32 & (SLOTS - 1);
    // Another CPU has claimed the home slot for this flow and not yet written the key.
    m.set_slot(home, FlowSlot { state: slot_state::with_fp(slot_state::CLAIMING, h), ..FlowSlot::default() });
    m.run(&frame);
    assert_stats(&m, &[(stats::MATCHED, 1), (stats::CONTENDED, 1), (stats::MAP_FULL, 0)]);
    assert_eq!(m.slot_of(&key), None, "not created twice");
    // It finished: the next packet is counted there.
    m.set_slot(home, FlowSlot { state: slot_state::with_fp(slot_state::LIVE, h), key, ..FlowSlot::default() });
    m.run(&frame);
    assert_eq!((m.slot_of(&key), m.flow(&key).packets), (Some(home), 1));
    // A claim by another flow with another fingerprint is probed past.
    let (frame2, key2) = udp_flow(2);
    let h2 = flow_hash(&key2, 0);
    let home2 = h2 as u32 & (SLOTS - 1);
    m.set_slot(home2, FlowSlot { state: slot_state::with_fp(slot_state::CLAIMING, !h2), ..FlowSlot::default() });
    m.run(&frame2);
    assert_eq!(m.slot_of(&key2), Some((home2 + 1) & (SLOTS - 1)));
    assert_stats(&m, &[(stats::CONTENDED, 1)]);
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn lookups_go_past_tombstones_and_new_flows_reuse_them_with_zeroed_counters() {
    const SLOTS: u32 = 64;
    let mut m = Monitor::load_sized(nccl_config(), &[], Some(SLOTS));
    let (frame, key) = udp_flow(3);
    let h = flow_hash(&key, 0);
    let home_slot = h as u32 & (SLOTS - 1);
    // The flow probed past a flow since evicted by the agent: tombstone at home, the flow after it.
    let stale = FlowStats { packets: 1000, bytes: 1_000_000, last_seen_ns: 5, ..FlowStats::default() };
    m.set_slot(home_slot, FlowSlot { state: slot_state::TOMBSTONE, stats: stale, ..FlowSlot::default() });
    let next = (home_slot + 1) & (SLOTS - 1);
    m.set_slot(next, FlowSlot { state: slot_state::with_fp(slot_state::LIVE, h), key, ..FlowSlot::default() });
    m.run(&frame);
    assert_eq!(m.slot_of(&key), Some(next), "found past the tombstone, not created again in it");
    assert_eq!(m.flow(&key).packets, 1);
    // A new flow whose probe reaches the tombstone first takes it, with counters from zero.
    let other = (0..4096u16).map(udp_flow).find(|(_, k)| home(k, SLOTS) == home_slot && k != &key).expect("a flow with the same home slot");
    m.run(&other.0);
    assert_eq!(m.slot_of(&other.1), Some(home_slot));
    let s = m.flow(&other.1);
    assert_eq!((s.packets, s.bytes), (1, l3(&other.0)), "the tombstone's old counters are gone");
    assert_stats(&m, &[(stats::MATCHED, 2), (stats::MAP_FULL, 0), (stats::CONTENDED, 0)]);
}

/// The live slots holding `key` in a copy of the table: (index, slot).
fn live_slots_of(slots: &[FlowSlot], key: &FlowKey) -> Vec<(u32, FlowSlot)> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.state & slot_state::TAG_MASK == slot_state::LIVE && s.key == *key)
        .map(|(i, s)| (i as u32, *s))
        .collect()
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn the_agent_evicts_through_the_mmap_with_the_nonzero_seed_it_gave_the_program() {
    use std::os::fd::AsFd as _;
    const SLOTS: u32 = 64;
    let mut m = Monitor::load_sized(nccl_config(), &[], Some(SLOTS));
    // The seed as the agent sets it: `loader::write_config` on a CONFIG of no layout yet (a fresh
    // map reads all zero) picks a random one and writes it to CONFIG, where the program reads it.
    {
        let mut cfg: Array<&mut MapData, Config> = Array::try_from(m.ebpf.map_mut(maps::CONFIG).unwrap()).unwrap();
        cfg.set(0, <Config as zerocopy::FromZeros>::new_zeroed(), 0).unwrap();
    }
    let seed = dataplane_user::loader::write_config(&mut m.ebpf, &nccl_config(), SLOTS, &[]).expect("the agent writes CONFIG");
    assert_ne!(seed, 0, "write_config picked seed 0 (chance 2^-32): the test proves nothing with it, run it again");
    {
        let cfg: Array<&MapData, Config> = Array::try_from(m.ebpf.map(maps::CONFIG).unwrap()).unwrap();
        let c = cfg.get(&0, 0).unwrap();
        assert_eq!((c.hash_seed, c.flow_slot_mask), (seed, SLOTS - 1));
    }

    // Several flows, three packets each.
    let flows: Vec<(Vec<u8>, FlowKey)> = (0..8).map(udp_flow).collect();
    for (frame, _) in &flows {
        m.run_n(frame, &SkbContext::ingress(), 3);
    }
    let before = m.slots();
    let mut at = Vec::new();
    for (i, (frame, key)) in flows.iter().enumerate() {
        let live = live_slots_of(&before, key);
        assert_eq!(live.len(), 1, "flow {i} is live in exactly one slot: {live:?}");
        let (slot, s) = live[0];
        // Placed with the seed in CONFIG: fingerprint and probe window of flow_hash(key, seed).
        let h = flow_hash(key, seed);
        assert_eq!(s.state, slot_state::with_fp(slot_state::LIVE, h), "flow {i}: fingerprint of the seeded hash");
        let dist = slot.wrapping_sub(h as u32) & (SLOTS - 1);
        assert!(dist < FLOW_PROBES, "flow {i} in slot {slot}, {dist} past its seeded home");
        assert_eq!((s.stats.packets, s.stats.bytes), (3, 3 * l3(frame)), "flow {i}");
        at.push(slot);
    }

    // The agent's own eviction, on its own mapping of the kernel's array, with the seed
    // write_config returned (what `Attachment::hash_seed` hands the collector).
    let Some(aya::maps::Map::Array(data)) = m.ebpf.map(maps::FLOWS) else { panic!("FLOWS is an array map") };
    let table = dataplane_user::SlotTable::map(data.fd().as_fd(), SLOTS, seed).expect("mmap FLOWS read-write");
    const VICTIM: usize = 3;
    let (victim_frame, victim) = flows[VICTIM].clone();
    assert!(table.evict(&victim), "the agent's evict found the flow (with a seed other than the program's it cannot)");
    assert!(!table.evict(&victim), "gone after one eviction");

    let after = m.slots();
    let freed = after[at[VICTIM] as usize].state;
    assert!(freed == slot_state::EMPTY || freed == slot_state::TOMBSTONE, "the evicted flow's slot {} is free: state {freed:#x}", at[VICTIM]);
    assert!(live_slots_of(&after, &victim).is_empty(), "the evicted flow is live nowhere");
    for (i, slot) in at.iter().enumerate().filter(|&(i, _)| i != VICTIM) {
        assert_eq!(after[*slot as usize], before[*slot as usize], "flow {i}'s slot {slot} is untouched");
    }
    assert_eq!(after.iter().filter(|s| s.state & slot_state::TAG_MASK == slot_state::LIVE).count(), flows.len() - 1);

    // The evicted flow's next packet claims a slot again, counters from zero; the others count on.
    m.run(&victim_frame);
    m.run(&flows[0].0);
    let last = m.slots();
    let live = live_slots_of(&last, &victim);
    assert_eq!(live.len(), 1, "the evicted flow claimed one slot again: {live:?}");
    let s = live[0].1.stats;
    assert_eq!((s.packets, s.bytes), (1, l3(&victim_frame)), "re-created with zeroed counters");
    let kept = live_slots_of(&last, &flows[0].1);
    assert_eq!(kept.iter().map(|(i, s)| (*i, s.stats.packets)).collect::<Vec<_>>(), vec![(at[0], 4)], "flow 0 counts on in its slot");
    assert_stats(&m, &[(stats::MATCHED, 3 * flows.len() as u64 + 2), (stats::MAP_FULL, 0), (stats::CONTENDED, 0)]);
    drop(table);
}
