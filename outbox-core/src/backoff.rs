//! Exponential backoff with jitter for failed publishes.

use std::time::Duration;

use rand::Rng;

/// Delay before the next attempt: `base * 2^(attempts-1)`, capped at `max`, with "equal jitter"
/// (a random point in the upper half) so that failed rows do not retry in lock-step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backoff {
    /// Delay after the first failure, before jitter.
    pub base: Duration,
    /// Largest delay, before jitter.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(100),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// `base` after the first failure, doubling up to `max`.
    pub const fn new(base: Duration, max: Duration) -> Self {
        Self { base, max }
    }

    /// The capped exponential delay after `attempts` failures, without jitter.
    pub fn ceiling(&self, attempts: u32) -> Duration {
        let exponent = attempts.saturating_sub(1).min(31);
        self.base.saturating_mul(1 << exponent).min(self.max)
    }

    /// The delay after `attempts` failures: uniformly random in `[ceiling/2, ceiling]`.
    pub fn delay(&self, attempts: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling(attempts);
        let half = ceiling / 2;
        half + rng.random_range(Duration::ZERO..=ceiling.saturating_sub(half))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKOFF: Backoff = Backoff {
        base: Duration::from_millis(100),
        max: Duration::from_secs(10),
    };

    #[test]
    fn doubles_then_caps() {
        let ceilings: Vec<u128> = (1..=10).map(|a| BACKOFF.ceiling(a).as_millis()).collect();
        assert_eq!(
            ceilings,
            [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000]
        );
        assert_eq!(BACKOFF.ceiling(0), Duration::from_millis(100));
        assert_eq!(BACKOFF.ceiling(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let mut rng = rand::rng();
        for attempts in 1..20 {
            let ceiling = BACKOFF.ceiling(attempts);
            for _ in 0..100 {
                let delay = BACKOFF.delay(attempts, &mut rng);
                assert!(
                    delay >= ceiling / 2 && delay <= ceiling,
                    "{delay:?} for {ceiling:?}"
                );
            }
        }
    }

    #[test]
    fn zero_base_means_no_delay() {
        let none = Backoff {
            base: Duration::ZERO,
            max: Duration::ZERO,
        };
        assert_eq!(none.delay(5, &mut rand::rng()), Duration::ZERO);
    }
}
