//! User-space cost of the mirror ingest per frame: `MirrorTable::ingest` (parse with the
//! classifier's rules, match, account) on the frames of the T2 RoCEv2 scenario (`t2_mirror`: data
//! with PSN gaps, CE marks, CNPs and NAKs, 1024-byte payloads, one flow) and on 64 flows of the
//! same traffic, repeated. The socket and the ring are not measured: this is the CPU time the
//! ingest thread spends per frame once the kernel has put it in the ring. No root needed.
//!
//! Run: `cargo run --release -p dataplane-user --example bench_mirror -- [FRAMES]` (default 5 000 000).
use std::time::Instant;

use dataplane_common::Config;
use dataplane_user::mirror::{FlowMatch, MirrorSettings, MirrorTable};
use testbed::roce::{encode, plan};

fn frames(flows: u16) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for f in 0..flows {
        let spec = testbed::RoceSpec {
            to: "10.77.0.2:4791".parse().unwrap(),
            src_port: 49152 + f,
            packets: 3000,
            payload_len: 1024,
            skip_psns: vec![100, 101, 102, 1500, 2999],
            ce_marks: 9,
            cnps: 7,
            naks: 3,
            ..Default::default()
        };
        for p in plan(&spec).unwrap() {
            let mut payload = Vec::new();
            encode(&spec, &p, &mut payload);
            // The mirror keeps the first 256 bytes of each frame.
            let mut frame = ringside_test_support::frames::udp4([10, 77, 0, 1], [10, 77, 0, 2], spec.src_port, wire_port(), &payload);
            let wire_len = frame.len();
            frame.truncate(256);
            frame.extend_from_slice(&(wire_len as u32).to_le_bytes());
            out.push(frame);
        }
    }
    out
}

/// CLOCK_THREAD_CPUTIME_ID in ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn wire_port() -> u16 {
    dataplane_common::ROCEV2_UDP_PORT
}

fn main() {
    let total: usize = std::env::args().nth(1).map_or(5_000_000, |v| v.parse().expect("FRAMES is a number"));
    for flows in [1u16, 64] {
        let frames = frames(flows);
        let mut table = MirrorTable::new(9, &MirrorSettings::new("mir0".into()), FlowMatch::new(Config::default(), Vec::new()));
        let start = Instant::now();
        let cpu0 = thread_cpu_ns();
        let mut now = 1_000_000_000u64;
        for i in 0..total {
            let f = &frames[i % frames.len()];
            let (bytes, len) = f.split_at(f.len() - 4);
            let wire_len = u32::from_le_bytes(len.try_into().unwrap()) as usize;
            now += 500;
            table.ingest(bytes, wire_len, now);
        }
        let took = start.elapsed();
        let cpu = thread_cpu_ns() - cpu0;
        assert_eq!(table.counters.matched as usize, total);
        // CPU time of this thread, not wall time: on a shared machine the wall clock also counts
        // the time other processes held the core.
        println!(
            "{flows:>3} flow(s): {total} frames, {:.3} s CPU ({:.3} s wall): {:.0} ns of CPU per frame, {:.2} M frames/s per core",
            cpu as f64 / 1e9,
            took.as_secs_f64(),
            cpu as f64 / total as f64,
            total as f64 / (cpu as f64 / 1e9) / 1e6
        );
    }
}
