//! Percentiles of samples within a run, and median/min/max of a figure across runs.

/// The `q`-quantile (0..=1) of `sorted` by the nearest-rank method; NaN when empty.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Sorts in place (NaNs last) and returns the slice for [`quantile`].
pub fn sorted(v: &mut [f64]) -> &[f64] {
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// A figure summarised over runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

impl Summary {
    /// Median (mean of the middle two for an even count), min and max of the finite values.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: v[0],
            max: v[n - 1],
            runs: n,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 500.0);
        assert_eq!(quantile(&v, 0.99), 990.0);
        assert_eq!(quantile(&v, 0.999), 999.0);
        assert_eq!(quantile(&v, 1.0), 1000.0);
        assert_eq!(quantile(&[7.0], 0.999), 7.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn summary_median_min_max() {
        let s = Summary::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.runs), (2.0, 1.0, 3.0, 3));
        let s = Summary::of(&[4.0, 1.0, 2.0, f64::NAN, 3.0]).unwrap();
        assert_eq!((s.median, s.runs), (2.5, 4));
        assert!(Summary::of(&[f64::NAN]).is_none());
    }
}
