//! Robust statistics (median, MAD) and the fixed-size history ring.
//!
//! Median and MAD rather than mean and standard deviation: with a handful of peers, one faulty
//! peer moves the mean and inflates the deviation enough to hide itself; the median ignores it as
//! long as fewer than half the peers are faulty.

use ringside_stats::median_in_place;

/// Consistency constant: 1.4826 × MAD estimates the standard deviation of normal data.
pub(crate) const MAD_TO_SIGMA: f64 = 1.4826;

/// Median and median absolute deviation of a sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Robust {
    pub median: f64,
    pub mad: f64,
}

impl Robust {
    /// `None` when the sample is empty.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        let median = median_in_place(&mut v)?;
        for x in v.iter_mut() {
            *x = (*x - median).abs();
        }
        let mad = median_in_place(&mut v).unwrap_or(0.0);
        Some(Self { median, mad })
    }

    /// Scale for z-scores: 1.4826 × MAD, at least `rel_floor × |median|` and `abs_floor`.
    pub fn scale(&self, rel_floor: f64, abs_floor: f64) -> f64 {
        (MAD_TO_SIGMA * self.mad)
            .max(rel_floor * self.median.abs())
            .max(abs_floor)
            .max(f64::MIN_POSITIVE)
    }
}

/// Leave-one-out statistics: for each index `i` with `Some` value, the median/MAD of all *other*
/// `Some` values, when there are at least `min_others` of them.
pub(crate) fn leave_one_out(values: &[Option<f64>], min_others: usize) -> Vec<Option<Robust>> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_ref()?;
            let others: Vec<f64> = values
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .filter_map(|(_, x)| *x)
                .collect();
            if others.len() < min_others.max(1) {
                return None;
            }
            Robust::of(others)
        })
        .collect()
}

/// Fixed-capacity ring of the most recent values: memory is allocated once, at creation.
#[derive(Clone, Debug)]
pub(crate) struct Ring {
    buf: Vec<f64>,
    cap: usize,
    next: usize,
}

impl Ring {
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        Self { buf: Vec::with_capacity(cap), cap, next: 0 }
    }

    pub fn push(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        if self.buf.len() < self.cap {
            self.buf.push(x);
        } else {
            self.buf[self.next] = x;
        }
        self.next = (self.next + 1) % self.cap;
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn robust(&self) -> Option<Robust> {
        Robust::of(self.buf.iter().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_mad_ignore_one_outlier() {
        let r = Robust::of([10.0, 11.0, 9.0, 10.0, 1000.0]).unwrap();
        assert_eq!(r.median, 10.0);
        assert_eq!(r.mad, 1.0);
        assert_eq!(Robust::of([1.0, 2.0, 3.0, 4.0]).unwrap().median, 2.5);
        assert!(Robust::of(std::iter::empty()).is_none());
    }

    #[test]
    fn scale_is_floored() {
        let r = Robust::of([5.0, 5.0, 5.0]).unwrap();
        assert_eq!(r.mad, 0.0);
        assert_eq!(r.scale(0.1, 0.0), 0.5);
        assert_eq!(r.scale(0.0, 2.0), 2.0);
    }

    #[test]
    fn leave_one_out_excludes_self_and_missing() {
        let s = leave_one_out(&[Some(1.0), Some(100.0), None, Some(3.0)], 2);
        assert_eq!(s[0].unwrap().median, 51.5);
        assert_eq!(s[1].unwrap().median, 2.0);
        assert!(s[2].is_none());
        assert_eq!(s[3].unwrap().median, 50.5);
        assert!(leave_one_out(&[Some(1.0), Some(2.0)], 2)[0].is_none());
    }

    #[test]
    fn ring_keeps_only_the_latest() {
        let mut r = Ring::new(3);
        for x in [1.0, 2.0, 3.0, 4.0, 5.0] {
            r.push(x);
        }
        assert_eq!(r.len(), 3);
        assert_eq!(r.robust().unwrap().median, 4.0);
        assert_eq!(r.buf.capacity(), 3);
    }
}
