//! The committed seed corpora (`fuzz/corpus/<target>/`), built from the frames, headers, files
//! and bodies the unit tests use, in each target's input format (see the target's module docs).
//!
//! `cargo test --test seeds` (in `fuzz/`) checks that the committed files are exactly these;
//! `RINGSIDE_WRITE_SEEDS=1 cargo test --test seeds` (re)writes them. A seed is a starting point
//! the fuzzer mutates: one per shape the parser handles, kept small (a few KiB per target).
use std::{collections::BTreeMap, net::Ipv6Addr, path::Path, time::Duration};

use dataplane_common::{wire, ROCEV2_UDP_PORT};
use ipu_firmware::codec::{self, wire_id, Bf16};
use ipu_firmware::managed::{Header, Kind, ManagedReport};
use ipu_firmware::plan::{encode_vote, ControlHeader, OpKind, PlanProposal, PlanVoter};
use ipu_firmware::transport::InFrame;
use ipu_firmware::wire::{FrameHeader, FrameKind, Hello, HEADER_LEN};
use ipu_firmware::{Algorithm, CodecKind, CollectiveError, Communicator, CommunicatorConfig, Compression, Dtype, Plan, Transport};
use ringside_test_support::frames::{self, VlanTag, MAC_A, MAC_B};

type Seeds = BTreeMap<(&'static str, &'static str), Vec<u8>>;

const A: [u8; 4] = [10, 77, 0, 1];
const B: [u8; 4] = [10, 77, 0, 3];

/// A RoCEv2 frame as the testbed generator lays out its UDP payload (`frame.rs`'s tests).
fn roce_frame(kind: testbed::roce::PacketKind, opcode: u8, psn: u32, tags: &[VlanTag]) -> Vec<u8> {
    let spec = testbed::RoceSpec { to: "10.77.0.3:4791".parse().unwrap(), dest_qp: 0x12_3456, payload_len: 64, ..Default::default() };
    let p = testbed::roce::PlannedPacket { kind, opcode, psn, ce: false, ack_req: false };
    let mut payload = Vec::new();
    testbed::roce::encode(&spec, &p, &mut payload);
    let udp = frames::udp(49152, ROCEV2_UDP_PORT, &payload);
    let ip = frames::ipv4(A, B, wire::IPPROTO_UDP, &frames::Ipv4Opts { tos: (26 << 2) | wire::ECN_CE, ..Default::default() }, &udp);
    frames::ethernet(MAC_B, MAC_A, tags, wire::ETH_P_IP, &ip)
}

/// `mirror_frame`'s records: `len (u16 LE) | extra (u8) | bytes`.
fn records(frames: &[(&[u8], u8)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (f, extra) in frames {
        out.extend_from_slice(&(f.len() as u16).to_le_bytes());
        out.push(*extra);
        out.extend_from_slice(f);
    }
    out
}

fn mirror_frame(s: &mut Seeds) {
    use testbed::roce::PacketKind;
    let data = roce_frame(PacketKind::Data, wire::bth_opcode::RC_RDMA_WRITE_ONLY, 0xab_cdef, &[]);
    let nak = roce_frame(PacketKind::Nak, wire::bth_opcode::RC_ACK, 7, &[VlanTag::s_tag(5), VlanTag::c_tag(6)]);
    let cnp = roce_frame(PacketKind::Cnp, wire::bth_opcode::CNP, 0, &[VlanTag::c_tag(9)]);
    let seg = frames::tcp(40000, 29500, 0xdead_beef, 0x0102_0304, wire::TCP_ACK | wire::TCP_PSH, &[7u8; 100]);
    let v6 = frames::ipv6(Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1).octets(), Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2).octets(), wire::IPPROTO_TCP, 0b01, &seg);
    let tcp6 = frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IPV6, &v6);
    // A pure ACK with Linux's timestamp and a D-SACK block below the ACK number.
    let dsack = frames::tcp4_with_options(A, B, 29500, 40000, 1, 5000, wire::TCP_ACK, &frames::linux_ack_options(Some((1, 2)), &[(4000, 4500)]), &[]);
    let ext = frames::ipv6(Ipv6Addr::LOCALHOST.octets(), Ipv6Addr::LOCALHOST.octets(), 0, 0, &frames::ipv6_options_header(wire::IPPROTO_TCP));
    let arp = frames::ethernet(MAC_B, MAC_A, &[], 0x0806, &[0; 28]);
    let udp = frames::udp4(A, B, 5000, 29500, &[1; 32]);
    s.insert(("mirror_frame", "rocev2-write-only"), records(&[(&data, 0)]));
    s.insert(("mirror_frame", "rocev2-nak-qinq"), records(&[(&nak, 0)]));
    s.insert(("mirror_frame", "rocev2-cnp-vlan"), records(&[(&cnp, 0)]));
    s.insert(("mirror_frame", "tcp-ipv6"), records(&[(&tcp6, 0)]));
    s.insert(("mirror_frame", "tcp-dsack"), records(&[(&dsack, 0)]));
    s.insert(("mirror_frame", "unsupported-ext-arp"), records(&[(&frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IPV6, &ext), 0), (&arp, 1)]));
    // One flow's burst, a frame cut by a snap length, then a frame 6 ms later (a new burst).
    s.insert(("mirror_frame", "burst-snap-udp"), records(&[(&data, 10), (&data[..40], 9), (&data, 250), (&udp, 1)]));
}

/// `ipu_frame`'s input: flags (0: the checksum as written) and the frame.
fn ipu_frame_of(kind: FrameKind, codec: u8, elem_count: u32, payload: &[u8]) -> Vec<u8> {
    let h = FrameHeader { kind, codec, channel: 0, op: 3, seq: 7, payload_len: payload.len() as u32, elem_offset: 64, elem_count };
    let mut out = vec![0u8];
    out.extend_from_slice(&h.to_bytes());
    out.extend_from_slice(payload);
    out
}

/// A control header as the engine's tests write it.
fn control() -> ControlHeader {
    ControlHeader {
        training_step: 42,
        op_kind: OpKind::Allreduce,
        dtype: Dtype::Bf16,
        elems: 1 << 33,
        root: 3,
        plan: Plan {
            step_from: 40,
            algorithm: Algorithm::Rhd,
            chunk_bytes: 65536,
            channels: 4,
            compression: Compression { codec: CodecKind::TopK { ratio: 0.25 }, error_feedback: true },
        },
        plan_held_until: 45,
    }
}

/// A 16-element chunk with the values' signs, magnitudes and a zero the codecs treat apart.
fn chunk() -> Vec<f32> {
    (0..16).map(|i| ((i as f32 * 0.618).sin() * 3.0) * (1.0 + (i % 7) as f32)).collect()
}

fn encoded(kind: CodecKind, src: &[f32]) -> Vec<u8> {
    let mut p = Vec::new();
    codec::for_kind(kind).encode(src, &mut p);
    p
}

fn ipu_frame(s: &mut Seeds) {
    s.insert(("ipu_frame", "hello"), [&[0u8][..], &Hello { world: 5, rank: 3, channels: 2 }.frame(1)].concat());
    s.insert(("ipu_frame", "control"), ipu_frame_of(FrameKind::Control, 0, 0, &control().encode()));
    let proposal = PlanProposal { plan: control().plan, version: 9, severity: 4 };
    s.insert(("ipu_frame", "vote"), ipu_frame_of(FrameKind::Control, 0, 0, &encode_vote(&control(), Some(&proposal))));
    for (name, kind) in [("data-int8", CodecKind::Int8), ("data-topk", CodecKind::TopK { ratio: 0.25 }), ("data-fp16", CodecKind::Fp16)] {
        s.insert(("ipu_frame", name), ipu_frame_of(FrameKind::Data, wire_id(kind), 16, &encoded(kind, &chunk())));
    }
    s.insert(("ipu_frame", "goodbye"), ipu_frame_of(FrameKind::Goodbye, 0, 0, &[]));
}

/// `ipu_codec`'s input: `codec | mode | ratio | elems (u16 LE) | rest`.
fn ipu_codec(s: &mut Seeds) {
    let kinds = [("none", CodecKind::None), ("fp16", CodecKind::Fp16), ("bf16", CodecKind::Bf16), ("int8", CodecKind::Int8), ("topk", CodecKind::TopK { ratio: 0.25 })];
    let src = chunk();
    for (name, kind) in kinds {
        let head = |mode: u8| vec![wire_id(kind), mode, 63, 16, 0];
        s.insert(("ipu_codec", Box::leak(format!("decode-{name}").into_boxed_str())), [head(1), encoded(kind, &src)].concat());
        let raw: Vec<u8> = src.iter().flat_map(|x| x.to_le_bytes()).collect();
        s.insert(("ipu_codec", Box::leak(format!("encode-{name}").into_boxed_str())), [head(0x80), raw].concat());
    }
}

/// `managed_link`'s input: flags and the tenant's stream.
fn managed_link(s: &mut Seeds) {
    let request = |op: u8, dtype: u8, arg: u32, elems: u64, payload_len: u64| {
        Header { kind: Kind::Request, op, dtype, arg, elems, step: 3, payload_len }.encode().to_vec()
    };
    let f32s: Vec<u8> = [1.0f32, -2.0, 3.5, 0.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    let bf16s: Vec<u8> = [0x3f80u16, 0xc000, 0x4060, 0].iter().flat_map(|x| x.to_le_bytes()).collect();
    s.insert(("managed_link", "allreduce-f32-bf16"), [&[0u8][..], &request(1, 0, 0, 4, 16), &f32s, &request(1, 1, 0, 4, 8), &bf16s].concat());
    s.insert(("managed_link", "broadcast-allgather"), [&[2u8][..], &request(2, 0, 1, 4, 16), &f32s, &request(3, 0, 0, 4, 16), &f32s].concat());
    s.insert(("managed_link", "broadcast-root-out-of-range"), [&[0u8][..], &request(2, 0, 4, 1, 4), &f32s[..4]].concat());
    s.insert(("managed_link", "stalled-payload"), [&[1u8][..], &request(1, 0, 0, 4, 16), &f32s[..6]].concat());
}

/// The example config with its commented-out settings switched on and its comments left out.
fn example_config() -> String {
    include_str!("../../dataplane-user/ringside.example.toml")
        .lines()
        .map(|l| l.strip_prefix("# ").filter(|r| r.starts_with('[') || r.split_once(" = ").is_some_and(|(k, _)| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))).unwrap_or(l))
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .map(|l| format!("{l}\n"))
        .collect()
}

fn agent_config(s: &mut Seeds) {
    s.insert(("agent_config", "example"), example_config().into_bytes());
    s.insert(("agent_config", "api-typo"), b"[api]\noperator_token = \"x\"\n".to_vec());
    s.insert(("agent_config", "ring-not-pow2"), b"listen = \"127.0.0.1:1\"\nkernel_event_ring_kib = 1000\n".to_vec());
    s.insert(("agent_config", "match-job"), b"[match]\ntcp_ports = [\"29500-29600\", \"12345\"]\nprefixes = [\"10.77.0.0/16\", \"fd00::/64\"]\n\n[[job]]\nname = \"train\"\nmembers = [\"10.77.0.9/32\", \"fd00::1\"]\n".to_vec());
}

fn api_bodies(s: &mut Seeds) {
    let body = |which: u8, b: &str| [&[which][..], b.as_bytes()].concat();
    s.insert(("api_bodies", "registration"), body(0, r#"{"name":"alpha-train","members":["10.77.0.0/24"],"tcp_ports":["29500"]}"#));
    s.insert(("api_bodies", "registration-constraints"), body(0, r#"{"name":"bravo","members":["10.88.0.1","fd00::/64"],"udp_ports":["4791"],"gradient_bytes":1048576,"constraints":{"algorithms":["ring","rhd"],"codecs":["none","topk"],"min_topk_ratio":0.05,"max_channels":2,"error_feedback":false,"step_time_target_ms":250.0,"transport_tuning":true}}"#));
    s.insert(("api_bodies", "plan-report"), body(1, r#"{"algorithm":"tree","chunk_bytes":262144,"channels":2,"compression":"topk:0.1","error_feedback":true,"step":120,"step_time_ms":84.5}"#));
    s.insert(("api_bodies", "hint"), body(2, r#"{"job":"j-1","version":3,"step_from":0,"algorithm":"rhd","chunk_bytes":1048576,"channels":1,"compression":"int8","error_feedback":true,"reasons":["path to peer 10.77.0.3 lossy"],"confidence":0.8,"expires_at":1767225600000,"tcp_rto_min_ms":20}"#));
    s.insert(("api_bodies", "name-codec"), body(3, "topk:0.1"));
    s.insert(("api_bodies", "name-ports"), body(3, "29500-29510"));
    s.insert(("api_bodies", "limit"), body(4, "20"));
    let report = ManagedReport { op: 7, plan: control().plan, hint_rank: Some(2), bytes_sent: 1 << 20, service_ms: 3.25, hint_version: Some(9) };
    s.insert(("api_bodies", "managed-report"), body(5, &serde_json::to_string(&report).unwrap()));
}

/// One rank of an in-memory 2-rank mesh for the `ipu_engine` seeds: frames go to the peer
/// through channels, and each is also written to the peer's log in the target's input format
/// (`channel | header | payload`), so a log is what that rank received from its peer.
struct Pair {
    rank: usize,
    to_peer: Vec<std::sync::mpsc::Sender<InFrame>>,
    from_peer: Vec<std::sync::mpsc::Receiver<InFrame>>,
    peer_log: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    seq: Vec<u32>,
    sent: u64,
}

impl Transport for Pair {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        2
    }
    fn channels(&self) -> usize {
        self.to_peer.len()
    }
    fn send(&mut self, _peer: usize, channel: usize, mut header: FrameHeader, mut frame: Vec<u8>) -> ipu_firmware::error::Result<()> {
        header.channel = channel as u8;
        header.seq = self.seq[channel];
        header.payload_len = (frame.len() - HEADER_LEN) as u32;
        self.seq[channel] += 1;
        header.write(&mut frame);
        self.sent += frame.len() as u64;
        let mut log = self.peer_log.lock().unwrap();
        log.push(channel as u8);
        log.extend_from_slice(&frame);
        drop(log);
        self.to_peer[channel].send(InFrame { header, frame }).map_err(|_| CollectiveError::PeerDisconnected { peer: 1 - self.rank, channel })
    }
    fn recv(&mut self, peer: usize, channel: usize, timeout: Duration, op: u64) -> ipu_firmware::error::Result<InFrame> {
        self.from_peer[channel].recv_timeout(timeout).map_err(|_| CollectiveError::Timeout { peer, channel, op, waited_ms: timeout.as_millis() as u64 })
    }
    fn bytes_sent(&self) -> u64 {
        self.sent
    }
    fn close(&mut self) {}
    fn abort(&mut self) {}
}

/// Rank 1's vote in the seeds with plan votes: tree with fp16.
struct VoteFp16;

impl PlanVoter for VoteFp16 {
    fn propose(&mut self, _step: u64) -> Option<PlanProposal> {
        let plan = Plan { algorithm: Algorithm::Tree, compression: Compression { codec: CodecKind::Fp16, error_feedback: true }, ..Plan::default() };
        Some(PlanProposal { plan, version: 1, severity: 2 })
    }
}

/// Runs `ipu_engine`'s two collectives for `head` on both ranks of an in-memory mesh and returns
/// each rank's input: `head` with the rank's flag, then the frames it received.
fn engine_run(head: [u8; 5]) -> [Vec<u8>; 2] {
    use std::sync::{mpsc::channel, Arc, Mutex};
    let channels = if head[0] & 2 != 0 { 2 } else { 1 };
    let logs = [Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new()))];
    let (mut tx, mut rx): (Vec<Vec<_>>, Vec<Vec<_>>) = (vec![Vec::new(), Vec::new()], vec![Vec::new(), Vec::new()]);
    for to in 0..2 {
        for _ in 0..channels {
            let (t, r) = channel();
            tx[1 - to].push(t);
            rx[to].push(r);
        }
    }
    let mut threads = Vec::new();
    for rank in (0..2).rev() {
        let t = Pair { rank, to_peer: tx.pop().unwrap(), from_peer: rx.pop().unwrap(), peer_log: logs[1 - rank].clone(), seq: vec![0; channels], sent: 0 };
        threads.push(std::thread::spawn(move || {
            // The same plan and call as the target derives from `head`.
            let [flags, call, elems, plan, chunk] = head;
            let initial = Plan {
                step_from: 0,
                algorithm: Algorithm::ALL[usize::from(plan & 0x7f) % 3],
                chunk_bytes: 4 << (chunk % 16),
                channels: 1 + (chunk >> 7) % channels as u8,
                compression: Compression { codec: codec::from_wire_id(plan / 3 % 5, 0.25).unwrap(), error_feedback: plan & 0x80 != 0 },
            };
            let config = CommunicatorConfig { initial_plan: if rank == 0 { initial } else { Plan::default() }, timeout: Duration::from_secs(10) };
            let mut comm = Communicator::new(t, config).unwrap();
            if flags & 4 != 0 {
                comm.set_plan_voter(Box::new(VoteFp16));
            }
            let n = usize::from(elems) + 1;
            for step in 0..2 {
                comm.begin_step(step);
                let mut buf: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
                let r = match call % 5 {
                    0 => comm.allreduce_f32(&mut buf),
                    1 => {
                        let mut b: Vec<Bf16> = buf.iter().map(|&x| Bf16::from_f32(x)).collect();
                        comm.allreduce_bf16(&mut b)
                    }
                    2 => comm.broadcast_f32(&mut buf, usize::from(call / 5 % 2)),
                    3 => comm.allgather_f32(&mut buf),
                    _ => comm.reduce_scatter_f32(&mut buf).map(|(_, r)| r),
                };
                r.unwrap_or_else(|e| panic!("rank {rank} step {step} of {head:?}: {e}"));
            }
        }));
    }
    threads.into_iter().for_each(|t| t.join().unwrap());
    let input = |rank: usize| [&[head[0] & !1 | rank as u8][..], &head[1..], &logs[rank].lock().unwrap()].concat();
    [input(0), input(1)]
}

fn ipu_engine(s: &mut Seeds) {
    // flags (bit 1: two channels, bit 2: votes), call, elems - 1, algorithm + 3 * codec (+ 0x80
    // error feedback), chunk (bytes 4 << chunk % 16; bit 7: two channels used).
    let runs: [(&'static str, [u8; 5]); 5] = [
        ("allreduce-ring-none", [0, 0, 15, 0, 2]),
        ("allreduce-bf16-tree-fp16-ef", [2, 1, 11, 1 + 3 + 0x80, 0x80 | 3]),
        ("broadcast-root1-int8", [0, 7, 15, 3 * 3, 2]),
        ("allgather-topk", [2, 3, 15, 4 * 3, 0x80 | 2]),
        ("reduce-scatter-votes-rhd-bf16", [4, 4, 15, 2 + 2 * 3, 2]),
    ];
    for (name, head) in runs {
        let [r0, r1] = engine_run(head);
        s.insert(("ipu_engine", Box::leak(format!("{name}-rank0").into_boxed_str())), r0);
        s.insert(("ipu_engine", Box::leak(format!("{name}-rank1").into_boxed_str())), r1);
    }
}

#[test]
fn committed_seeds_are_the_generated_ones() {
    let mut seeds = Seeds::new();
    mirror_frame(&mut seeds);
    ipu_frame(&mut seeds);
    ipu_codec(&mut seeds);
    managed_link(&mut seeds);
    agent_config(&mut seeds);
    api_bodies(&mut seeds);
    ipu_engine(&mut seeds);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let write = std::env::var_os("RINGSIDE_WRITE_SEEDS").is_some();
    let mut stale = Vec::new();
    for ((target, name), bytes) in &seeds {
        let path = root.join(target).join(name);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, bytes).unwrap();
        } else if std::fs::read(&path).ok().as_ref() != Some(bytes) {
            stale.push(path.display().to_string());
        }
    }
    assert!(stale.is_empty(), "seeds differ from the generated ones (RINGSIDE_WRITE_SEEDS=1 rewrites them): {stale:?}");
}
