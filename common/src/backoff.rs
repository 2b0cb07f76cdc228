//! Retry delays for our own loops: `backon`'s exponential backoff (the machinery kube-runtime's
//! `DefaultBackoff` is built on) without jitter, so a loop waits exactly `min`, `2 min`, ...
//! up to `max`. Each of these loops retries one call of one process (kubelet's Register, a
//! Secret or certificate bootstrap, a node patch), with no herd of clients to spread; calls
//! many replicas make at once (watches, the caBundle patch) keep kube's jittered
//! `DefaultBackoff`.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Exponential backoff: `min` doubling to a `max` ceiling, back to `min` on
/// [`reset`](Self::reset).
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    delays: <ExponentialBuilder as BackoffBuilder>::Backoff,
    max: Duration,
}

impl Backoff {
    /// `min`, `2 min`, `4 min`, ... up to `max`, without end.
    pub fn new(min: Duration, max: Duration) -> Self {
        let builder = ExponentialBuilder::new()
            .with_min_delay(min)
            .with_max_delay(max)
            .without_max_times();
        Self {
            builder,
            delays: builder.build(),
            max,
        }
    }

    /// The delay before the next attempt; each call doubles the following one.
    pub fn next_delay(&mut self) -> Duration {
        // Never `None` without a limit of attempts. backon doubles in f32 (200.000003 ms):
        // whole milliseconds, as the logs show them.
        let delay = self.delays.next().unwrap_or(self.max);
        Duration::from_millis(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX))
    }

    /// Starts again from `min` (after a success).
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_ceiling_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let seq: Vec<_> = (0..4).map(|_| b.next_delay()).collect();
        let ms = Duration::from_millis;
        assert_eq!(seq, [ms(100), ms(200), ms(350), ms(350)]);
        b.reset();
        assert_eq!(b.next_delay(), ms(100));
        // No limit of attempts.
        let mut b = Backoff::new(ms(100), Duration::from_secs(5));
        let seq: Vec<_> = (0..1000).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(seq[..7], [100, 200, 400, 800, 1600, 3200, 5000]);
        assert!(seq[7..].iter().all(|d| *d == 5000));
        b.next_delay();
        b.reset();
        assert_eq!(b.next_delay(), ms(100));
    }
}
