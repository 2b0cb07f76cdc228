//! Summary statistics of the benchmarks' samples.

use std::time::Duration;

/// The median of `samples` (the mean of the two middle ones for an even count); `None` for no
/// samples. NaNs sort last.
pub fn median(samples: &[f64]) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    Some(if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    })
}

/// The `p` quantile (0.0 to 1.0) of samples already sorted ascending, by the nearest rank
/// (rounded); `Duration::ZERO` for no samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_no_samples() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn percentile_by_nearest_rank() {
        let ms = |n| Duration::from_millis(n);
        let sorted: Vec<_> = (1..=101).map(ms).collect();
        assert_eq!(percentile(&sorted, 0.5), ms(51));
        assert_eq!(percentile(&sorted, 0.99), ms(100));
        assert_eq!(percentile(&sorted, 1.0), ms(101));
        assert_eq!(percentile(&sorted, 7.0), ms(101));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }
}
