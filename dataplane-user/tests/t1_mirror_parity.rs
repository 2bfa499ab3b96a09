//! T1: the mirror ingest's parser and accounting (`dataplane_user::frame`, `mirror::MirrorTable`)
//! against the real classifier, frame by frame. Random and mutated frames (the T1 fuzzer's seeds
//! and mutations) run through `flowmon` with `BPF_PROG_TEST_RUN` and through a `MirrorTable` with
//! the same `CONFIG` and prefixes; each frame must get the same outcome on both (the kernel's from
//! the `STATS` delta: malformed, unsupported, parsed; matched or not), and after every batch the
//! two flow tables must hold the same keys with the same counters and tracking words (bytes,
//! packets, CE marks, TCP retransmissions / ACKs / flags, RoCEv2 PSN gaps, out-of-order, NAKs,
//! CNPs, the PSN expectation). Timestamps and burst boundaries are left out: the kernel's clock
//! is not the test's.
//!
//! Needs root (CAP_BPF + CAP_NET_ADMIN) and the object (`cargo xtask build`); fails otherwise.
//! `RINGSIDE_PARITY_FRAMES=N` and `RINGSIDE_PARITY_SEED=N` run more frames or another sequence.
use std::collections::HashMap as StdHashMap;

use aya::{
    maps::{lpm_trie::Key, Array, LpmTrie, MapData, PerCpuArray},
    programs::SchedClassifier,
    Ebpf, EbpfLoader,
};
use dataplane_common::{
    ipv4_mapped, maps, programs, stats,
    wire::{self, bth_opcode},
    slot_state, Config, FlowKey, FlowSlot, FlowStats, PortRange, PrefixKey, PrefixValue, ROCEV2_UDP_PORT,
};
use dataplane_user::mirror::{FlowMatch, MirrorSettings, MirrorTable};
use ringside_test_support::{
    frames::{self, Ipv4Opts, VlanTag, MAC_A, MAC_B},
    testrun::{self, SkbContext, LOOPBACK_IFINDEX},
};

const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];
const NCCL_PORT: u16 = 29500;

fn load(config: Config, prefixes: &[PrefixKey]) -> Ebpf {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("T1 tests run BPF_PROG_TEST_RUN, which needs root (CAP_BPF + CAP_NET_ADMIN): run them as root, e.g. with `cargo xtask test`");
    }
    let object = dataplane_user::object::flowmon_object()
        .unwrap_or_else(|e| panic!("{e} (for T1: set RINGSIDE_EBPF_OBJECT to the built flowmon object)"));
    let mut ebpf = EbpfLoader::new().load(object).expect("the flowmon object loads");
    let prog: &mut SchedClassifier = ebpf.program_mut(programs::FLOWMON).unwrap().try_into().unwrap();
    prog.load().unwrap_or_else(|e| panic!("verifier rejected flowmon: {e:?}"));
    Array::<&mut MapData, Config>::try_from(ebpf.map_mut(maps::CONFIG).unwrap()).unwrap().set(0, config, 0).unwrap();
    let mut trie: LpmTrie<&mut MapData, [u8; 16], PrefixValue> = LpmTrie::try_from(ebpf.map_mut(maps::MATCH_PREFIXES).unwrap()).unwrap();
    for (i, p) in prefixes.iter().enumerate() {
        trie.insert(&Key::new(p.prefix_len, p.addr), i as PrefixValue + 1, 0).unwrap();
    }
    // STATS is per CPU and a test run executes on the caller's CPU.
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() }.max(0) as usize;
    testrun::pin_current_thread(cpu).expect("pin the test thread to its CPU");
    ebpf
}

fn kernel_stats(ebpf: &Ebpf) -> [u64; stats::COUNT as usize] {
    let arr: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(ebpf.map(maps::STATS).unwrap()).unwrap();
    let mut out = [0u64; stats::COUNT as usize];
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = arr.get(&(i as u32), 0).unwrap().iter().sum();
    }
    out
}

/// Frames `BPF_PROG_TEST_RUN` refuses before the program runs (see t1_flowmon's `kernel_refuses`).
fn kernel_refuses(frame: &[u8]) -> bool {
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    (ethertype == wire::ETH_P_IP && frame.len() < wire::ETH_HLEN + wire::IPV4_MIN_HLEN)
        || (ethertype == wire::ETH_P_IPV6 && frame.len() < wire::ETH_HLEN + wire::IPV6_HLEN)
}

fn v6(last: u8) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[0] = 0xfd;
    a[15] = last;
    a
}

/// Every shape the parser handles, matched and not (t1_flowmon's fuzz seeds, plus a RoCE stream
/// of one QP so PSN tracking has a sequence to compare).
fn seeds() -> Vec<Vec<u8>> {
    let opts = Ipv4Opts { options: vec![0x01, 0x01, 0x01, 0x00, 0x44, 0x04, 0x05, 0x00], ..Ipv4Opts::default() };
    let nak = frames::rocev2_payload(&frames::bth(bth_opcode::RC_ACK, 3, 9, false), &frames::aeth(0x60, 1), &[]);
    let mut s = vec![
        frames::tcp4(A, B, 40000, NCCL_PORT, 1, 1, wire::TCP_ACK, 0, &[0; 8]),
        frames::ethernet(MAC_B, MAC_A, &[VlanTag::s_tag(2), VlanTag::c_tag(3)], wire::ETH_P_IP, &frames::ipv4(A, B, 17, &opts, &frames::udp(1, ROCEV2_UDP_PORT, &nak))),
        frames::ethernet(MAC_B, MAC_A, &[VlanTag::c_tag(3)], wire::ETH_P_IPV6, &frames::ipv6(v6(1), v6(2), 6, 0, &frames::tcp(1, NCCL_PORT, 1, 1, wire::TCP_ACK, &[0; 4]))),
        frames::udp4(A, B, 1, NCCL_PORT, &[0; 3]),
        frames::ethernet(MAC_B, MAC_A, &[VlanTag::c_tag(3)], wire::ETH_P_IP, &frames::ipv4(A, B, 17, &opts, &frames::udp(1, NCCL_PORT, &[0; 3]))),
        frames::rocev2_4(A, B, 50001, bth_opcode::CNP, 0x12, 0, &[], &[0; 16]),
        frames::rocev2_4(A, B, 50002, bth_opcode::RC_ACK, 0x13, 9, &frames::aeth(0x60, 1), &[]),
        frames::tcp4(A, B, 40000, 22, 1, 1, wire::TCP_ACK | wire::TCP_PSH, 3, &[0; 64]),
        // Pure ACKs with D-SACKs, Linux's option layout with and without timestamps (mutations
        // move the block edges above and below the ACK and shift the option bytes).
        frames::tcp4_with_options(B, A, NCCL_PORT, 40000, 1, 1000, wire::TCP_ACK, &frames::linux_ack_options(Some((5, 6)), &[(900, 1000)]), &[]),
        frames::tcp4_with_options(B, A, NCCL_PORT, 40000, 1, 1000, wire::TCP_ACK, &frames::linux_ack_options(None, &[(900, 1000), (1100, 1200)]), &[]),
    ];
    let frag = Ipv4Opts { flags_frag: 0x2000 | 3, ..Ipv4Opts::default() };
    s.push(frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IP, &frames::ipv4(A, B, 6, &frag, &frames::tcp(1, NCCL_PORT, 1, 1, wire::TCP_ACK, &[0; 8]))));
    s.push(frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IPV6, &frames::ipv6(v6(1), v6(2), 0, 0, &{
        let mut p = frames::ipv6_options_header(wire::IPPROTO_UDP);
        p.extend(frames::udp(1, NCCL_PORT, &[0; 8]));
        p
    })));
    s
}

/// t1_flowmon's mutations: bit flips, boundary bytes and 16-bit words, truncation, extension,
/// inserted VLAN tags, random runs, small increments.
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
            let tpid = if r().is_multiple_of(2) { wire::ETH_P_8021Q } else { 0x88a8 };
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

/// The fields both paths must agree on (timestamps and burst boundaries left out).
fn comparable(s: &FlowStats) -> FlowStats {
    FlowStats { last_seen_ns: 0, burst_start_ns: 0, first_seen_ns: 0, burst_start_packets: 0, burst_start_bytes: 0, ..*s }
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Malformed,
    Unsupported,
    Unreadable,
    Parsed { matched: bool },
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn mirror_parser_and_accounting_match_the_classifier_frame_by_frame() {
    let total: u64 = std::env::var("RINGSIDE_PARITY_FRAMES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let seed: u64 = std::env::var("RINGSIDE_PARITY_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x0011_2233_4455);
    eprintln!("comparing {total} frames, RINGSIDE_PARITY_SEED={seed}");
    let mut port_ranges = Config::default().port_ranges;
    port_ranges[0] = PortRange { lo: NCCL_PORT, hi: NCCL_PORT + 10, protocol: 0, _pad: [0; 3] };
    let config = Config { n_port_ranges: 1, n_prefixes: 1, port_ranges, ..Config::default() };
    let prefixes = vec![PrefixKey { prefix_len: 96 + 8, addr: ipv4_mapped([10, 0, 0, 0]) }];
    let mut ebpf = load(config, &prefixes);
    let seeds = seeds();
    let mut x = seed | 1;
    let mut r = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // Ingress on loopback for the kernel; the mirror's flows get the same ifindex and (with no
    // local prefix) the same direction, so the two tables' keys are comparable as they are.
    let settings = MirrorSettings::new("lo".into());
    let mut outcomes: StdHashMap<String, u64> = StdHashMap::new();
    let (mut done, mut flows_compared, mut psn_words) = (0u64, 0usize, 0usize);
    const BATCH: u64 = 4_000;
    while done < total {
        let mut mirror = MirrorTable::new(LOOPBACK_IFINDEX, &settings, FlowMatch::new(config, prefixes.clone()));
        let n = BATCH.min(total - done);
        let mut now = 1_000_000_000u64;
        for i in 0..n {
            // A third of the frames are the RoCE write stream, in order with holes, so the PSN
            // expectation and gap counters have something to agree on.
            let mut f = match r() % 10 {
                0 => (0..wire::ETH_HLEN + (r() % 200) as usize).map(|_| r() as u8).collect(),
                1..=3 => frames::rocev2_4(A, B, 50000, bth_opcode::RC_RDMA_WRITE_MIDDLE, 0x11, (i as u32) * 2 / 3, &[], &[0xab; 64]),
                _ => seeds[(r() % seeds.len() as u64) as usize].clone(),
            };
            if r() % 3 != 0 {
                for _ in 0..1 + r() % 4 {
                    mutate(&mut f, &mut r);
                }
            }
            if f.len() < wire::ETH_HLEN || kernel_refuses(&f) {
                continue;
            }
            let before = kernel_stats(&ebpf);
            let out = testrun::run(ebpf.program(programs::FLOWMON).unwrap().try_into().unwrap(), &f, Some(&SkbContext::ingress()), 1).expect("BPF_PROG_TEST_RUN");
            assert_eq!(out.data_out, f, "the monitor changed the packet");
            let after = kernel_stats(&ebpf);
            let d = |i: u32| after[i as usize] - before[i as usize];
            let kernel = if d(stats::MALFORMED) == 1 {
                Outcome::Malformed
            } else if d(stats::UNSUPPORTED) == 1 {
                Outcome::Unsupported
            } else if d(stats::UNREADABLE) == 1 {
                Outcome::Unreadable
            } else {
                assert_eq!(d(stats::PARSED), 1, "one outcome per frame: {:?} vs {:?}", before, after);
                Outcome::Parsed { matched: d(stats::MATCHED) == 1 }
            };
            let c0 = mirror.counters;
            now += 1_000;
            mirror.ingest(&f, f.len(), now);
            let c1 = mirror.counters;
            let user = if c1.malformed > c0.malformed {
                Outcome::Malformed
            } else if c1.unsupported > c0.unsupported {
                Outcome::Unsupported
            } else if c1.unreadable > c0.unreadable {
                Outcome::Unreadable
            } else {
                Outcome::Parsed { matched: c1.matched > c0.matched }
            };
            assert_eq!(user, kernel, "frame {} of batch ending at {} (RINGSIDE_PARITY_SEED={seed}): {:02x?}", i, done + n, f);
            *outcomes.entry(format!("{kernel:?}")).or_default() += 1;
        }
        done += n;
        // The tables: same keys, same counters and tracking words.
        // FLOWS is an open-addressing array of slots (layout 3): its live slots are the flows.
        let (kernel_flows, used): (StdHashMap<FlowKey, FlowStats>, Vec<u32>) = {
            // One mmap, not a syscall per slot (slow in the T1 kernel matrix's TCG guest).
            let Some(aya::maps::Map::Array(data)) = ebpf.map(maps::FLOWS) else { panic!("FLOWS is an array map") };
            let slots: Vec<FlowSlot> = testrun::flow_slots(data).expect("mmap FLOWS");
            let live = slots.iter().filter(|s| s.state & slot_state::TAG_MASK == slot_state::LIVE).map(|s| (s.key, s.stats)).collect();
            let used = slots.iter().enumerate().filter(|(_, s)| s.state != slot_state::EMPTY).map(|(i, _)| i as u32).collect();
            (live, used)
        };
        let user_flows: StdHashMap<FlowKey, FlowStats> = mirror.flows().collect();
        assert_eq!(kernel_flows.len(), user_flows.len(), "flows in the batch ending at {done} (RINGSIDE_PARITY_SEED={seed})");
        for (k, ks) in &kernel_flows {
            let us = user_flows.get(k).unwrap_or_else(|| panic!("kernel flow {k:?} not in the mirror's table"));
            assert_eq!(comparable(us), comparable(ks), "flow {k:?} (RINGSIDE_PARITY_SEED={seed})");
            psn_words += usize::from(ks.roce_psn != 0);
        }
        flows_compared += kernel_flows.len();
        let mut flows: Array<&mut MapData, FlowSlot> = Array::try_from(ebpf.map_mut(maps::FLOWS).unwrap()).unwrap();
        for i in used {
            flows.set(i, FlowSlot::default(), 0).unwrap();
        }
    }
    eprintln!("outcomes: {outcomes:?}; {flows_compared} flows compared, {psn_words} with a PSN expectation");
    for what in ["Malformed", "Unsupported", "Parsed { matched: true }", "Parsed { matched: false }"] {
        assert!(outcomes.get(what).copied().unwrap_or(0) > total / 100, "too few {what} frames: {outcomes:?}");
    }
    assert!(psn_words > 0, "no RoCE flow with a PSN expectation was compared");
}
