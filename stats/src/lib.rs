//! Order statistics for the agent (detectors, attribution, policy) and the evaluations and
//! benchmarks (`cargo xtask eval ...`, `bench ...`): one quantile definition instead of a copy per
//! module.
//!
//! The definition: **linear interpolation between the closest ranks** (Hyndman & Fan type 7, the
//! default of numpy, R and Excel's `PERCENTILE.INC`). For `n` sorted values `v[0..n]` and
//! `q` in `[0, 1]`, `h = q·(n−1)`, and the quantile is `v[⌊h⌋] + (h − ⌊h⌋)·(v[⌈h⌉] − v[⌊h⌋])`.
//! Why this one:
//! - at `q = 0.5` it is the usual median (the middle value, or the mean of the two middle values),
//!   which the robust detectors (median/MAD) were built and tuned on;
//! - it is continuous and monotone in `q` and in the data, so a threshold derived from it does not
//!   jump when one sample is added; nearest-rank, the other definition the code once had, returns
//!   a sample and jumps between neighbours;
//! - `q = 0` and `q = 1` are the minimum and the maximum.
//!
//! [`median`] is `quantile(.., 0.5)`, computed as the midpoint `(a + b) / 2` of the two middle
//! values (one rounding instead of two; equal to within the last bit).
//!
//! Non-finite values (NaN, ±∞) are ignored by the functions that take an iterator (of `f64` or
//! `&f64`: a `&Vec<f64>` or `&[f64]` will do); the `_sorted` and `_in_place` functions leave that to
//! the caller. An empty sample has no quantile (`None`).

use std::borrow::Borrow;

/// Sorts `values` ascending in place (total order: fine for finite values).
pub fn sort(values: &mut [f64]) {
    values.sort_by(f64::total_cmp);
}

/// The finite values of `values`, sorted ascending.
pub fn sorted_finite<I: IntoIterator>(values: I) -> Vec<f64>
where
    I::Item: Borrow<f64>,
{
    let mut v: Vec<f64> = values.into_iter().map(|x| *x.borrow()).filter(|x| x.is_finite()).collect();
    sort(&mut v);
    v
}

/// The `q` quantile (`q` clamped to `[0, 1]`) of an ascending `sorted` slice; `None` when empty.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let h = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = h as usize; // h ≥ 0: truncation is the floor
    let frac = h - lo as f64;
    let hi = if frac > 0.0 { lo + 1 } else { lo };
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// The `q` quantile of the finite values in `values`; `None` when there are none.
pub fn quantile<I: IntoIterator>(values: I, q: f64) -> Option<f64>
where
    I::Item: Borrow<f64>,
{
    quantile_sorted(&sorted_finite(values), q)
}

/// The median of an ascending `sorted` slice; `None` when empty.
pub fn median_sorted(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    Some(if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 })
}

/// The median of `values`, sorting them in place; `None` when empty. The caller keeps NaN out.
pub fn median_in_place(values: &mut [f64]) -> Option<f64> {
    sort(values);
    median_sorted(values)
}

/// The median of the finite values in `values`; `None` when there are none.
pub fn median<I: IntoIterator>(values: I) -> Option<f64>
where
    I::Item: Borrow<f64>,
{
    median_sorted(&sorted_finite(values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median([1.0, 2.0]), Some(1.5));
        assert_eq!(median(std::iter::empty::<f64>()), None);
        assert_eq!(median(&vec![2.0, 1.0]), Some(1.5), "borrowed values");
        assert_eq!(median([7.0]), Some(7.0));
    }

    #[test]
    fn non_finite_values_are_ignored() {
        assert_eq!(median([f64::NAN, 1.0, f64::INFINITY, 3.0]), Some(2.0));
        assert_eq!(median([f64::NAN]), None);
        assert_eq!(quantile([f64::NEG_INFINITY, 5.0], 0.0), Some(5.0));
    }

    #[test]
    fn quantile_interpolates_between_closest_ranks() {
        // Python: statistics.quantiles([1, 2, 3, 4], n=4, method="inclusive") = [1.75, 2.5, 3.25]
        // (type 7); the 0.9 point is the last of n=10: 3.7.
        let v = [4.0, 2.0, 1.0, 3.0];
        for (q, want) in [(0.0, 1.0), (0.25, 1.75), (0.5, 2.5), (0.75, 3.25), (0.9, 3.7), (1.0, 4.0)] {
            let got = quantile(v, q).unwrap();
            assert!((got - want).abs() < 1e-12, "q {q}: {got} != {want}");
        }
        // Out-of-range q clamps to the extremes.
        assert_eq!(quantile(v, -1.0), Some(1.0));
        assert_eq!(quantile(v, 2.0), Some(4.0));
        assert_eq!(quantile(&[] as &[f64], 0.5), None);
    }

    #[test]
    fn median_is_the_half_quantile() {
        for n in 1..40usize {
            let v: Vec<f64> = (0..n).map(|i| ((i * 37) % 11) as f64 * 0.5).collect();
            assert_eq!(median(v.iter().copied()), quantile(v.iter().copied(), 0.5), "n {n}");
        }
    }

    #[test]
    fn in_place_sorts_and_matches() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0];
        assert_eq!(median_in_place(&mut v), Some(3.0));
        assert_eq!(v, [1.0, 2.0, 4.0, 5.0]);
        assert_eq!(median_in_place(&mut []), None);
        assert_eq!(median_sorted(&v), Some(3.0));
        assert_eq!(quantile_sorted(&v, 1.0 / 3.0), Some(2.0));
    }
}
