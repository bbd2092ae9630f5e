//! Acquisition: one statement per attempt, and, for an acquirer allowed to
//! wait, a retry when the holder releases (heard through the manager's
//! listening connection, `crate::notify`, for names watched with
//! `pglease.watch`), otherwise when the holder's lease expires, with
//! jitter; polling with backoff only when no listener is available.
//!
//! Here, the loop every acquisition runs (one name, or a set: `set.rs`);
//! one attempt and its answer in `attempt.rs`; what happens to an attempt
//! whose caller stops waiting in `detach.rs`; the wait between two
//! attempts in `waiter.rs`; the choice of that wait, clock-free, in
//! `plan.rs`; a fair acquisition's place in line in `line.rs`.

mod attempt;
mod detach;
mod line;
mod plan;
mod set;
mod waiter;

pub use line::LinePlace;
pub(crate) use line::places;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::postgres::types::PgInterval;
use tokio::time::Instant;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::options::AcquireOptions;
use crate::telemetry;
use attempt::{Answer, Attempt, Refusal, Won, attempt, confirm};
use detach::detached;
use line::Standing;
use plan::Step;
use waiter::Waiter;

/// Counts a waiting acquirer for [`crate::ManagerStats::waiting`].
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
        telemetry::waiting(-1.0);
    }
}

/// What one acquisition loop ([`Acquirer::run`]) acquires: one name
/// ([`One`]) or every name of a set (`set::Set`). The loop is written
/// once; what differs between the two is said here. What differed by
/// accident when each had a loop of its own is now the same for both: a
/// refused attempt joins the line when the options or the name ask for it
/// (a set's answer says whether the name is fair, as a single lease's
/// does), the waiter listens for releases unless the lease is counted (a
/// set never is), and a win is counted with its takeover delay.
trait Acquisition: Send + Sync + 'static {
    /// What a win is: a lease, or a set's leases.
    type Won: Won + std::fmt::Debug;

    /// The names acquired, as the line is joined with them.
    fn names(&self) -> &[String];

    /// One attempt (one statement), with the ticket of a place in line.
    fn attempt(
        &self,
        context: &Context,
        ticket: Option<i64>,
    ) -> impl Future<Output = Result<Attempt<Self::Won>>> + Send;

    /// The name whose holder the waiter waits out after `refusal`.
    ///
    /// # Errors
    ///
    /// A protocol error if the answer names what was not asked for.
    fn blocking(&self, refusal: &Refusal) -> Result<&str>;
}

/// One name (`LeaseManager::acquire`).
struct One {
    name: [String; 1],
    ttl: PgInterval,
    how: AcquireOptions,
}

impl Acquisition for One {
    type Won = Lease;

    fn names(&self) -> &[String] {
        &self.name
    }

    async fn attempt(&self, context: &Context, ticket: Option<i64>) -> Result<Attempt<Lease>> {
        attempt(context, &self.name[0], self.ttl, &self.how, ticket).await
    }

    /// The name itself, also for a counted lease: its waiter polls.
    fn blocking(&self, _refusal: &Refusal) -> Result<&str> {
        Ok(&self.name[0])
    }
}

/// One attempt of `what`, with the ticket of `place` if it has one, where
/// it is awaited (see [`detached`]).
async fn attempt_detached<A: Acquisition>(
    context: &Arc<Context>,
    what: &Arc<A>,
    place: Option<&line::Ticket>,
) -> Result<Attempt<A::Won>> {
    let (what, ticket) = (Arc::clone(what), place.map(line::Ticket::number));
    detached(context, move |context| async move {
        what.attempt(&context, ticket).await
    })
    .await
}

/// Acquiring for one manager. Waiters hear releases through the
/// manager's listening connection (`Context::listener`), started by the
/// first acquirer that has to wait.
pub(crate) struct Acquirer {
    context: Arc<Context>,
}

impl Acquirer {
    pub(crate) fn new(context: Arc<Context>) -> Acquirer {
        Acquirer { context }
    }

    /// Whether the manager is listening for releases right now.
    pub(crate) fn is_listening(&self) -> bool {
        self.context.is_listening()
    }

    /// Acquires `name` as `how` says (see `LeaseManager::acquire`); returns
    /// the lease and when the statement that confirmed it was sent.
    pub(crate) async fn acquire(
        &self,
        name: &str,
        how: &AcquireOptions,
    ) -> Result<(Lease, Instant)> {
        let ttl = how.check(name)?;
        let one = One {
            name: [name.to_owned()],
            ttl,
            how: how.clone(),
        };
        self.run(one, how, ttl).await
    }

    /// Acquires `what` as `how` says, with `ttl` as the statement sends
    /// it: attempts, and between two attempts waits in line, listens or
    /// naps as plan.rs decides. Returns what was won and when the
    /// statement that confirmed it was sent.
    async fn run<A: Acquisition>(
        &self,
        what: A,
        how: &AcquireOptions,
        ttl: PgInterval,
    ) -> Result<(A::Won, Instant)> {
        let context = &self.context;
        if context.is_shut_down() {
            return Err(Error::ShutDown);
        }
        let what = Arc::new(what);
        let start = Instant::now();
        let deadline = start
            .checked_add(how.get_wait())
            .unwrap_or(start + Duration::from_secs(86400 * 365));
        context.counters.waiting.fetch_add(1, Ordering::Relaxed);
        telemetry::waiting(1.0);
        let _waiting = Waiting(&context.counters.waiting);
        // The waiter for the name that blocked the last attempt.
        let mut waiter: Option<Waiter<'_>> = None;
        let mut line = Standing::default();
        loop {
            let outcome = attempt_detached(context, &what, line.place.as_ref()).await;
            if line.ended(&outcome)? {
                continue;
            }
            let now = Instant::now();
            let refusal = match plan::step(outcome, now >= deadline) {
                Step::Take { won, sent } => {
                    line.taken();
                    took(&won, waiter.as_ref(), start);
                    return Ok((won, sent));
                }
                Step::Retry => continue,
                Step::Wait(refusal) => refusal,
                Step::Refuse(refusal) => {
                    telemetry::acquisition(refusal.refused().label(), None);
                    return Err(refusal.into_error());
                }
                Step::Fail(error) => {
                    telemetry::acquisition("error", None);
                    return Err(error);
                }
            };
            if context.is_shut_down() {
                return Err(Error::ShutDown);
            }
            let blocking = what.blocking(&refusal)?;
            let waiter = match &mut waiter {
                Some(w) if w.name == blocking => w,
                slot => slot.insert(Waiter::new(context, blocking, deadline)),
            };
            waiter.seen_expiry = refusal.holder_expiry();
            if line
                .join(context, what.names(), how, refusal.fair, &ttl)
                .await?
            {
                // Attempt at once with the ticket: the lease may be free
                // for the first in line.
                continue;
            }
            // The release listener starts only once an attempt has failed
            // and there is time to wait: a release committed before the
            // name is watched is caught by the attempt made after the watch.
            waiter.listen(how.get_limit().is_some());
            if waiter.watch(refusal.pinned()).await? {
                // A release that committed before the watch took hold
                // notified nobody: look again now that one would.
                continue;
            }
            let plan = waiter.next_nap(&refusal);
            let nap = line.nap(
                plan.nap.duration(context.options.get_max_poll_interval()),
                how,
            );
            waiter.nap((now + nap).min(deadline)).await?;
        }
    }
}

/// Counts an acquisition that began at `start`, and its takeover delay
/// after the expiry of the holder that `waiter` (if it waited) saw last.
fn took(won: &impl Won, waiter: Option<&Waiter<'_>>, start: Instant) {
    telemetry::acquisition("acquired", Some(start.elapsed()));
    let expired = waiter.and_then(|waiter| waiter.seen_expiry);
    if let Some(delay) = won
        .acquired_at()
        .and_then(|acquired_at| plan::takeover_delay(expired, acquired_at))
    {
        telemetry::takeover_delay(delay);
    }
}
