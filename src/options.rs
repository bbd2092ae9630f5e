//! How to acquire a lease ([`AcquireOptions`]: TTL, holder, wait, value,
//! limit), and how a manager holds leases over time ([`ManagerOptions`]:
//! renewal period, safety margin, renewal timeout, and how waiting
//! acquirers learn of releases). Builders with one getter convention
//! (`get_*`); values checked before anything is sent.

use std::time::Duration;

use sqlx::postgres::types::PgInterval;

use crate::error::{Error, Result};
use crate::human::Human;
use crate::lease::interval;
use crate::limits::{MAX_NAME_BYTES, check_limit, check_text, check_value};

/// How to acquire a lease: for how long (the TTL, required), for whom
/// (default: this host and process), and how long to wait for the current
/// holder (default: not at all, one attempt).
///
/// ```
/// use std::time::Duration;
/// use pglease::AcquireOptions;
///
/// let how = AcquireOptions::ttl(Duration::from_secs(30))
///     .holder("worker-7")
///     .wait(Duration::from_secs(5));
/// assert_eq!(how.get_wait(), Duration::from_secs(5));
/// ```
///
/// The TTL and the wait are named, so they cannot be swapped by position:
///
/// ```compile_fail
/// # async fn f(leases: pglease::LeaseManager) {
/// use std::time::Duration;
/// // The positional form of earlier versions does not compile:
/// leases.hold("job", "worker-7", Duration::from_secs(5), Duration::from_secs(30)).await;
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireOptions {
    ttl: Duration,
    holder: Option<String>,
    max_wait: Duration,
    value: Option<String>,
    limit: Option<u32>,
    session_bound: bool,
    fair: bool,
    max_waiting: Option<u32>,
    shared: bool,
}

impl AcquireOptions {
    /// Acquire for `ttl`: the lease expires `ttl` after the database
    /// grants it (or after each renewal), on the database clock. At most
    /// [`MAX_TTL`](crate::limits::MAX_TTL), at least 1 µs.
    pub fn ttl(ttl: Duration) -> AcquireOptions {
        AcquireOptions {
            ttl,
            holder: None,
            max_wait: Duration::ZERO,
            value: None,
            limit: None,
            session_bound: false,
            fair: false,
            max_waiting: None,
            shared: false,
        }
    }

    /// Who acquires, as the status view and other holders see it (1 to
    /// [`MAX_NAME_BYTES`] bytes). Default:
    /// [`AcquireOptions::default_holder`].
    pub fn holder(mut self, holder: impl Into<String>) -> AcquireOptions {
        self.holder = Some(holder.into());
        self
    }

    /// Wait up to `max_wait` for the current holder to release the lease
    /// or let it expire. Default: zero, one attempt.
    pub fn wait(mut self, max_wait: Duration) -> AcquireOptions {
        self.max_wait = max_wait;
        self
    }

    /// Publish `value` with the lease once acquired (at most
    /// [`MAX_VALUE_BYTES`](crate::limits::MAX_VALUE_BYTES)), in the same statement
    /// as the acquisition: anyone reads it in the status view
    /// ([`LeaseStatus::value`](crate::LeaseStatus::value)) until the next acquisition, which starts
    /// without one. Default: none. Change it later with
    /// [`LeaseManager::set_value`](crate::LeaseManager::set_value).
    pub fn value(mut self, value: impl Into<String>) -> AcquireOptions {
        self.value = Some(value.into());
        self
    }

    /// The value to publish, if any.
    pub fn get_value(&self) -> Option<&str> {
        self.value.as_deref()
    }

    /// A counted lease: up to `limit` holders of the name at once (1 to
    /// [`MAX_SLOTS`](crate::limits::MAX_SLOTS)), each with a token and expiry of its
    /// own. The lease acquired is one of the name's slots, `NAME#k`
    /// ([`Lease::name`](crate::Lease::name) says which): renew, release and fence with it as
    /// with any lease. Every holder of the name must use the same limit.
    /// A counted acquisition that waits polls (backing off up to
    /// [`ManagerOptions::max_poll_interval`](crate::ManagerOptions::max_poll_interval),
    /// never past the first slot's expiry) instead of listening for
    /// releases. See docs/design.md, "Counted leases".
    pub fn limit(mut self, limit: u32) -> AcquireOptions {
        self.limit = Some(limit);
        self
    }

    /// A session-bound lease: it also ends when the manager's server
    /// session for such leases ends (the process died, the connection
    /// dropped, the backend was terminated), and then another acquirer
    /// takes it at once instead of after the TTL, fenced as ever (a new
    /// token; renewing the old one fails). Default: false.
    ///
    /// The manager acquires session-bound leases on one connection of its
    /// own, opened beside the pool on first use (every one of them ends
    /// with it). The trade-off: a network interruption that ends that
    /// connection also ends the leases, even one shorter than the TTL.
    /// Through a transaction pooler the server session is not the
    /// manager's, so the lease would outlive the process: connect such
    /// holders to PostgreSQL directly (or through session pooling). A
    /// waiter for a session-bound lease blocks in the server for the
    /// holder's session to end, on a connection of its own while it
    /// waits. See docs/design.md, "Session-bound leases".
    pub fn session_bound(mut self, session_bound: bool) -> AcquireOptions {
        self.session_bound = session_bound;
        self
    }

    /// First come, first served: a waiting acquisition joins the line of
    /// the name (`pglease.enqueue`) after its first refused attempt and is
    /// granted the lease in its turn; an acquisition without a place in
    /// line (fair or not) is refused while anyone waits in it. A waiter
    /// whose process or connection is gone is skipped at once, one that
    /// stops trying (frozen) once its place's TTL (this TTL) passes; the
    /// waiter keeps its place with an attempt at least every third of the
    /// TTL. Not for counted leases. Default: false (waiters race on each
    /// release). See docs/design.md, "First come, first served".
    pub fn fair(mut self, fair: bool) -> AcquireOptions {
        self.fair = fair;
        self
    }

    /// With [`AcquireOptions::fair`]: join the line only if fewer than `n`
    /// wait in it (1 to [`MAX_WAITING`](crate::limits::MAX_WAITING), the
    /// default); otherwise the acquisition fails with
    /// [`Error::LineFull`](crate::Error::LineFull).
    pub fn max_waiting(mut self, n: u32) -> AcquireOptions {
        self.max_waiting = Some(n);
        self
    }

    /// Shared: granted beside other shared holders of the name, each with
    /// a token of its own, while no exclusive holder holds it
    /// (`pglease.acquire_shared`); an exclusive acquisition waits until
    /// every shared holder has ended. Writer preference: while an
    /// exclusive acquisition waits for the shared holders, new shared
    /// acquisitions wait behind it. A shared holder renews and releases
    /// as any holder; its fenced transactions
    /// ([`LeaseManager::begin_fenced`](crate::LeaseManager::begin_fenced))
    /// check its token with `pglease.assert_shared`, which keeps every
    /// exclusive acquisition from committing until they end, and they may
    /// not write to protected tables. Not with a limit, a session-bound
    /// lease, a place in line or a value. Default: false (exclusive). See
    /// docs/design.md, "Shared leases".
    pub fn shared(mut self, shared: bool) -> AcquireOptions {
        self.shared = shared;
        self
    }

    /// Whether the acquisition is shared.
    pub fn get_shared(&self) -> bool {
        self.shared
    }

    /// Whether waiting is first come, first served.
    pub fn get_fair(&self) -> bool {
        self.fair
    }

    /// The longest line this acquisition joins, if bounded below the
    /// schema's limit.
    pub fn get_max_waiting(&self) -> Option<u32> {
        self.max_waiting
    }

    /// Whether the lease is to be session-bound.
    pub fn get_session_bound(&self) -> bool {
        self.session_bound
    }

    /// The counted lease's limit, if any.
    pub fn get_limit(&self) -> Option<u32> {
        self.limit
    }

    /// The TTL.
    pub fn get_ttl(&self) -> Duration {
        self.ttl
    }

    /// The holder name that will be used.
    pub fn get_holder(&self) -> std::borrow::Cow<'_, str> {
        match &self.holder {
            Some(holder) => std::borrow::Cow::Borrowed(holder),
            None => std::borrow::Cow::Owned(AcquireOptions::default_holder()),
        }
    }

    /// The longest wait.
    pub fn get_wait(&self) -> Duration {
        self.max_wait
    }

    /// Checks an acquisition of `name` as this says (name, holder, value
    /// and TTL) before anything is sent; the TTL as an interval.
    pub(crate) fn check(&self, name: &str) -> Result<PgInterval> {
        check_text("name", name)?;
        if let Some(limit) = self.limit {
            check_limit(name, limit)?;
        }
        check_text("holder", &self.get_holder())?;
        if let Some(value) = self.get_value() {
            check_value(value)?;
        }
        if self.shared {
            let other = if self.limit.is_some() {
                Some("a limit (a counted lease)")
            } else if self.session_bound {
                Some("a session-bound lease")
            } else if self.fair {
                Some("first come, first served (a shared acquisition takes no place in line)")
            } else if self.value.is_some() {
                Some("a value (shared holders publish none)")
            } else {
                None
            };
            if let Some(other) = other {
                return Err(Error::invalid(
                    "shared",
                    format!("a shared acquisition cannot have {other}"),
                ));
            }
        }
        if self.fair && self.limit.is_some() {
            return Err(Error::invalid(
                "fair",
                "a counted lease has no line (its slots are names of their own)",
            ));
        }
        if let Some(n) = self.max_waiting
            && !(1..=crate::limits::MAX_WAITING).contains(&n)
        {
            return Err(Error::invalid(
                "max_waiting",
                format!(
                    "must be between 1 and {}, got {n}",
                    crate::limits::MAX_WAITING
                ),
            ));
        }
        interval(self.ttl)
    }

    /// The holder name used when none is given: `HOST:PID`, this machine's
    /// host name and this process's id, so that the status view tells where a
    /// holder runs.
    pub fn default_holder() -> String {
        static HOLDER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        HOLDER
            .get_or_init(|| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
                    .filter(|h| !h.is_empty())
                    .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
                    .or_else(|| std::env::var("COMPUTERNAME").ok().filter(|h| !h.is_empty()))
                    .unwrap_or_else(|| "localhost".to_owned());
                let mut holder = format!("{host}:{}", std::process::id());
                // A host name is at most 253 bytes; keep the whole within the
                // limit (on a character boundary).
                while holder.len() > MAX_NAME_BYTES {
                    holder.remove(0);
                }
                holder
            })
            .clone()
    }
}

/// What [`LeaseManager::hand_over`](crate::LeaseManager::hand_over) does
/// when no holder of the successor's name waits in the lease's line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WithoutSuccessor {
    /// Release the lease, as
    /// [`release`](crate::LeaseManager::release) would.
    Release,
    /// Keep it: nothing changes, and the lease stays valid under its
    /// token.
    Keep,
}

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
    prepared_statements: Option<bool>,
}

impl Default for ManagerOptions {
    fn default() -> Self {
        ManagerOptions {
            renew_fraction: 1.0 / 3.0,
            safety_margin: None,
            renew_timeout: Duration::from_secs(5),
            notify: true,
            max_poll_interval: Duration::from_secs(1),
            prepared_statements: None,
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

    /// Whether acquire, renew and release go to the server as prepared
    /// statements (the extended protocol, planned once per connection)
    /// rather than as text with their values written in (the simple
    /// protocol, parsed and planned on every call, but accepted by every
    /// pooler). By default the manager decides: it starts with text and,
    /// after its first 8 such calls, checks once in the background, on two
    /// connections of its own, whether a transaction pooler shares server
    /// sessions between clients (as for [`ManagerOptions::notify`]), and
    /// prepares only if none does. `true`
    /// prepares at once without the check (a direct connection, or
    /// PgBouncer 1.21 or later with `max_prepared_statements` set);
    /// `false` never prepares and skips the check (behind a pooler that
    /// hands out server sessions round-robin, which the check may miss).
    /// A prepared statement that the server session turns out not to have
    /// (SQLSTATE 26000, 42P05 or 08P01, as behind an undetected pooler)
    /// makes the manager go back to text for good and send that call again
    /// as text: the statement did not run.
    pub fn prepared_statements(mut self, prepared: bool) -> Self {
        self.prepared_statements = Some(prepared);
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
                    "{} leaves no time to renew a lease of {} every {}: the margin plus half \
                     the margin (at most 250 ms) must be less than the TTL minus the renewal \
                     period",
                    Human(margin),
                    Human(ttl),
                    Human(period)
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
    pub fn get_renew_fraction(&self) -> f64 {
        self.renew_fraction
    }

    /// The safety margin set with [`ManagerOptions::safety_margin`];
    /// `None` means the default, 2 % of each lease's TTL.
    pub fn get_safety_margin(&self) -> Option<Duration> {
        self.safety_margin
    }

    /// How long a renewal statement may go unanswered.
    pub fn get_renew_timeout(&self) -> Duration {
        self.renew_timeout
    }

    /// Whether waiting acquisitions listen for releases.
    pub fn get_notify(&self) -> bool {
        self.notify
    }

    /// The choice set with [`ManagerOptions::prepared_statements`]; `None`
    /// means the default, decided by the manager's check for a pooler.
    pub fn get_prepared_statements(&self) -> Option<bool> {
        self.prepared_statements
    }

    /// The longest pause between polls of a waiting acquisition.
    pub fn get_max_poll_interval(&self) -> Duration {
        self.max_poll_interval
    }
}

/// The timing of one held lease (see docs/library.md, "The timing model").
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
    fn the_default_holder_names_this_host_and_process() {
        let holder = AcquireOptions::default_holder();
        assert!(
            holder.ends_with(&format!(":{}", std::process::id())),
            "{holder}"
        );
        assert!(holder.len() <= MAX_NAME_BYTES && holder.len() > 2);
        assert_eq!(
            AcquireOptions::ttl(Duration::from_secs(1)).get_holder(),
            holder
        );
    }

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
