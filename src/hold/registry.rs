//! The renewal registry: every lease a manager holds with background
//! renewal, when each is due, and what the last renewal statement did to
//! it. Planning and applying take the current instant as an argument and do
//! no I/O, so their logic is tested without a database or a clock
//! (`hold/tests.rs`); the renewal task (`renewer.rs`) does the sending.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::state::HeldState;
use crate::backoff;
use crate::error::{Error, LossReason};
use crate::lease::Lease;
use crate::token::Token;

/// A held lease's key: its name and token.
pub(crate) type Key = (String, i64);

/// Planning looks at most this far ahead when nothing is due.
const HORIZON: Duration = Duration::from_secs(3600);

/// At most this many leases per renewal statement: a manager holding more
/// sends several, one after the other, the leases due soonest first. One
/// such statement takes about 40 ms of server time on a small machine
/// (docs/benchmark.md, "Many leases"), so that no statement holds its rows
/// for long or comes near the renewal timeout, and a period's statements
/// for 100,000 leases number 20.
pub(crate) const MAX_RENEW_BATCH: usize = 5_000;

pub(crate) struct Registry {
    entries: Mutex<HashMap<Key, Entry>>,
    /// Wakes the renewal task: a lease was added.
    pub(crate) wake: Notify,
    /// When the renewal task plans next (`None`: only when woken), as its
    /// last schedule left it: a lease added that is due no sooner needs no
    /// wake-up (with 100,000 leases, each schedule reads them all).
    planned: Mutex<Option<Instant>>,
    /// Leases found due by the last full schedule that did not fit in its
    /// statement: the next statements take them from here without reading
    /// every lease again.
    pending: Mutex<Pending>,
    /// Bumped each time a renewal statement's outcome has been applied.
    applied: watch::Sender<u64>,
    /// The renewal task; started again if the runtime it ran on has ended.
    pub(crate) task: Mutex<Option<JoinHandle<()>>>,
}

/// See `Registry::pending`.
#[derive(Default)]
struct Pending {
    /// Soonest due first.
    keys: std::collections::VecDeque<Key>,
    /// The earliest loss of any held lease, as of the last full schedule (or a
    /// lease added since): until then no deadline can pass, so statements
    /// may be planned from `keys` alone.
    earliest_fire: Option<Instant>,
}

struct Entry {
    state: Arc<HeldState>,
    renew_at: Instant,
    in_flight: bool,
    failures: u32,
    _counted: Counted,
}

/// Counts a registered lease in the held-leases gauge for as long as its
/// entry exists, whichever way the entry goes.
struct Counted;

impl Counted {
    fn new() -> Counted {
        crate::telemetry::leases_held(1.0);
        Counted
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        crate::telemetry::leases_held(-1.0);
    }
}

/// Leases to send in one renewal statement.
pub(crate) struct Batch {
    pub(crate) keys: Vec<Key>,
    pub(crate) ttls: Vec<PgInterval>,
    /// The earliest instant at which any held lease is given up: a
    /// statement in flight holds up every lease, not only its own, so it
    /// must give up by then.
    pub(crate) first_fire_at: Instant,
}

/// What the renewal task should do next.
pub(crate) struct Schedule {
    /// A statement to send now, if any lease is due.
    pub(crate) batch: Option<Batch>,
    /// When to schedule again (absent: only when woken).
    pub(crate) wake: Option<Instant>,
    /// Leases given up locally (deadline passed) that may still be valid in
    /// the database: release them, so the next holder need not wait.
    pub(crate) given_up: Vec<Arc<HeldState>>,
}

/// One row of the renewal statement's answer.
#[derive(Debug, Clone)]
pub(crate) struct Renewed {
    pub(crate) name: String,
    pub(crate) token: i64,
    pub(crate) expires_at: Option<DateTime<Utc>>,
    pub(crate) current_token: Option<i64>,
    pub(crate) current_holder: Option<String>,
    /// A session-bound lease whose session has ended.
    pub(crate) session_ended: bool,
    /// The timeline whose change made the database forget the acquisition.
    pub(crate) forgotten_in: Option<i64>,
}

/// What applying one statement's outcome did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Applied {
    /// Leases whose renewal the database confirmed.
    pub(crate) renewed: u64,
    /// Whether the statement failed as a whole (it is retried).
    pub(crate) failed: bool,
    /// Leases whose renewals started failing with this statement.
    pub(crate) started_failing: u64,
    /// Leases renewed again after failures, with how long they had failed.
    pub(crate) recovered: Vec<Duration>,
}

/// The leases whose renewals started failing with one statement, for one
/// event rather than one per lease.
#[derive(Default)]
struct Outage {
    leases: u64,
    first_deadline: Option<Instant>,
}

impl Outage {
    fn add(&mut self, state: &HeldState) {
        self.leases += 1;
        let deadline = state.view.borrow().deadline;
        self.first_deadline = Some(self.first_deadline.map_or(deadline, |d| d.min(deadline)));
    }

    /// Logs it (if any lease started failing); how many did.
    fn say(&self, what: &'static str, error: &Error, now: Instant) -> u64 {
        if let Some(deadline) = self.first_deadline {
            tracing::warn!(
                %error,
                leases = self.leases,
                deadline_in_ms = deadline.saturating_duration_since(now).as_millis() as u64,
                "{what}; each lease is given up at its local deadline unless a renewal \
                 succeeds first"
            );
        }
        self.leases
    }
}

impl Registry {
    pub(crate) fn new() -> Registry {
        Registry {
            entries: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            planned: Mutex::new(None),
            pending: Mutex::new(Pending::default()),
            applied: watch::channel(0).0,
            task: Mutex::new(None),
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<Key, Entry>> {
        // The map stays consistent even if a holder panicked: recover it.
        crate::sync::lock(&self.entries)
    }

    /// Leases held right now.
    pub(crate) fn len(&self) -> usize {
        self.entries().len()
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        crate::sync::lock(&self.pending)
    }

    fn planned(&self) -> MutexGuard<'_, Option<Instant>> {
        crate::sync::lock(&self.planned)
    }

    /// Starts renewing `state`, first at `renew_at`; whether the renewal
    /// task must be woken to schedule again (it would not look before then).
    pub(crate) fn insert(&self, state: Arc<HeldState>, renew_at: Instant) -> bool {
        let key = (state.lease.name().to_owned(), state.lease.token().get());
        let mut entries = self.entries();
        let wake = self.planned().is_none_or(|planned| renew_at < planned);
        let mut pending = self.pending();
        let fire_at = state.fire_at();
        pending.earliest_fire = pending.earliest_fire.map(|e| e.min(fire_at));
        drop(pending);
        entries.insert(
            key,
            Entry {
                state,
                renew_at,
                in_flight: false,
                failures: 0,
                _counted: Counted::new(),
            },
        );
        wake
    }

    /// Stops renewing `lease`. `Some(in_flight)` if it was registered,
    /// telling whether a renewal of it is in flight.
    pub(crate) fn forget(&self, lease: &Lease) -> Option<bool> {
        self.entries()
            .remove(&(lease.name().to_owned(), lease.token().get()))
            .map(|entry| entry.in_flight)
    }

    /// Stops renewing every lease; returns them.
    pub(crate) fn drain(&self) -> Vec<Arc<HeldState>> {
        self.entries().drain().map(|(_, e)| e.state).collect()
    }

    /// Changes each time a statement's outcome has been applied.
    pub(crate) fn applied(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// At `now`: fires the losses whose deadline has come (and drops the
    /// leases whose holders saw theirs), then picks the leases to renew.
    /// `can_send` is false while a statement is in flight: nothing is sent
    /// then, and a lease that reaches its deadline meanwhile is lost as
    /// unreachable.
    ///
    /// A statement is sent only when some lease is due; those due within
    /// half a period then go along, so that leases acquired at different
    /// times fall into step (sending for early ones alone would renew a few
    /// at a time as they enter the window).
    pub(crate) fn schedule(&self, now: Instant, can_send: bool) -> Schedule {
        let mut entries = self.entries();
        if can_send && let Some(plan) = self.schedule_pending(&mut entries, now) {
            return plan;
        }
        let given_up = fire_losses(&mut entries, now, can_send);

        let mut wake: Option<Instant> = None;
        let mut wake_at = |at: Instant| wake = Some(wake.map_or(at, |w| w.min(at)));
        let mut batch = Batch {
            keys: Vec::new(),
            ttls: Vec::new(),
            first_fire_at: now + HORIZON,
        };
        let mut first_due = now + HORIZON;
        let mut due: Vec<(Instant, &Key)> = Vec::new();
        for (key, entry) in entries.iter() {
            let fire_at = entry.state.fire_at();
            wake_at(fire_at);
            batch.first_fire_at = batch.first_fire_at.min(fire_at);
            if !can_send || entry.in_flight {
                continue;
            }
            if entry.renew_at > now + entry.state.timing.period / 2 {
                wake_at(entry.renew_at);
                continue;
            }
            first_due = first_due.min(entry.renew_at);
            due.push((entry.renew_at, key));
        }
        let mut rest = Vec::new();
        if due.len() > MAX_RENEW_BATCH {
            // The soonest due go now; the rest with the next statements,
            // sent as soon as this one has been answered.
            due.sort_unstable_by_key(|(at, _)| *at);
            rest = due.split_off(MAX_RENEW_BATCH);
        }
        let rest: std::collections::VecDeque<Key> =
            rest.into_iter().map(|(_, key)| key.clone()).collect();
        for (_, key) in due {
            if let Some(entry) = entries.get(key) {
                batch.keys.push(key.clone());
                batch.ttls.push(entry.state.pg_ttl);
            }
        }
        if batch.keys.is_empty() || first_due > now {
            if !batch.keys.is_empty() {
                wake_at(first_due);
            }
            *self.pending() = Pending::default();
            *self.planned() = wake;
            return Schedule {
                batch: None,
                wake,
                given_up,
            };
        }
        for key in &batch.keys {
            if let Some(entry) = entries.get_mut(key) {
                entry.in_flight = true;
                entry.state.sending(now);
            }
        }
        // The rest follow, statement after statement, until a deadline
        // could come (the earliest of all, as the statement's own bound).
        *self.pending() = Pending {
            keys: rest,
            earliest_fire: Some(batch.first_fire_at),
        };
        // The task plans again as soon as the statement is answered.
        *self.planned() = Some(now);
        Schedule {
            batch: Some(batch),
            wake,
            given_up,
        }
    }

    /// The next statement from the leases a full schedule left pending, while
    /// no deadline can have passed; `None`: schedule in full.
    fn schedule_pending(
        &self,
        entries: &mut HashMap<Key, Entry>,
        now: Instant,
    ) -> Option<Schedule> {
        let mut pending = self.pending();
        let earliest_fire = pending.earliest_fire?;
        if now >= earliest_fire {
            return None;
        }
        let mut batch = Batch {
            keys: Vec::new(),
            ttls: Vec::new(),
            first_fire_at: earliest_fire,
        };
        while batch.keys.len() < MAX_RENEW_BATCH {
            let Some(key) = pending.keys.pop_front() else {
                break;
            };
            // Released, lost or sent meanwhile: not this one.
            let Some(entry) = entries.get_mut(&key) else {
                continue;
            };
            if entry.in_flight || entry.state.loss().is_some() {
                continue;
            }
            entry.in_flight = true;
            entry.state.sending(now);
            batch.ttls.push(entry.state.pg_ttl);
            batch.keys.push(key);
        }
        if batch.keys.is_empty() {
            return None;
        }
        *self.planned() = Some(now);
        Some(Schedule {
            batch: Some(batch),
            wake: Some(earliest_fire),
            given_up: Vec::new(),
        })
    }

    /// While the renewal task is paused by a test: loses the leases whose
    /// deadline has passed, as their holders' own checks would; returns
    /// when to look again.
    #[cfg(feature = "testing")]
    pub(crate) fn fire_due(&self, now: Instant) -> Option<Instant> {
        let mut wake: Option<Instant> = None;
        self.entries().retain(|_, entry| {
            if entry.state.loss_by(now).is_some() {
                return false;
            }
            let at = entry.state.fire_at();
            wake = Some(wake.map_or(at, |w| w.min(at)));
            true
        });
        wake
    }

    /// Makes every held lease due for renewal now (a test's
    /// `Faults::renew_now`).
    #[cfg(feature = "testing")]
    pub(crate) fn make_due(&self, now: Instant) {
        for entry in self.entries().values_mut() {
            entry.renew_at = now;
        }
        *self.pending() = Pending::default();
        self.wake.notify_one();
    }

    /// The statement in flight has gone unanswered past `LATE`: every
    /// lease it carries counts as failing from `now` (said once, as a
    /// failure would be); the statement itself goes on.
    pub(crate) fn late(&self, error: &Arc<Error>, now: Instant) -> u64 {
        let entries = self.entries();
        let mut outage = Outage::default();
        for entry in entries.values().filter(|e| e.in_flight) {
            if entry.state.failing(error.clone(), now) {
                outage.add(&entry.state);
            }
        }
        drop(entries);
        outage.say("renewals late", error, now)
    }

    /// Applies at `now` the outcome of the statement sent at `sent` for
    /// `keys`: confirmed leases get a new deadline (counted from `sent`)
    /// and their next renewal a period after `sent`; leases the database
    /// no longer accepts are lost with the reason it gave; a failed
    /// statement is retried after a backoff, its error kept as the reason
    /// should the deadline come first.
    pub(crate) fn apply(
        &self,
        keys: &[Key],
        sent: Instant,
        outcome: Result<Vec<Renewed>, Arc<Error>>,
        now: Instant,
    ) -> Applied {
        let mut entries = self.entries();
        let mut applied = Applied::default();
        match outcome {
            Err(error) => {
                applied.failed = true;
                tracing::debug!(%error, leases = keys.len(), "renewal failed; retrying");
                let mut outage = Outage::default();
                for key in keys {
                    if let Some(entry) = entries.get_mut(key) {
                        entry.in_flight = false;
                        entry.failures = entry.failures.saturating_add(1);
                        if entry.state.failed(error.clone(), now) {
                            outage.add(&entry.state);
                        }
                        entry.renew_at =
                            now + backoff::renewal_retry(entry.failures, entry.state.timing.period);
                    }
                }
                applied.started_failing = outage.say("renewals failing", &error, now);
            }
            Ok(rows) => {
                for row in rows {
                    let key = (row.name, row.token);
                    let Some(entry) = entries.get_mut(&key) else {
                        continue; // released or given up meanwhile
                    };
                    entry.in_flight = false;
                    if let Some(expires_at) = row.expires_at {
                        applied.renewed += 1;
                        entry.failures = 0;
                        if let Some(lasted) = entry.state.confirm(sent, expires_at, now) {
                            applied.recovered.push(lasted);
                        }
                        entry.renew_at = sent + entry.state.timing.period;
                        continue;
                    }
                    let reason = if let Some(timeline) = row.forgotten_in {
                        LossReason::Forgotten { timeline }
                    } else if row.current_token == Some(key.1) && row.current_holder.is_none() {
                        LossReason::Released
                    } else if row.session_ended {
                        LossReason::SessionEnded
                    } else {
                        LossReason::Stale {
                            current_token: row.current_token.map(Token::issued),
                            current_holder: row.current_holder,
                        }
                    };
                    entry.state.fire(reason, now);
                    entries.remove(&key);
                }
                // Every lease sent yields a row; should one be missing, it
                // is sent again.
                for key in keys {
                    if let Some(entry) = entries.get_mut(key) {
                        entry.in_flight = false;
                    }
                }
            }
        }
        drop(entries);
        if let Some(longest) = applied.recovered.iter().max() {
            tracing::info!(
                leases = applied.recovered.len(),
                failing_ms = longest.as_millis() as u64,
                "renewals succeed again"
            );
        }
        self.applied.send_modify(|n| *n = n.wrapping_add(1));
        applied
    }
}

/// At `now`: fires the losses whose deadline has come, and drops the
/// leases lost (fired here or by their holder's own check). Returns those
/// given up on (expired, or unreachable: a statement in flight, which
/// `can_send` false says, kept the renewal from being sent).
fn fire_losses(
    entries: &mut HashMap<Key, Entry>,
    now: Instant,
    can_send: bool,
) -> Vec<Arc<HeldState>> {
    let mut given_up = Vec::new();
    entries.retain(|_, entry| {
        let state = &entry.state;
        let reason = match state.loss() {
            // Fired by the holder's own check of the deadline.
            Some(reason) => reason,
            None if now >= state.fire_at() => {
                let reason = match state.deadline_reason(now) {
                    // Not renewed because the statement before hangs.
                    LossReason::Expired if !can_send => LossReason::Unreachable {
                        error: Arc::new(Error::Timeout {
                            operation: "renewal statement (sent for other leases)",
                            after: None,
                        }),
                    },
                    reason => reason,
                };
                state.fire(reason.clone(), now);
                reason
            }
            None => return true,
        };
        if matches!(reason, LossReason::Expired | LossReason::Unreachable { .. }) {
            given_up.push(Arc::clone(state));
        }
        false
    });
    given_up
}
