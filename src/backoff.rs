//! Every retry delay in the crate: exponential backoff with jitter, so that
//! many clients that failed together do not retry together.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A number in [0, 1) for jitter. Each `RandomState` is seeded differently,
/// which is all the randomness jitter needs.
pub(crate) fn jitter() -> f64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let bits = RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed));
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// `first` doubled for each attempt after the first (attempt 1 waits about
/// `first`), at most `cap`, then scaled by a random factor in [0.5, 1).
pub(crate) fn backoff(first: Duration, attempt: u32, cap: Duration) -> Duration {
    let doubled = first.saturating_mul(1 << (attempt.clamp(1, 16) - 1));
    doubled.min(cap).mul_f64(0.5 + jitter() / 2.0)
}

/// Between renewal retries: from 10 ms, at most a quarter of the renewal
/// period (so that several retries fit before the local deadline).
pub(crate) fn renewal_retry(failures: u32, period: Duration) -> Duration {
    let cap = (period / 4).max(Duration::from_millis(10));
    backoff(Duration::from_millis(10), failures, cap)
}

/// Between the polls of a waiting acquirer that hears no releases: from
/// 10 ms up to `max_poll`.
pub(crate) fn poll(polls: u32, max_poll: Duration) -> Duration {
    backoff(Duration::from_millis(10), polls, max_poll)
}

/// Between reconnections of the release listener: from 50 ms up to 3.2 s.
pub(crate) fn reconnect(failures: u32) -> Duration {
    backoff(
        Duration::from_millis(50),
        failures.saturating_add(1),
        Duration::from_millis(50 << 6),
    )
}

/// Between an observer's tries to have its name subscribed again after
/// the listener was refused (`pglease.observe` found its key held for
/// 2 s, on the connection every waiter and observer shares): from 1 s up
/// to a minute. The observer polls meanwhile.
pub(crate) fn resubscribe(failures: u32) -> Duration {
    backoff(Duration::from_secs(1), failures, Duration::from_secs(60))
}

/// A spread of up to a tenth of `base` (at most 25 ms), added to a wait
/// for an expiry so that many waiters do not arrive at the same instant.
pub(crate) fn spread(base: Duration) -> Duration {
    base.min(Duration::from_millis(250))
        .mul_f64(jitter() / 10.0)
}

/// Between a group member's tries to read its group or join it again:
/// from 50 ms up to 2 s.
pub(crate) fn group_retry(failures: u32) -> Duration {
    backoff(Duration::from_millis(50), failures, Duration::from_secs(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_its_jitter_and_stops_at_the_cap() {
        let ms = Duration::from_millis;
        for attempt in 1..=20 {
            let expected = ms(10)
                .saturating_mul(1 << (attempt.min(16) - 1))
                .min(ms(1000));
            let delay = backoff(ms(10), attempt, ms(1000));
            assert!(
                delay >= expected / 2 && delay < expected,
                "{attempt}: {delay:?}"
            );
        }
        assert!(backoff(ms(10), 0, ms(1000)) < ms(10));
    }

    #[test]
    fn renewal_retries_fit_in_a_quarter_period() {
        let period = Duration::from_secs(1);
        for failures in 1..40 {
            assert!(renewal_retry(failures, period) < period / 4);
        }
        assert!(renewal_retry(3, Duration::ZERO) < Duration::from_millis(10));
    }

    #[test]
    fn jitter_is_in_the_unit_interval_and_varies() {
        let draws: Vec<f64> = (0..64).map(|_| jitter()).collect();
        assert!(draws.iter().all(|j| (0.0..1.0).contains(j)));
        assert!(draws.windows(2).any(|w| w[0] != w[1]));
    }
}
