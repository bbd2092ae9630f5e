//! The waiter's decision between two attempts, clock-free: from what the
//! last attempt saw (on the database's clock) and what woke the waiter
//! before, how long to nap and on which holder's session to block. The
//! loop in `mod.rs` carries it out (timers, the listener, the server-side
//! wait) and draws the jitter.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::backoff;

/// Quick looks after a session-bound holder's session ended, before the
/// holder is taken to be one that does not hold its key (another session
/// took it): its exit takes microseconds.
const EXIT_POLLS: u32 = 8;

/// What the last attempt saw, and what the waiter knows besides.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    /// The holder's expiry, and when the database decided (its clock).
    pub(crate) expires_at: DateTime<Utc>,
    pub(crate) checked_at: DateTime<Utc>,
    /// No grant before this (the grant delay after a failover).
    pub(crate) delayed_until: Option<DateTime<Utc>>,
    /// Ended, but pinned by a transaction the database could not end.
    pub(crate) pinned: bool,
    /// The session a session-bound holder's lease is bound to.
    pub(crate) holder_session: Option<i32>,
    /// The session whose end woke the waiter last, if any.
    pub(crate) woken_by: Option<i32>,
    /// Whether a release of the name would be heard (watched, and the
    /// listener connected).
    pub(crate) heard: bool,
}

/// The waiter's counts across naps (each backoff starts again from its
/// first step when reset).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Polls for an ended, pinned lease or without a listener.
    pub(crate) polls: u32,
    /// Quick looks after a session-bound holder's session ended.
    pub(crate) exit_polls: u32,
}

/// How long to nap before the next attempt (a release heard, or a blocked
/// holder's session ending, wakes the waiter sooner).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nap {
    /// Until the grant delay ends (database time left), spread.
    GrantDelay(Duration),
    /// A quick look again: the holder's session is ending (backoff from
    /// 1 ms, step `attempt`, up to 50 ms), at most until `expiry`.
    ExitPoll { attempt: u32, expiry: Duration },
    /// A poll (backoff from 10 ms, step `attempt`, up to the manager's
    /// longest poll), at most until `expiry` if given.
    Poll {
        attempt: u32,
        expiry: Option<Duration>,
    },
    /// Until the lease expires, spread: a release wakes the waiter sooner.
    Expiry(Duration),
}

impl Nap {
    /// The nap as a duration, its jitter drawn.
    pub(crate) fn duration(self, max_poll: Duration) -> Duration {
        match self {
            Nap::GrantDelay(left) | Nap::Expiry(left) => left + backoff::spread(left),
            Nap::ExitPoll { attempt, expiry } => {
                backoff::backoff(Duration::from_millis(1), attempt, Duration::from_millis(50))
                    .min(expiry)
            }
            Nap::Poll { attempt, expiry } => {
                let poll = backoff::poll(attempt, max_poll);
                expiry.map_or(poll, |expiry| expiry.min(poll))
            }
        }
    }
}

/// The plan for one nap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) nap: Nap,
    /// Block in the server on this holder session's key meanwhile (its
    /// end wakes the waiter).
    pub(crate) block_on: Option<i32>,
}

/// Database time from `from` to `to`, plus a millisecond (so that the
/// next attempt comes after it), as a duration here: no clocks compared.
fn left(from: DateTime<Utc>, to: DateTime<Utc>) -> Duration {
    (to - from).to_std().unwrap_or_default() + Duration::from_millis(1)
}

/// The next nap, given what was seen; updates `counts`.
pub(crate) fn plan(seen: &Seen, counts: &mut Counts) -> Plan {
    let until_expiry = left(seen.checked_at, seen.expires_at);
    // A session-bound holder's end wakes the waiter too (blocking in the
    // server), unless it just did: then the session is in its last
    // microseconds (its locks go before its entry in pg_stat_activity),
    // or another session holds its key; a few quick looks, then wait for
    // it as for an unbound holder.
    let ending = seen.holder_session.filter(|_| !seen.pinned);
    let racing_exit = ending.is_some() && ending == seen.woken_by && counts.exit_polls < EXIT_POLLS;
    let block_on = ending.filter(|_| ending != seen.woken_by);
    let nap = if let Some(until) = seen.delayed_until {
        Nap::GrantDelay(left(seen.checked_at, until))
    } else if racing_exit {
        counts.exit_polls = counts.exit_polls.saturating_add(1);
        Nap::ExitPoll {
            attempt: counts.exit_polls,
            expiry: until_expiry,
        }
    } else if seen.pinned {
        // No release or expiry will announce when it lets go.
        counts.polls = counts.polls.saturating_add(1);
        Nap::Poll {
            attempt: counts.polls,
            expiry: None,
        }
    } else if seen.heard {
        Nap::Expiry(until_expiry)
    } else {
        counts.polls = counts.polls.saturating_add(1);
        Nap::Poll {
            attempt: counts.polls,
            expiry: Some(until_expiry),
        }
    };
    Plan { nap, block_on }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).expect("a time")
    }

    /// A lease held until 5 s after the decision, nothing else known.
    fn held() -> Seen {
        Seen {
            expires_at: at(5_000),
            checked_at: at(0),
            delayed_until: None,
            pinned: false,
            holder_session: None,
            woken_by: None,
            heard: false,
        }
    }

    const EXPIRY: Duration = Duration::from_millis(5_001);

    #[test]
    fn a_heard_waiter_naps_until_the_expiry_and_an_unheard_one_polls() {
        let mut counts = Counts::default();
        let heard = plan(
            &Seen {
                heard: true,
                ..held()
            },
            &mut counts,
        );
        assert_eq!(heard.nap, Nap::Expiry(EXPIRY));
        assert_eq!(counts, Counts::default());
        for attempt in 1..=3 {
            let unheard = plan(&held(), &mut counts);
            assert_eq!(
                unheard.nap,
                Nap::Poll {
                    attempt,
                    expiry: Some(EXPIRY)
                }
            );
        }
        assert_eq!(heard.block_on, None);
    }

    #[test]
    fn the_grant_delay_comes_first() {
        let seen = Seen {
            delayed_until: Some(at(20_000)),
            pinned: true,
            heard: true,
            ..held()
        };
        let mut counts = Counts::default();
        let plan = plan(&seen, &mut counts);
        assert_eq!(plan.nap, Nap::GrantDelay(Duration::from_millis(20_001)));
        assert_eq!(counts, Counts::default());
    }

    #[test]
    fn a_pinned_lease_is_polled_without_an_expiry_bound_and_blocks_on_nobody() {
        let seen = Seen {
            pinned: true,
            holder_session: Some(42),
            heard: true,
            expires_at: at(-10),
            ..held()
        };
        let mut counts = Counts::default();
        let plan = plan(&seen, &mut counts);
        assert_eq!(
            plan.nap,
            Nap::Poll {
                attempt: 1,
                expiry: None
            }
        );
        assert_eq!(plan.block_on, None);
    }

    #[test]
    fn a_session_bound_holder_is_blocked_on_then_raced_after_it_woke_us() {
        let bound = Seen {
            holder_session: Some(42),
            heard: true,
            ..held()
        };
        let mut counts = Counts::default();
        let first = plan(&bound, &mut counts);
        assert_eq!(first.block_on, Some(42));
        assert_eq!(first.nap, Nap::Expiry(EXPIRY));
        // Its end woke us and it still holds: quick looks, not blocking
        // on it again, eight of them.
        let woke = Seen {
            woken_by: Some(42),
            ..bound
        };
        for attempt in 1..=EXIT_POLLS {
            let racing = plan(&woke, &mut counts);
            assert_eq!(racing.block_on, None);
            assert_eq!(
                racing.nap,
                Nap::ExitPoll {
                    attempt,
                    expiry: EXPIRY
                }
            );
        }
        // Still there: another session holds its key; wait as for an
        // unbound holder.
        let after = plan(&woke, &mut counts);
        assert_eq!(after.nap, Nap::Expiry(EXPIRY));
        assert_eq!(after.block_on, None);
        // A new holder's session is blocked on again.
        let other = plan(
            &Seen {
                holder_session: Some(7),
                ..woke
            },
            &mut counts,
        );
        assert_eq!(other.block_on, Some(7));
    }

    #[test]
    fn naps_are_bounded_by_the_expiry() {
        let max_poll = Duration::from_secs(30);
        for attempt in [1, 5, 20] {
            let poll = Nap::Poll {
                attempt,
                expiry: Some(Duration::from_millis(3)),
            };
            assert!(poll.duration(max_poll) <= Duration::from_millis(3));
            let exit = Nap::ExitPoll {
                attempt,
                expiry: Duration::from_millis(2),
            };
            assert!(exit.duration(max_poll) <= Duration::from_millis(2));
        }
        let expiry = Nap::Expiry(Duration::from_secs(1)).duration(max_poll);
        assert!(expiry >= Duration::from_secs(1) && expiry <= Duration::from_millis(1_025));
    }
}
