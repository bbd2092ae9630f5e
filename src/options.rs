//! How a manager holds leases over time: renewal period, safety margin,
//! renewal timeout, and how waiting acquirers learn of releases.

use std::time::Duration;

use crate::error::{Error, Result};

/// Settings of a [`LeaseManager`](crate::LeaseManager) for holding leases
/// and waiting for them. Start from [`ManagerOptions::default()`] and change
/// what you need; [`LeaseManager::with_options`](crate::LeaseManager::with_options)
/// validates them.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagerOptions {
    renew_fraction: f64,
    safety_margin: Option<Duration>,
    renew_timeout: Duration,
    notify: bool,
    max_poll_interval: Duration,
}

impl Default for ManagerOptions {
    fn default() -> Self {
        ManagerOptions {
            renew_fraction: 1.0 / 3.0,
            safety_margin: None,
            renew_timeout: Duration::from_secs(5),
            notify: true,
            max_poll_interval: Duration::from_secs(1),
        }
    }
}

impl ManagerOptions {
    /// A held lease is renewed when this fraction of its TTL has passed
    /// since the last confirmed renewal was sent. Default 1/3, which leaves
    /// room for at least one retry before the local deadline. Must be
    /// greater than 0 and less than 1.
    pub fn renew_fraction(mut self, fraction: f64) -> Self {
        self.renew_fraction = fraction;
        self
    }

    /// How much earlier than "sent + TTL" a held lease stops being trusted
    /// locally, to absorb a difference in clock rate between this machine's
    /// monotonic clock and the database's clock. Default: 2% of the TTL.
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = Some(margin);
        self
    }

    /// Longest wait for one renewal statement (including getting a pooled
    /// connection) before it is abandoned and retried. Default 5 s; never
    /// longer than the time left before the earliest local deadline in the
    /// batch.
    pub fn renew_timeout(mut self, timeout: Duration) -> Self {
        self.renew_timeout = timeout;
        self
    }

    /// Whether waiting acquirers LISTEN for releases (default `true`), on
    /// a connection of the manager's own that also watches the names they
    /// wait for (`pglease.watch`, a session-level advisory lock). Neither
    /// works through a transaction-pooling proxy such as PgBouncer in
    /// transaction mode: before its first LISTEN the manager checks for one
    /// and, if it finds one, does not listen, and waiters poll. Turning this
    /// off makes waiters poll everywhere and skips that check (do so behind
    /// a pooler that hands out server sessions round-robin, which the check
    /// may miss; see docs/library.md, "Through PgBouncer").
    pub fn notify(mut self, notify: bool) -> Self {
        self.notify = notify;
        self
    }

    /// Longest sleep between two attempts of a waiting acquirer that is not
    /// listening for releases (polling fallback). Polls start at 10 ms and
    /// back off, with jitter, up to this. Default 1 s.
    pub fn max_poll_interval(mut self, interval: Duration) -> Self {
        self.max_poll_interval = interval;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if !(self.renew_fraction > 0.0 && self.renew_fraction < 1.0) {
            return Err(Error::invalid(
                "renew_fraction",
                format!(
                    "must be greater than 0 and less than 1, got {}",
                    self.renew_fraction
                ),
            ));
        }
        if self.renew_timeout.is_zero() {
            return Err(Error::invalid("renew_timeout", "must be greater than zero"));
        }
        if self.max_poll_interval.is_zero() {
            return Err(Error::invalid(
                "max_poll_interval",
                "must be greater than zero",
            ));
        }
        Ok(())
    }

    /// The timing of one held lease with `ttl`, checked against the TTL.
    pub(crate) fn timing(&self, ttl: Duration) -> Result<Timing> {
        let margin = self.safety_margin.unwrap_or(ttl / 50);
        let period = ttl.mul_f64(self.renew_fraction);
        // Fire the loss signal a little before the deadline, so that a
        // timer that wakes late still fires by the deadline.
        let early = (margin / 2).min(Duration::from_millis(250));
        // The renewal must be due before the loss would fire, or the lease
        // would be given up before anyone tried to keep it.
        if margin >= ttl || period + early >= ttl - margin {
            return Err(Error::invalid(
                "safety_margin",
                format!(
                    "{margin:?} leaves no time to renew a lease of {ttl:?} every {period:?}: \
                     the margin plus half the margin (at most 250 ms) must be less than \
                     the TTL minus the renewal period"
                ),
            ));
        }
        Ok(Timing {
            ttl,
            period,
            margin,
            early,
        })
    }

    /// How late an acquisition's answer may come (after its statement was
    /// sent) before the lease is confirmed with an immediate renewal: one
    /// renewal period. A later answer has spent most of the local trust
    /// window that started at the send (it waited in the database, or the
    /// process was paused), though the database gave the lease a full TTL.
    pub(crate) fn confirm_after(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.renew_fraction)
    }

    /// The fraction of a TTL after which a held lease is renewed.
    pub fn renew_fraction_value(&self) -> f64 {
        self.renew_fraction
    }

    /// The safety margin set with [`ManagerOptions::safety_margin`];
    /// `None` means the default, 2 % of each lease's TTL.
    pub fn safety_margin_value(&self) -> Option<Duration> {
        self.safety_margin
    }

    /// How long a renewal statement may go unanswered.
    pub fn renew_timeout_value(&self) -> Duration {
        self.renew_timeout
    }

    /// Whether waiting acquisitions listen for releases.
    pub fn notify_enabled(&self) -> bool {
        self.notify
    }

    /// The longest pause between polls of a waiting acquisition.
    pub fn max_poll(&self) -> Duration {
        self.max_poll_interval
    }
}

/// The timing of one held lease (see the README's timing model).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) ttl: Duration,
    pub(crate) period: Duration,
    pub(crate) margin: Duration,
    pub(crate) early: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fraction_bounds() {
        assert!(ManagerOptions::default().validate().is_ok());
        for bad in [0.0, 1.0, -0.5, 1.5, f64::NAN] {
            assert!(
                ManagerOptions::default()
                    .renew_fraction(bad)
                    .validate()
                    .is_err()
            );
        }
    }

    #[test]
    fn margin_must_leave_time_to_renew() {
        let ttl = Duration::from_secs(9);
        let t = ManagerOptions::default().timing(ttl).expect("defaults");
        assert_eq!(t.period, Duration::from_secs(3));
        assert_eq!(t.margin, Duration::from_millis(180));
        let too_big = ManagerOptions::default().safety_margin(Duration::from_secs(6));
        assert!(too_big.timing(ttl).is_err());
        let at_ttl = ManagerOptions::default().safety_margin(ttl);
        assert!(at_ttl.timing(ttl).is_err());
    }
}
