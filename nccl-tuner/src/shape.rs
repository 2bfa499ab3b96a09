//! What a ringside hint does to one NCCL decision: a pure function over NCCL's cost table.
//!
//! Invariants:
//! - Only the collectives a hint describes are shaped ([`covers`]: allreduce, the collective
//!   whose algorithm ringside's policy chooses); every other call is left exactly as NCCL built it.
//! - An entry NCCL marked unsupported (negative, i.e. `NCCL_ALGO_PROTO_IGNORE`, or NaN) is never
//!   changed: shaping cannot enable a combination NCCL ruled out.
//! - The hinted algorithm's own entries are never changed, so NCCL still picks the protocol
//!   within it; every other algorithm's supported entries are raised above the hinted
//!   algorithm's dearest supported entry, so the hinted algorithm wins whatever the protocol.
//!   They stay supported (raised, not ignored): should NCCL find the hinted one unusable later,
//!   it still has its next-best plan.
//! - When the hinted algorithm has no supported entry in the table, nothing changes.

use std::ffi::c_int;

use ringside_client::{Algorithm, Hint};

use crate::abi::{ALGO_RING, ALGO_TREE, FUNC_ALL_REDUCE, NcclFunc};

/// NCCL's row for a ringside algorithm. NCCL has no recursive halving-doubling allreduce; its
/// double binary tree is the nearest (log-depth latency, for the latency-bound sizes `rhd` is
/// chosen for), so `rhd` maps to it too.
pub fn nccl_algorithm(a: Algorithm) -> c_int {
    match a {
        Algorithm::Ring => ALGO_RING,
        Algorithm::Tree | Algorithm::Rhd => ALGO_TREE,
    }
}

/// Whether a hint covers this collective.
pub fn covers(coll: NcclFunc) -> bool {
    coll == FUNC_ALL_REDUCE
}

/// A hint, mapped onto what NCCL's tuner interface can express.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shaping {
    /// The hint's version, for logs.
    pub version: u64,
    /// `NCCL_ALGO_RING` or `NCCL_ALGO_TREE`.
    pub algorithm: c_int,
    /// NCCL's channel count (`nChannels`); `None` leaves NCCL's.
    pub channels: Option<c_int>,
    /// NCCL's chunk size for the Simple protocol (tuner v6+); `None` leaves NCCL's.
    pub chunk_bytes: Option<usize>,
    /// Unix time (ms) after which the hint no longer applies.
    pub expires_at_ms: u64,
}

impl Shaping {
    /// The hint's algorithm, channels and chunk size; its codec, error feedback and `step_from`
    /// have no NCCL counterpart.
    pub fn from_hint(h: &Hint) -> Shaping {
        Shaping {
            version: h.version,
            algorithm: nccl_algorithm(h.algorithm),
            channels: (h.channels > 0).then_some(c_int::from(h.channels)),
            chunk_bytes: (h.chunk_bytes > 0).then_some(h.chunk_bytes as usize),
            expires_at_ms: h.expires_at,
        }
    }

    /// Whether the hint still applies at `now_unix_ms`.
    pub fn is_live(&self, now_unix_ms: u64) -> bool {
        now_unix_ms < self.expires_at_ms
    }
}

/// What [`steer_cost_table`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Steer {
    /// The hinted algorithm now costs less than every other supported entry; `raised` entries of
    /// other algorithms were raised.
    Steered { raised: usize },
    /// The hinted algorithm has no supported entry here (or is outside the table): untouched.
    HintedUnsupported,
    /// `num_algo`/`num_proto` do not describe `table`: untouched.
    BadShape,
}

fn supported(cost: f32) -> bool {
    cost >= 0.0
}

/// Raises every other algorithm's supported entries of `table` (`num_algo` rows of `num_proto`
/// NCCL-estimated times in µs) above the hinted algorithm's dearest supported entry.
pub fn steer_cost_table(table: &mut [f32], num_algo: usize, num_proto: usize, algorithm: c_int) -> Steer {
    if num_algo == 0 || num_proto == 0 || table.len() != num_algo * num_proto {
        return Steer::BadShape;
    }
    let Ok(hinted) = usize::try_from(algorithm) else { return Steer::HintedUnsupported };
    if hinted >= num_algo {
        return Steer::HintedUnsupported;
    }
    let row = |a: usize| a * num_proto..(a + 1) * num_proto;
    let Some(dearest) = table[row(hinted)].iter().copied().filter(|c| supported(*c)).reduce(f32::max) else {
        return Steer::HintedUnsupported;
    };
    // Strictly above `dearest` even where f32 cannot resolve `dearest + 1` (large µs values).
    let penalty = dearest * 2.0 + 1.0;
    let mut raised = 0;
    for a in (0..num_algo).filter(|a| *a != hinted) {
        for cost in &mut table[row(a)] {
            if supported(*cost) {
                *cost += penalty;
                raised += 1;
            }
        }
    }
    Steer::Steered { raised }
}

/// The algorithm and protocol NCCL would pick from `table`: the cheapest supported entry (ties go
/// to the first, as in NCCL's scan). For tests and logs.
pub fn cheapest(table: &[f32], num_proto: usize) -> Option<(usize, usize)> {
    let mut best: Option<(usize, f32)> = None;
    for (i, c) in table.iter().copied().enumerate() {
        if supported(c) && best.is_none_or(|(_, b)| c < b) {
            best = Some((i, c));
        }
    }
    best.map(|(i, _)| (i / num_proto, i % num_proto))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{ALGO_COLLNET_CHAIN, ALGO_NVLS, ALGO_PAT, ALGO_PROTO_IGNORE as X, NUM_ALGORITHMS, NUM_PROTOCOLS, PROTO_LL, PROTO_SIMPLE};

    const P: usize = NUM_PROTOCOLS;

    /// A NCCL-like table for `bytes`: tree wins small sizes (LL), ring wins large ones (Simple);
    /// collnet, NVLS and PAT unsupported, and tree LL128 unsupported too.
    fn table(bytes: f64) -> Vec<f32> {
        let mut t = vec![X; NUM_ALGORITHMS * P];
        let time = |lat: f64, gbps: f64| (lat + bytes / (gbps * 1e3)) as f32;
        t[ALGO_TREE as usize * P..][..P].copy_from_slice(&[time(4.0, 2.0), X, time(20.0, 8.0)]);
        t[ALGO_RING as usize * P..][..P].copy_from_slice(&[time(9.0, 3.0), time(12.0, 10.0), time(40.0, 20.0)]);
        t
    }

    fn sizes() -> impl Iterator<Item = f64> {
        (12..=28).step_by(2).map(|s| f64::from(1u32 << s))
    }

    #[test]
    fn the_model_table_has_both_winners_without_a_hint() {
        assert_eq!(cheapest(&table(4096.0), P), Some((ALGO_TREE as usize, PROTO_LL as usize)));
        assert_eq!(cheapest(&table(256.0 * 1048576.0), P), Some((ALGO_RING as usize, PROTO_SIMPLE as usize)));
    }

    #[test]
    fn hinted_algorithm_wins_at_every_size_and_keeps_its_protocol_order() {
        for algo in [ALGO_RING, ALGO_TREE] {
            for bytes in sizes() {
                let before = table(bytes);
                let mut t = before.clone();
                let steer = steer_cost_table(&mut t, NUM_ALGORITHMS, P, algo);
                assert!(matches!(steer, Steer::Steered { raised } if raised > 0), "{steer:?}");
                let (a, p) = cheapest(&t, P).unwrap();
                assert_eq!(a, algo as usize, "algo {algo} at {bytes} B");
                // The protocol is NCCL's best within the hinted row.
                let row = &before[algo as usize * P..][..P];
                assert_eq!(Some((0, p)), cheapest(row, P), "protocol kept at {bytes} B");
                // The hinted row is unchanged, ignored entries stay ignored, others only rise.
                for (i, (b, n)) in before.iter().zip(&t).enumerate() {
                    if i / P == algo as usize || *b < 0.0 {
                        assert_eq!(b.to_bits(), n.to_bits(), "entry {i}");
                    } else {
                        assert!(n > b, "entry {i} raised");
                    }
                }
            }
        }
    }

    #[test]
    fn unsupported_hinted_algorithm_or_bad_shape_leaves_the_table_alone() {
        let before = table(1048576.0);
        for algo in [ALGO_NVLS, ALGO_PAT, ALGO_COLLNET_CHAIN, -1, 99] {
            let mut t = before.clone();
            assert_eq!(steer_cost_table(&mut t, NUM_ALGORITHMS, P, algo), Steer::HintedUnsupported, "algo {algo}");
            assert_eq!(t, before);
        }
        let mut t = before.clone();
        assert_eq!(steer_cost_table(&mut t, NUM_ALGORITHMS + 1, P, ALGO_RING), Steer::BadShape);
        assert_eq!(steer_cost_table(&mut t, 0, P, ALGO_RING), Steer::BadShape);
        assert_eq!(t, before);
        // A row of only ignored entries (ring unsupported, e.g. one rank with NCCL_ALGO=tree).
        let mut t = before.clone();
        t[ALGO_RING as usize * P..][..P].fill(X);
        let snapshot = t.clone();
        assert_eq!(steer_cost_table(&mut t, NUM_ALGORITHMS, P, ALGO_RING), Steer::HintedUnsupported);
        assert_eq!(t, snapshot);
    }

    #[test]
    fn older_narrower_tables_and_extreme_costs() {
        // NCCL 2.22's table had 6 algorithm rows; the row count comes from NCCL, never assumed.
        let mut t: Vec<f32> = table(65536.0)[..6 * P].to_vec();
        assert!(matches!(steer_cost_table(&mut t, 6, P, ALGO_RING), Steer::Steered { .. }));
        assert_eq!(cheapest(&t, P).map(|x| x.0), Some(ALGO_RING as usize));
        // Huge hinted costs (f32 cannot add 1 to 3e9) and zero ones still leave a strict winner.
        for hinted_cost in [0.0f32, 3.0e9, 1.0e30] {
            let mut t = vec![X; 2 * P];
            t[ALGO_TREE as usize * P + PROTO_SIMPLE as usize] = 0.0;
            t[ALGO_RING as usize * P + PROTO_SIMPLE as usize] = hinted_cost;
            assert!(matches!(steer_cost_table(&mut t, 2, P, ALGO_RING), Steer::Steered { raised: 1 }));
            assert_eq!(cheapest(&t, P), Some((ALGO_RING as usize, PROTO_SIMPLE as usize)), "hinted cost {hinted_cost}");
        }
        // NaN counts as unsupported and is left as it is.
        let mut t = vec![f32::NAN, 5.0, X, 1.0, X, X];
        assert!(matches!(steer_cost_table(&mut t, 2, P, ALGO_RING), Steer::Steered { raised: 1 }));
        assert!(t[0].is_nan() && t[1] > 1.0);
    }

    proptest::proptest! {
        /// Any table NCCL could pass (0..=8 rows of 3 protocols, each entry a time or ignored):
        /// either the hinted algorithm now strictly wins with its own protocol order kept and
        /// every ignored entry still ignored, or nothing changed because it had nothing supported.
        #[test]
        fn steering_any_table(
            rows in 1usize..=8,
            entries in proptest::collection::vec(proptest::option::weighted(0.7, 0.0f32..1.0e7), 8 * P),
            algo in -1i32..9,
        ) {
            let before: Vec<f32> = entries[..rows * P].iter().map(|e| e.unwrap_or(X)).collect();
            let mut t = before.clone();
            let hinted_supported = algo >= 0 && (algo as usize) < rows && before[algo as usize * P..][..P].iter().any(|c| *c >= 0.0);
            match steer_cost_table(&mut t, rows, P, algo) {
                Steer::Steered { .. } => {
                    proptest::prop_assert!(hinted_supported);
                    let (a, p) = cheapest(&t, P).unwrap();
                    proptest::prop_assert_eq!(a, algo as usize);
                    proptest::prop_assert_eq!(Some((0, p)), cheapest(&before[a * P..][..P], P));
                    let hinted_max = before[a * P..][..P].iter().copied().filter(|c| *c >= 0.0).fold(0.0f32, f32::max);
                    for (i, (b, n)) in before.iter().zip(&t).enumerate() {
                        if *b < 0.0 || i / P == a {
                            proptest::prop_assert_eq!(b.to_bits(), n.to_bits());
                        } else {
                            proptest::prop_assert!(*n > hinted_max && n >= b);
                        }
                    }
                }
                other => {
                    proptest::prop_assert!(!hinted_supported, "{:?}", other);
                    proptest::prop_assert_eq!(t, before);
                }
            }
        }
    }

    #[test]
    fn hint_mapping() {
        let mut h: Hint = serde_json::from_str(
            r#"{"job":"j","version":3,"step_from":0,"algorithm":"rhd","chunk_bytes":65536,"channels":2,"compression":"int8","error_feedback":true,"reasons":[],"confidence":0.5,"expires_at":1000}"#,
        )
        .unwrap();
        let s = Shaping::from_hint(&h);
        assert_eq!(s, Shaping { version: 3, algorithm: ALGO_TREE, channels: Some(2), chunk_bytes: Some(65536), expires_at_ms: 1000 });
        assert!(s.is_live(999) && !s.is_live(1000));
        h.algorithm = Algorithm::Ring;
        h.channels = 0;
        h.chunk_bytes = 0;
        let s = Shaping::from_hint(&h);
        assert_eq!((s.algorithm, s.channels, s.chunk_bytes), (ALGO_RING, None, None));
        assert_eq!(nccl_algorithm(Algorithm::Tree), ALGO_TREE);
        assert!(covers(FUNC_ALL_REDUCE));
        for f in [crate::abi::FUNC_BROADCAST, crate::abi::FUNC_REDUCE, crate::abi::FUNC_ALL_GATHER, crate::abi::FUNC_REDUCE_SCATTER, 5, 7, 42] {
            assert!(!covers(f), "func {f}");
        }
    }
}
