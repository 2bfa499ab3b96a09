//! Synthetic counter series for the detector tests: a job of peers doing synchronous training
//! steps (one communication phase per step and peer), with seeded, deterministic noise and
//! injectable faults.
//!
//! Healthy noise model (per 1 s window): a shared CPU factor on every peer's rate (sd 6 %, the 2
//! vCPUs are shared), a per-peer factor (sd 4 %), a per-phase factor (sd 3 %), a 2 % chance per
//! peer and window of a scheduler hiccup (rate × 0.85); phase-start jitter 0–4 ms with a 1 %
//! chance of 10–20 ms more; 0–5 spurious retransmissions (veth reordering) with a 3 % chance of a
//! reorder burst of 10–40; a 2 % chance of 1–4 CE marks. Every phase reaches the detector as
//! three kernel bursts separated by 2 ms (the kernel splits bursts at 1 ms idle gaps).
//! Noise is the sum of three uniforms (bounded at ±3 sd), so tails are finite.
//!
//! On top of that, every `SPIKE_EVERY` windows one random peer gets an isolated single-window
//! spike that *does* cross a raise threshold: a reorder storm (100–250 spurious retransmissions),
//! a deep CPU stall (rate × 0.55–0.65), a CE blip (2.5 % of its packets), or a late start
//! (every phase 30–40 ms late, a GC pause). Persistence must filter them; the
//! `healthy_spikes_are_seen_but_filtered` test checks that they are detected with k = n = 1.

use std::net::IpAddr;

use super::input::{BurstSummary, JobWindow, PeerWindow};

pub const MS: u64 = 1_000_000;
pub const S: u64 = 1_000_000_000;
const MSS: u64 = 1448;
pub const SPIKE_EVERY: usize = 25;

/// splitmix64: tiny, seeded, deterministic.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Zero-mean noise with standard deviation `sd`, bounded at ±3 sd.
    pub fn noise(&mut self, sd: f64) -> f64 {
        let sum: f64 = (0..3).map(|_| self.unit() * 2.0 - 1.0).sum();
        sum * sd
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform integer in [lo, hi).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo).max(1)
    }
}

#[derive(Clone, Debug)]
pub enum Fault {
    /// Random drop on the path to one peer: retransmissions at `rate`, and TCP slows down.
    Loss { peer: usize, rate: f64 },
    /// A rate cap on one peer's path: lower goodput, no loss.
    GoodputCut { peer: usize, factor: f64 },
    /// A congested shared uplink: every peer behind `link` slows down, gets CE marks, some loss.
    Uplink { link: &'static str, goodput_factor: f64, ce_rate: f64, loss_rate: f64 },
    /// The peer's worker starts every phase `delay_ns` late; its network is fine.
    Straggler { peer: usize, delay_ns: u64 },
    /// No traffic to the peer in [at_ns, at_ns + duration_ns); in-flight data is retransmitted
    /// after it. Applies to the window containing `at_ns`; the window range is ignored.
    Flap { peer: usize, at_ns: u64, duration_ns: u64 },
    /// The same silence without loss: the peer's worker paused mid-phase (no retransmissions).
    Pause { peer: usize, at_ns: u64, duration_ns: u64 },
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    /// (address, link) per peer.
    pub peers: Vec<(IpAddr, String)>,
    pub step_ns: u64,
    pub phase_bytes: u64,
    pub rate_bps: f64,
    /// Faults active in windows [from, to).
    pub faults: Vec<(Fault, usize, usize)>,
}

#[derive(Clone, Copy)]
struct P {
    start: u64,
    end: u64,
    bytes: u64,
}

impl Scenario {
    fn with_peers(seed: u64, peers: Vec<(IpAddr, String)>) -> Self {
        Self { seed, peers, step_ns: 200 * MS, phase_bytes: 10_000_000, rate_bps: 125e6, faults: Vec::new() }
    }

    /// Eight peers behind two leaf uplinks: 10.0.1.1–4 on `leaf1`, 10.0.2.1–4 on `leaf2`.
    pub fn two_leaves(seed: u64) -> Self {
        let peers = (0..8)
            .map(|i| {
                let leaf = i / 4 + 1;
                (format!("10.0.{leaf}.{}", i % 4 + 1).parse().unwrap(), format!("leaf{leaf}"))
            })
            .collect();
        Self::with_peers(seed, peers)
    }

    /// Six peers, each on its own link `veth1`..`veth6` (10.0.0.1–6).
    pub fn star(seed: u64) -> Self {
        let peers = (1..=6).map(|i| (format!("10.0.0.{i}").parse().unwrap(), format!("veth{i}"))).collect();
        Self::with_peers(seed, peers)
    }

    /// One host's own end of the wire (its IPU's fabric port, or its NIC): its two ring
    /// neighbours 10.0.0.1-2, both reached by link `fabric`.
    pub fn own_cable(seed: u64) -> Self {
        let peers = (1..=2).map(|i| (format!("10.0.0.{i}").parse().unwrap(), "fabric".to_owned())).collect();
        Self::with_peers(seed, peers)
    }

    pub fn with(mut self, fault: Fault, from: usize, to: usize) -> Self {
        self.faults.push((fault, from, to));
        self
    }

    pub fn peer(&self, i: usize) -> IpAddr {
        self.peers[i].0
    }

    pub fn windows(&self, n: usize) -> Vec<JobWindow> {
        let mut rng = Rng::new(self.seed);
        let steps = S / self.step_ns;
        let mut out: Vec<JobWindow> = (0..n)
            .map(|w| JobWindow {
                job: "job-1".into(),
                window_start_ns: w as u64 * S,
                window_end_ns: (w as u64 + 1) * S,
                peers: Vec::new(),
                links: Vec::new(),
                conns: Vec::new(),
                local: None,
            })
            .collect();
        // Bursts are reported in the window where they end; counters where the step started.
        let mut bursts: Vec<Vec<Vec<BurstSummary>>> = vec![vec![Vec::new(); self.peers.len()]; n + 2];
        for w in 0..n {
            let cpu = 1.0 + rng.noise(0.06);
            let spike = (w % SPIKE_EVERY == SPIKE_EVERY / 2)
                .then(|| (rng.range(0, self.peers.len() as u64) as usize, rng.range(0, 4)));
            let (mut all_phases, mut delays) = (Vec::new(), Vec::new());
            for (pi, (_, link)) in self.peers.iter().enumerate() {
                let mut rate = self.rate_bps * cpu * (1.0 + rng.noise(0.04));
                if rng.chance(0.02) {
                    rate *= 0.85;
                }
                let (mut loss, mut ce, mut delay, mut flap, mut flap_retrans) = (0.0, 0.0, 0u64, None, 0u64);
                let mut lossy_flap = true;
                let mut storm = 0;
                match spike {
                    Some((p, 0)) if p == pi => storm = rng.range(100, 250),
                    Some((p, 1)) if p == pi => rate *= 0.55 + 0.1 * rng.unit(),
                    Some((p, 2)) if p == pi => ce += 0.025,
                    Some((p, _)) if p == pi => delay += rng.range(30 * MS, 40 * MS),
                    _ => {}
                }
                for (fault, from, to) in &self.faults {
                    let active = (*from..*to).contains(&w);
                    match *fault {
                        Fault::Loss { peer, rate: r } if active && peer == pi => {
                            rate /= 1.0 + 15.0 * r;
                            loss += r;
                        }
                        Fault::GoodputCut { peer, factor } if active && peer == pi => rate *= factor,
                        Fault::Uplink { link: l, goodput_factor, ce_rate, loss_rate } if active && l == link => {
                            rate *= goodput_factor;
                            ce += ce_rate;
                            loss += loss_rate;
                        }
                        Fault::Straggler { peer, delay_ns } if active && peer == pi => delay += delay_ns,
                        Fault::Flap { peer, at_ns, duration_ns } if peer == pi && at_ns / S == w as u64 => {
                            flap = Some((at_ns, at_ns + duration_ns));
                        }
                        Fault::Pause { peer, at_ns, duration_ns } if peer == pi && at_ns / S == w as u64 => {
                            flap = Some((at_ns, at_ns + duration_ns));
                            lossy_flap = false;
                        }
                        _ => {}
                    }
                }
                let mut phases = Vec::new();
                for k in 0..steps {
                    let mut jitter = rng.range(0, 4 * MS);
                    if rng.chance(0.01) {
                        jitter += rng.range(10 * MS, 20 * MS);
                    }
                    let start = w as u64 * S + k * self.step_ns + 50 * MS + jitter + delay;
                    let r = rate * (1.0 + rng.noise(0.03));
                    let dur = (self.phase_bytes as f64 / r * 1e9) as u64;
                    phases.push(P { start, end: start + dur, bytes: self.phase_bytes });
                }
                if let Some((a, b)) = flap {
                    let mut moved = Vec::new();
                    for p in phases {
                        if p.start < a && a < p.end {
                            let first = (p.bytes as f64 * (a - p.start) as f64 / (p.end - p.start) as f64) as u64;
                            moved.push(P { start: p.start, end: a, bytes: first });
                            moved.push(P { start: b, end: b + (p.end - a), bytes: p.bytes - first });
                            flap_retrans += if lossy_flap { 40 } else { 0 };
                        } else if (a..b).contains(&p.start) {
                            moved.push(P { start: b, end: b + (p.end - p.start), bytes: p.bytes });
                        } else {
                            moved.push(p);
                        }
                    }
                    // The delayed phases queue behind each other.
                    moved.sort_by_key(|p| p.start);
                    for i in 1..moved.len() {
                        let min_start = moved[i - 1].end + MS;
                        if moved[i].start < min_start {
                            let shift = min_start - moved[i].start;
                            moved[i].start += shift;
                            moved[i].end += shift;
                        }
                    }
                    phases = moved;
                }
                delays.push(delay);
                let total: u64 = phases.iter().map(|p| p.bytes).sum();
                let packets = total.div_ceil(MSS);
                let mut retrans = rng.range(0, 6) + flap_retrans + storm;
                if rng.chance(0.03) {
                    retrans += rng.range(10, 40);
                }
                retrans += (packets as f64 * loss * (1.0 + rng.noise(0.15))).max(0.0) as u64;
                let mut ce_marks = (packets as f64 * ce * (1.0 + rng.noise(0.1))).max(0.0) as u64;
                if rng.chance(0.02) {
                    ce_marks += rng.range(1, 5);
                }
                all_phases.push(phases);
                out[w].peers.push(PeerWindow {
                    peer: self.peers[pi].0,
                    link: link.clone(),
                    bytes: total,
                    data_packets: packets,
                    retrans,
                    ce_marks,
                    cnps: 0,
                    psn_gap_packets: 0,
                    naks: 0,
                    bursts: Vec::new(),
                    explained_by: None,
                    shared_links: Vec::new(),
                    pokes: Vec::new(),
                });
            }
            stall_behind_latest(&mut all_phases, &delays);
            for (pi, phases) in all_phases.iter().enumerate() {
                for p in phases {
                    // Three kernel bursts per phase, 2 ms apart.
                    let third = (p.end - p.start).saturating_sub(4 * MS) / 3;
                    for j in 0..3u64 {
                        let s = p.start + j * (third + 2 * MS);
                        let b = BurstSummary { start_ns: s, end_ns: s + third, bytes: p.bytes / 3, to: None };
                        let wi = ((b.end_ns / S) as usize).min(n + 1);
                        bursts[wi][pi].push(b);
                    }
                }
            }
        }
        for (w, jw) in out.iter_mut().enumerate() {
            for (pi, pw) in jw.peers.iter_mut().enumerate() {
                pw.bursts = std::mem::take(&mut bursts[w][pi]);
            }
        }
        out
    }
}

/// A peer window made only of the data bursts the peer sent (MSS-sized packets, `retrans` of them
/// retransmitted, no ECN or RoCE evidence).
pub fn peer_of_bursts(peer: IpAddr, link: String, bursts: Vec<BurstSummary>, retrans: u64) -> PeerWindow {
    let bytes: u64 = bursts.iter().map(|b| b.bytes).sum();
    PeerWindow {
        peer,
        link,
        bytes,
        data_packets: bytes.div_ceil(MSS),
        retrans,
        ce_marks: 0,
        cnps: 0,
        psn_gap_packets: 0,
        naks: 0,
        bursts,
        explained_by: None,
        shared_links: Vec::new(),
        pokes: Vec::new(),
    }
}

/// A collective cannot finish without every peer: when one peer's worker starts a step late
/// (`delays[p]`, a compute straggler), the others send what they can without it (their first
/// 8 ms) and then wait, sending the rest of the step once its data reaches them (5 ms after it
/// starts: an eager protocol, its first chunk on the wire). Phases are per step,
/// in the same order for every peer (flaps, which move phases, never coincide with a delay here).
fn stall_behind_latest(phases: &mut [Vec<P>], delays: &[u64]) {
    let Some(&latest) = delays.iter().max() else { return };
    let Some(late_peer) = delays.iter().position(|&d| d == latest) else { return };
    if latest == 0 {
        return;
    }
    let late_starts: Vec<u64> = phases[late_peer].iter().map(|p| p.start).collect();
    for (q, ph) in phases.iter_mut().enumerate() {
        if delays[q] + 10 * MS > latest {
            continue;
        }
        let mut split = Vec::with_capacity(ph.len() * 2);
        for (k, p) in ph.iter().enumerate() {
            let Some(&resume) = late_starts.get(k) else {
                split.push(*p);
                continue;
            };
            let dur = p.end - p.start;
            let head = (8 * MS).min(dur);
            if p.start + head >= resume {
                split.push(*p);
                continue;
            }
            let head_bytes = (p.bytes as f64 * head as f64 / dur as f64) as u64;
            split.push(P { start: p.start, end: p.start + head, bytes: head_bytes });
            let rest = resume + 5 * MS;
            split.push(P { start: rest, end: rest + (dur - head), bytes: p.bytes - head_bytes });
        }
        *ph = split;
    }
}

/// A ring allreduce job as the detectors see it from a switch port (or host NIC): per peer, only
/// the data it *sends* (see `jobs.rs`). Each step, every rank computes (`compute_ns`, jitter 0–4
/// ms), then runs 2 (n − 1) ring steps: its k-th send (one chunk, `chunk_ns` ± 10 % on the wire)
/// waits for its own (k − 1)-th send and for its predecessor's (k − 1)-th chunk; the step ends
/// when its last chunk has arrived. With a straggler, every other rank sends its first chunks on
/// time and then stalls behind it, so its step splits into two phases: the pattern the testbed
/// shows (`t2_detect.rs`, 6 ranks, 4 MiB, 50 ms compute, +60 ms on one rank).
#[derive(Clone, Debug)]
pub struct RingJob {
    pub seed: u64,
    pub ranks: usize,
    pub chunk_bytes: u64,
    pub chunk_ns: u64,
    pub compute_ns: u64,
    /// (rank, extra compute per step, first window, end window): steps starting in
    /// [first, end) s compute `extra` longer on that rank.
    pub straggler: Option<(usize, u64, usize, usize)>,
}

impl RingJob {
    pub fn testbed(seed: u64) -> Self {
        Self { seed, ranks: 6, chunk_bytes: 724_000, chunk_ns: 4 * MS, compute_ns: 50 * MS, straggler: None }
    }

    pub fn peer(&self, r: usize) -> IpAddr {
        format!("10.77.0.{}", r + 1).parse().unwrap()
    }

    pub fn link(r: usize) -> String {
        format!("veth{}", r + 1)
    }

    pub fn windows(&self, n: usize) -> Vec<JobWindow> {
        let mut rng = Rng::new(self.seed);
        let ranks = self.ranks;
        let sends = 2 * (ranks - 1);
        let mut bursts: Vec<Vec<Vec<BurstSummary>>> = vec![vec![Vec::new(); ranks]; n];
        let mut step_end = vec![0u64; ranks];
        loop {
            let mut t = vec![vec![0u64; sends]; ranks];
            let mut done = vec![vec![0u64; sends]; ranks];
            for r in 0..ranks {
                let mut compute = self.compute_ns + rng.range(0, 4 * MS);
                if let Some((sr, extra, from, to)) = self.straggler {
                    if sr == r && (from as u64 * S..to as u64 * S).contains(&step_end[r]) {
                        compute += extra;
                    }
                }
                t[r][0] = step_end[r] + compute;
            }
            for k in 0..sends {
                for r in 0..ranks {
                    let pred = (r + ranks - 1) % ranks;
                    if k > 0 {
                        t[r][k] = (done[r][k - 1]).max(done[pred][k - 1]);
                    }
                    let wire = self.chunk_ns as f64 * (1.0 + rng.noise(0.033));
                    done[r][k] = t[r][k] + wire as u64;
                }
            }
            for r in 0..ranks {
                let pred = (r + ranks - 1) % ranks;
                step_end[r] = done[r][sends - 1].max(done[pred][sends - 1]);
                for k in 0..sends {
                    let wi = (done[r][k] / S) as usize;
                    if wi < n {
                        bursts[wi][r].push(BurstSummary { start_ns: t[r][k], end_ns: done[r][k], bytes: self.chunk_bytes, to: Some(self.peer((r + 1) % ranks)) });
                    }
                }
            }
            if step_end.iter().all(|&e| e >= n as u64 * S) {
                break;
            }
        }
        bursts
            .into_iter()
            .enumerate()
            .map(|(w, per_rank)| JobWindow {
                job: "ring".into(),
                window_start_ns: w as u64 * S,
                window_end_ns: (w as u64 + 1) * S,
                peers: per_rank
                    .into_iter()
                    .enumerate()
                    .map(|(r, b)| peer_of_bursts(self.peer(r), Self::link(r), b, rng.range(0, 6)))
                    .collect(),
                links: Vec::new(),
                conns: Vec::new(),
                local: None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_bounded() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..1000 {
            let x = a.noise(1.0);
            assert_eq!(x, b.noise(1.0));
            assert!(x.abs() <= 3.0);
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }

    #[test]
    fn healthy_series_looks_like_the_model() {
        let ws = Scenario::two_leaves(1).windows(3);
        assert_eq!(ws.len(), 3);
        let p = &ws[1].peers[0];
        assert_eq!(p.bursts.len(), 15, "5 phases × 3 kernel bursts");
        assert_eq!(p.bytes, 50_000_000);
        assert!(p.retrans < 50);
        assert!(p.bursts.iter().all(|b| b.start_ns >= S && b.end_ns < 2 * S));
    }

    #[test]
    fn ring_straggler_splits_the_other_ranks_steps() {
        use crate::detect::input::merge_phases;
        let job = RingJob { straggler: Some((3, 60 * MS, 0, 10)), ..RingJob::testbed(1) };
        let ws = job.windows(3);
        let phases = |r: usize| merge_phases(&ws[1].peers[r].bursts, 10 * MS, 256);
        let straggler = phases(3);
        // About 5 steps of ~180 ms; every other rank sends its first chunks, waits ~60 ms for the
        // straggler, then sends the rest: twice the straggler's phases.
        assert!((4..=7).contains(&straggler.len()), "{straggler:?}");
        for r in [0, 1, 2, 4, 5] {
            assert!(phases(r).len() >= 2 * straggler.len() - 1, "rank {r}: {:?}", phases(r));
        }
        let healthy = RingJob::testbed(1).windows(3);
        assert_eq!(merge_phases(&healthy[1].peers[0].bursts, 10 * MS, 256).len(), merge_phases(&healthy[1].peers[3].bursts, 10 * MS, 256).len());
    }
}
