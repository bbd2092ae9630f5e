//! The waiter's decisions, clock-free: what to do with an attempt's
//! outcome; between two attempts, from what the last one saw (on the
//! database's clock) and what woke the waiter before, how long to nap and
//! on which holder's session to block; and what a message from the
//! release listener means to it. The loop in `mod.rs` carries them out
//! (timers, the listener, the server-side wait) and draws the jitter.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::{Attempt, Refusal};
use crate::backoff;
use crate::error::{Error, Result};

/// Why an attempt did not acquire, as telemetry counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Refused for the grant delay after a failover.
    Delayed,
    /// Ended, but pinned by a transaction the database could not end.
    Pinned,
    /// Free, but others wait in line before this acquisition.
    InLine,
    /// Held by another holder.
    Held,
}

impl Refused {
    /// The refusal, given whether a grant delay refused it, whether the
    /// lease has ended, and whether others wait in line before this
    /// acquisition: a grant delay refuses any lease, held or not; the
    /// line refuses only a lease that has ended.
    pub(crate) fn of(delayed: bool, ended: bool, in_line: bool) -> Refused {
        match (delayed, ended, in_line) {
            (true, _, _) => Refused::Delayed,
            (false, true, true) => Refused::InLine,
            (false, true, false) => Refused::Pinned,
            (false, false, _) => Refused::Held,
        }
    }

    /// Its label in telemetry.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refused::Delayed => "delayed",
            Refused::Pinned => "pinned",
            Refused::InLine => "in_line",
            Refused::Held => "held",
        }
    }
}

/// What the waiter does after an attempt that would win a `W` (a lease,
/// or a set's leases).
#[derive(Debug)]
pub(crate) enum Step<W> {
    /// Acquired: hand it over.
    Take { won: W, sent: Instant },
    /// Attempt again at once: acquired so late that it was lost before
    /// its confirming renewal, and there is time.
    Retry,
    /// Not acquired, and there is time: nap, then attempt again.
    Wait(Refusal),
    /// Not acquired, and out of time: report the refusal.
    Refuse(Refusal),
    /// Report the error.
    Fail(Error),
}

/// The step after an attempt with `outcome`; `out_of_time` if the
/// waiter's deadline had passed when the outcome came.
pub(crate) fn step<W>(outcome: Result<Attempt<W>>, out_of_time: bool) -> Step<W> {
    match outcome {
        Ok(Attempt::Acquired { won, sent }) => Step::Take { won, sent },
        Ok(Attempt::Refused(refusal)) if out_of_time => Step::Refuse(refusal),
        Ok(Attempt::Refused(refusal)) => Step::Wait(refusal),
        Err(Error::Lost { .. }) if !out_of_time => Step::Retry,
        Err(error) => Step::Fail(error),
    }
}

/// The instant an acquired term is counted from, as if the acquisition
/// had granted the whole `ttl`: its statement's send, moved earlier by
/// what the term the database granted (`expires_at - checked_at`, on its
/// clock, as the statement saw it) falls short of `ttl`. The statement ran
/// after its send, so the database's expiry comes after this instant plus
/// `ttl` (the timing model's reasoning, unchanged). An acquisition's term
/// is short by microseconds (the database reads its clock twice); a term
/// handed over runs from the handover, before the successor's statement;
/// an expired one is short by more than `ttl`. `None` if the instant would
/// precede the process's clock.
pub(crate) fn counted_from(
    sent: Instant,
    expires_at: DateTime<Utc>,
    checked_at: DateTime<Utc>,
    ttl: Duration,
) -> Option<Instant> {
    let granted = (expires_at - checked_at).to_std().unwrap_or(Duration::ZERO);
    sent.checked_sub(ttl.saturating_sub(granted))
}

/// How long after the expiry of the holder seen last (`expired`, if a
/// holder was seen) a lease acquired at `acquired_at` was taken over;
/// `None` if it was not (a release ends a lease sooner), both on the
/// database's clock.
pub(crate) fn takeover_delay(
    expired: Option<DateTime<Utc>>,
    acquired_at: DateTime<Utc>,
) -> Option<Duration> {
    (acquired_at - expired?).to_std().ok()
}

/// What a message from the release listener means to a waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Another name was released: nap on.
    Other,
    /// This name was released: attempt now.
    This,
    /// The listener connected again (its watches are new), or this waiter
    /// lagged and may have missed that: watch again.
    Rewatch,
    /// The listener is gone: nothing more will be heard.
    Closed,
}

/// What `message` (a released name, or `None` when the listener connected
/// again) means to a waiter for `name`.
pub(crate) fn heard(message: &std::result::Result<Option<String>, RecvError>, name: &str) -> Heard {
    match message {
        Ok(Some(released)) if released != name => Heard::Other,
        Ok(Some(_)) => Heard::This,
        Ok(None) | Err(RecvError::Lagged(_)) => Heard::Rewatch,
        Err(RecvError::Closed) => Heard::Closed,
    }
}

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
pub(crate) struct NextNap {
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
pub(crate) fn next_nap(seen: &Seen, counts: &mut Counts) -> NextNap {
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
    NextNap { nap, block_on }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_term_is_counted_from_the_send_less_its_shortfall() {
        let at = DateTime::<Utc>::UNIX_EPOCH;
        let ttl = Duration::from_secs(60);
        let sent = Instant::now() + Duration::from_secs(3600);
        let micros = chrono::Duration::microseconds;
        // A full term, or longer: from the send.
        let full = at + chrono::Duration::seconds(60) + micros(3);
        assert_eq!(counted_from(sent, full, at, ttl), Some(sent));
        // The database read its clock twice: microseconds earlier.
        let read_twice = at + chrono::Duration::seconds(60) - micros(4);
        assert_eq!(
            counted_from(sent, read_twice, at, ttl),
            Some(sent - Duration::from_micros(4))
        );
        // Handed over 2 ms before the successor's statement ran.
        let handed = at + chrono::Duration::seconds(60) - chrono::Duration::milliseconds(2);
        assert_eq!(
            counted_from(sent, handed, at, ttl),
            Some(sent - Duration::from_millis(2))
        );
        // Handed over with 2 s left: counted as if sent 58 s earlier.
        let short = at + chrono::Duration::seconds(2);
        assert_eq!(
            counted_from(sent, short, at, ttl),
            Some(sent - Duration::from_secs(58))
        );
        // Already over: a whole TTL earlier, at least.
        assert_eq!(
            counted_from(sent, at - micros(1), at, ttl),
            Some(sent - ttl)
        );
    }
    use super::*;
    use crate::error::LossReason;
    use crate::lease::Lease;
    use crate::token::Token;

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
        let heard = next_nap(
            &Seen {
                heard: true,
                ..held()
            },
            &mut counts,
        );
        assert_eq!(heard.nap, Nap::Expiry(EXPIRY));
        assert_eq!(counts, Counts::default());
        for attempt in 1..=3 {
            let unheard = next_nap(&held(), &mut counts);
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
        let plan = next_nap(&seen, &mut counts);
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
        let plan = next_nap(&seen, &mut counts);
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
        let first = next_nap(&bound, &mut counts);
        assert_eq!(first.block_on, Some(42));
        assert_eq!(first.nap, Nap::Expiry(EXPIRY));
        // Its end woke us and it still holds: quick looks, not blocking
        // on it again, eight of them.
        let woke = Seen {
            woken_by: Some(42),
            ..bound
        };
        for attempt in 1..=EXIT_POLLS {
            let racing = next_nap(&woke, &mut counts);
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
        let after = next_nap(&woke, &mut counts);
        assert_eq!(after.nap, Nap::Expiry(EXPIRY));
        assert_eq!(after.block_on, None);
        // A new holder's session is blocked on again.
        let other = next_nap(
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

    /// What an attempt saw of `held()`'s lease.
    fn refused() -> Refusal {
        Refusal {
            holder: Some("other".to_owned()),
            expires_at: at(5_000),
            checked_at: at(0),
            note: None,
            slot: "job".to_owned(),
            holder_session: None,
            ahead: None,
            fair: false,
            delayed_until: None,
        }
    }

    #[test]
    fn an_acquired_lease_is_taken_even_out_of_time() {
        let lease = Lease::new("job", "me".to_owned(), Token::issued(7), at(5_000), at(0));
        let sent = Instant::now();
        for out_of_time in [false, true] {
            let outcome = Ok(Attempt::Acquired {
                won: lease.clone(),
                sent,
            });
            match step(outcome, out_of_time) {
                Step::Take {
                    won: taken,
                    sent: at,
                } => {
                    assert_eq!(taken, lease);
                    assert_eq!(at, sent);
                }
                other => panic!("not taken: {other:?}"),
            }
        }
    }

    #[test]
    fn a_refusal_is_waited_out_while_there_is_time_then_reported() {
        match step::<Lease>(Ok(Attempt::Refused(refused())), false) {
            Step::Wait(refusal) => assert_eq!(refusal, refused()),
            other => panic!("not waited out: {other:?}"),
        }
        match step::<Lease>(Ok(Attempt::Refused(refused())), true) {
            Step::Refuse(refusal) => assert_eq!(refusal, refused()),
            other => panic!("not reported: {other:?}"),
        }
    }

    #[test]
    fn a_lease_lost_before_its_confirmation_is_retried_while_there_is_time() {
        let lost = || Error::Lost {
            name: "job".to_owned(),
            token: Token::issued(7),
            reason: LossReason::Expired,
        };
        assert!(matches!(step::<Lease>(Err(lost()), false), Step::Retry));
        assert!(matches!(
            step::<Lease>(Err(lost()), true),
            Step::Fail(Error::Lost { .. })
        ));
    }

    #[test]
    fn other_errors_are_reported_at_once() {
        for out_of_time in [false, true] {
            assert!(matches!(
                step::<Lease>(Err(Error::ShutDown), out_of_time),
                Step::Fail(Error::ShutDown)
            ));
        }
    }

    #[test]
    fn a_grant_delay_names_the_refusal_before_an_ended_lease() {
        assert_eq!(Refused::of(true, true, true), Refused::Delayed);
        assert_eq!(Refused::of(true, false, false), Refused::Delayed);
        assert_eq!(Refused::of(false, true, false), Refused::Pinned);
        assert_eq!(Refused::of(false, true, true), Refused::InLine);
        assert_eq!(Refused::of(false, false, false), Refused::Held);
        // Held, whoever waits in line: the holder's expiry is what counts.
        assert_eq!(Refused::of(false, false, true), Refused::Held);
        let labels = [Refused::Delayed, Refused::Pinned, Refused::Held].map(Refused::label);
        assert_eq!(labels, ["delayed", "pinned", "held"]);
    }

    #[test]
    fn a_takeover_delay_counts_from_a_seen_expiry_only() {
        assert_eq!(
            takeover_delay(Some(at(5_000)), at(5_250)),
            Some(Duration::from_millis(250))
        );
        // Released (no holder seen), or nobody seen at all.
        assert_eq!(takeover_delay(None, at(5_250)), None);
        // Taken before the expiry seen: a release ended the lease sooner.
        assert_eq!(takeover_delay(Some(at(5_000)), at(4_000)), None);
    }

    #[test]
    fn a_waiter_hears_its_own_release_and_listener_changes() {
        let heard = |message| heard(&message, "job");
        assert_eq!(heard(Ok(Some("other".to_owned()))), Heard::Other);
        assert_eq!(heard(Ok(Some("job".to_owned()))), Heard::This);
        assert_eq!(heard(Ok(None)), Heard::Rewatch);
        assert_eq!(heard(Err(RecvError::Lagged(3))), Heard::Rewatch);
        assert_eq!(heard(Err(RecvError::Closed)), Heard::Closed);
    }
}
