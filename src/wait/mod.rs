//! Acquisition: one statement per attempt, and, for an acquirer allowed to
//! wait, a retry when the holder releases (heard through the manager's
//! listening connection, `crate::notify`, for names watched with
//! `pglease.watch`), otherwise when the holder's lease expires, with
//! jitter; polling with backoff only when no listener is available. The
//! choice between two attempts is `plan.rs`'s, clock-free.

mod line;
mod plan;
mod set;

pub use line::LinePlace;
pub(crate) use line::line;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{Connection, Row};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use crate::context::Context;
use crate::db;
use crate::error::{Error, Result};
use crate::lease::{Lease, ttl_duration};
use crate::notify::{Listener, Listening, Subscription, Topic};
use crate::options::AcquireOptions;
use crate::sql;
use crate::telemetry;
use crate::token::Token;
use plan::{Heard, Step};

/// How long a waiter waits for the listener to confirm a watch before it
/// falls back to polling for that round.
const WATCH_CONFIRM: Duration = Duration::from_secs(1);

/// The outcome of one acquisition statement, for what it would win: a
/// lease, or a set's leases.
pub(crate) enum Attempt<W> {
    Acquired {
        won: W,
        /// The instant the term is counted from (the start of the local
        /// deadline): the acquisition's send, earlier by what a term
        /// handed over lacks of the TTL (`plan::counted_from`), or the
        /// send of the renewal that confirmed a late or short one.
        sent: Instant,
    },
    /// Not acquired: held, ended but pinned, or refused for a grant delay.
    Held(Held),
}

/// The part of an answer row of `pglease.acquire` or `acquire_all` that
/// every answer has.
struct Answer {
    /// The token drawn; none if refused.
    token: Option<i64>,
    /// The holder (the one granted, or the one that kept it).
    holder: Option<String>,
    expires_at: DateTime<Utc>,
    /// The database time of the decision.
    checked_at: DateTime<Utc>,
}

impl Answer {
    /// The answer `row` gives.
    fn read(row: &PgRow) -> sqlx::Result<Answer> {
        let checked_at: DateTime<Utc> = row.try_get("checked_at")?;
        Ok(Answer {
            token: row.try_get("token")?,
            holder: row.try_get("holder")?,
            // A refusal with no time to give (none does today) is one that
            // has ended as it was decided.
            expires_at: row
                .try_get::<Option<DateTime<Utc>>, _>("expires_at")?
                .unwrap_or(checked_at),
            checked_at,
        })
    }

    /// The lease `slot` granted with `token`, held by `holder` unless the
    /// answer names another.
    fn lease(self, slot: &str, token: i64, holder: &str) -> Lease {
        Lease::new(
            slot,
            self.holder.unwrap_or_else(|| holder.to_owned()),
            Token::issued(token),
            self.expires_at,
            self.checked_at,
        )
    }
}

/// What an attempt that did not acquire saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    /// The current or last holder (`None` once released).
    holder: Option<String>,
    expires_at: DateTime<Utc>,
    /// The database time of the decision, to turn `expires_at` into a
    /// wait without comparing clocks.
    checked_at: DateTime<Utc>,
    /// Why an ended lease could not be taken.
    note: Option<String>,
    /// The lease the answer describes: the name, or for a counted lease
    /// the slot that expires first.
    slot: String,
    /// The process id of the server session a session-bound holder's
    /// lease is bound to.
    holder_session: Option<i32>,
    /// Refused for the grant delay after a change of timeline: until when
    /// (database clock).
    delayed_until: Option<DateTime<Utc>>,
    /// How many wait in line before this acquisition (with a place in
    /// line, or when the line refused it).
    ahead: Option<i32>,
    /// Every waiter for the name waits in line (`pglease.set_fair`).
    fair: bool,
}

impl Held {
    /// A refusal as an answer row of `pglease.acquire` or `acquire_all`
    /// says it (its `answer` already read), about `slot`; counted in
    /// telemetry.
    fn refused_in(row: &PgRow, answer: Answer, slot: String) -> sqlx::Result<Held> {
        let held = Held {
            holder: answer.holder,
            expires_at: answer.expires_at,
            checked_at: answer.checked_at,
            note: row.try_get("note")?,
            slot,
            holder_session: row.try_get("holder_session")?,
            delayed_until: row.try_get("delayed_until")?,
            ahead: row.try_get("ahead")?,
            fair: row.try_get::<Option<bool>, _>("fair")?.unwrap_or(false),
        };
        telemetry::acquire_attempt(held.refused().label());
        Ok(held)
    }

    /// Whether the lease has ended and is only pinned (see [`pinned`]).
    fn pinned(&self) -> bool {
        pinned(self.holder.as_deref(), self.expires_at, self.checked_at)
    }

    /// Whether others wait in line before this acquisition.
    fn in_line(&self) -> bool {
        self.ahead.is_some_and(|ahead| ahead > 0)
    }

    /// Why the lease was not acquired.
    fn refused(&self) -> plan::Refused {
        plan::Refused::of(self.delayed_until.is_some(), self.pinned(), self.in_line())
    }

    /// The holder's expiry, if there is a holder (a released lease has
    /// none): what a takeover's delay is counted from.
    fn holder_expiry(&self) -> Option<DateTime<Utc>> {
        self.holder.as_ref().map(|_| self.expires_at)
    }

    /// The error to report, naming the slot the answer describes (a
    /// counted lease's, or the name): [`Error::Pinned`] when the lease has
    /// ended but a stale fenced transaction still holds it,
    /// [`Error::GrantDelayed`] during a grant delay.
    fn refusal(self) -> Error {
        let refused = self.refused();
        let pinned = self.pinned();
        let Held {
            holder,
            expires_at,
            note,
            slot: name,
            delayed_until,
            ahead,
            ..
        } = self;
        if refused == plan::Refused::InLine {
            return Error::InLine {
                name,
                ahead: ahead.and_then(|a| u32::try_from(a).ok()).unwrap_or(0),
            };
        }
        if let Some(until) = delayed_until {
            return Error::GrantDelayed {
                name,
                until,
                reason: note.unwrap_or_else(|| "the grant delay after a failover".to_owned()),
            };
        }
        match holder {
            Some(holder) if !pinned => Error::Held {
                name,
                holder,
                expires_at,
            },
            holder => Error::Pinned {
                name,
                holder,
                ended_at: expires_at,
                reason: note.unwrap_or_else(|| {
                    "a transaction that the database could not end holds its row".to_owned()
                }),
            },
        }
    }
}

/// Whether a "not acquired" answer describes a lease that has ended (it
/// expired before the decision, or was released) and is only pinned by a
/// transaction that could not be ended.
fn pinned(holder: Option<&str>, expires_at: DateTime<Utc>, checked_at: DateTime<Utc>) -> bool {
    holder.is_none() || expires_at <= checked_at
}

/// What an acquisition wins: one lease, or a set's leases.
trait Won: Send + 'static {
    /// The leases won.
    fn leases(&self) -> &[Lease];
    /// The same, to confirm them.
    fn leases_mut(&mut self) -> &mut [Lease];

    /// When they were acquired (one statement took them all), on the
    /// database's clock.
    fn acquired_at(&self) -> Option<DateTime<Utc>> {
        self.leases().first().map(Lease::acquired_at)
    }
}

impl Won for Lease {
    fn leases(&self) -> &[Lease] {
        std::slice::from_ref(self)
    }

    fn leases_mut(&mut self) -> &mut [Lease] {
        std::slice::from_mut(self)
    }
}

impl Won for Vec<Lease> {
    fn leases(&self) -> &[Lease] {
        self
    }

    fn leases_mut(&mut self) -> &mut [Lease] {
        self
    }
}

/// What an attempt acquired, given back when nobody takes delivery.
trait GiveBack: Send + 'static {
    /// Releases in the background whatever the outcome holds.
    fn give_back(self, context: &Context);
}

impl GiveBack for (line::Place, u32) {
    /// A place joined for a waiter that stopped waiting: dropping it
    /// leaves the line in the background.
    fn give_back(self, _context: &Context) {
        drop(self);
    }
}

impl<W: Won> GiveBack for Attempt<W> {
    fn give_back(self, context: &Context) {
        if let Attempt::Acquired { won, .. } = self {
            for lease in won.leases() {
                context.release_in_background(lease.fence());
            }
        }
    }
}

/// An attempt polled where it is awaited, with no task of its own. If
/// the waiter stops waiting while the attempt's statement is in flight
/// (the future is dropped), the attempt is finished on a tracked task
/// instead, so that `shutdown` waits for it, and what it acquired for
/// nobody is given back; without a runtime to finish it on (the runtime
/// itself is shutting down), it is dropped and what it may have acquired
/// expires.
struct InFlight<T: GiveBack> {
    running: Option<Pin<Box<dyn Future<Output = Result<T>> + Send>>>,
    context: Arc<Context>,
}

impl<T: GiveBack> Future for InFlight<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Result<T>> {
        let Some(running) = self.running.as_mut() else {
            // Polled again after its answer: nothing is in flight.
            return Poll::Ready(Err(Error::ShutDown));
        };
        let outcome = std::task::ready!(running.as_mut().poll(cx));
        // Answered: nothing is left to finish when this is dropped.
        self.running = None;
        Poll::Ready(outcome)
    }
}

impl<T: GiveBack> Drop for InFlight<T> {
    fn drop(&mut self) {
        let Some(running) = self.running.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let context = Arc::clone(&self.context);
        self.context.background.spawn_on(
            async move {
                if let Ok(acquired) = running.await {
                    acquired.give_back(&context);
                }
            },
            &runtime,
        );
    }
}

/// Runs `attempt` in place, so that a caller who stops waiting while its
/// statement is in flight leaves nothing held (see [`InFlight`]): no task
/// is spawned unless the caller goes.
async fn detached<T, F>(
    context: &Arc<Context>,
    attempt: impl FnOnce(Arc<Context>) -> F,
) -> Result<T>
where
    T: GiveBack + Send + 'static,
    F: Future<Output = Result<T>> + Send + 'static,
{
    InFlight {
        running: Some(Box::pin(attempt(Arc::clone(context)))),
        context: Arc::clone(context),
    }
    .await
}

/// Counts a waiting acquirer for [`crate::ManagerStats::waiting`].
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
        telemetry::waiting(-1.0);
    }
}

/// One acquisition statement (one round trip), and, if its answer came
/// late, the renewal that confirms it.
#[tracing::instrument(name = "pglease.acquire", level = "debug", skip_all,
                      fields(name, holder, token = tracing::field::Empty))]
async fn attempt(
    context: &Context,
    name: &str,
    ttl: PgInterval,
    how: &AcquireOptions,
    ticket: Option<i64>,
) -> Result<Attempt<Lease>> {
    let holder = how.get_holder();
    let holder = holder.as_ref();
    let sent = Instant::now();
    let row = acquire_row(context, name, holder, ttl, how, ticket).await;
    context
        .counters
        .acquire_attempts
        .fetch_add(1, Ordering::Relaxed);
    let row = row.inspect_err(|_| telemetry::acquire_attempt("error"))?;
    let answer = Answer::read(&row)?;
    // A counted lease's slot, or the name itself.
    let slot: String = row.try_get("slot_name")?;
    let Some(token) = answer.token else {
        return Ok(Attempt::Held(Held::refused_in(&row, answer, slot)?));
    };
    telemetry::acquire_attempt("acquired");
    tracing::Span::current().record("token", token);
    let (expires_at, checked_at) = (answer.expires_at, answer.checked_at);
    let lease = answer
        .lease(&slot, token, holder)
        .shared_if(how.get_shared());
    let window = context.options.confirm_after(ttl_duration(ttl));
    // A term handed over (see `pglease.hand_over`) runs from the handover:
    // it is counted from earlier than the send by what it lacks.
    if let Some(from) = plan::counted_from(sent, expires_at, checked_at, ttl_duration(ttl))
        && from.elapsed() <= window
    {
        return Ok(Attempt::Acquired {
            won: lease,
            sent: from,
        });
    }
    // Late, or short by more than a renewal period: a renewal sets the
    // expiry the local deadline is counted against.
    confirm(context, lease, ttl).await
}

/// Sends `pglease.acquire` for `name` as `how` says: on the manager's
/// session for a session-bound lease, as the statement the manager may
/// prepare for one holder without a value, as text otherwise.
async fn acquire_row(
    context: &Context,
    name: &str,
    holder: &str,
    ttl: PgInterval,
    how: &AcquireOptions,
    ticket: Option<i64>,
) -> sqlx::Result<PgRow> {
    let mode = match (how.get_limit(), how.get_shared()) {
        (Some(slots), _) => sql::Mode::Counted(slots),
        (None, true) => sql::Mode::Shared,
        (None, false) => sql::Mode::Exclusive {
            waits: !how.get_wait().is_zero(),
        },
    };
    let statement = || {
        sql::acquire(
            name,
            holder,
            &ttl,
            how.get_value(),
            mode,
            how.get_session_bound(),
            ticket,
        )
    };
    match mode {
        _ if how.get_session_bound() => on_session(context, statement()).await,
        sql::Mode::Exclusive { waits } if how.get_value().is_none() => {
            let prepared = || {
                sqlx::query(sql::ACQUIRE_PREPARED)
                    .bind(name)
                    .bind(holder)
                    .bind(ttl)
                    .bind(ticket)
                    .bind(waits)
            };
            db::fetch_hot(context, prepared, statement).await
        }
        _ => sql::query(statement()).fetch_one(&context.pool).await,
    }
}

/// Runs an acquisition on the manager's session for session-bound leases
/// (the session they are bound to), opening it first when there is none.
/// A session that fails other than with a database error is dropped: its
/// leases have ended with it, or will be found so at their next renewal.
/// An old session that failed is replaced once, at once: the statement
/// either never ran or ran on a session that is gone (so what it acquired
/// is free to take, also for this retry).
async fn on_session(context: &Context, statement: String) -> sqlx::Result<PgRow> {
    let mut session = context.session.lock().await;
    let mut reused = session.is_some();
    loop {
        let connection = match &mut *session {
            Some(connection) => connection,
            None => {
                session.insert(PgConnection::connect_with(&context.pool.connect_options()).await?)
            }
        };
        match sql::query(statement.as_str()).fetch_one(connection).await {
            Err(error) if !matches!(error, sqlx::Error::Database(_)) => {
                *session = None;
                if !std::mem::take(&mut reused) {
                    return Err(error);
                }
                tracing::debug!(%error, "the session for session-bound leases failed; opening another");
            }
            row => return row,
        }
    }
}

/// A wait in the server for a session-bound holder's session to end.
type SessionWait<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Resolves once the server session with process id `pid` has ended (or
/// given up its wake-up lock; see SESSION-BOUND LEASES in the schema):
/// blocks in the server, on a connection of its own, on a shared lock of
/// the key that session holds, in transactions of at most half a second
/// so that a dropped wait leaves the server nothing for longer. Never
/// resolves if the connection cannot be had (the waiter's other wake-ups
/// remain). Cancel-safe: dropping it closes the connection.
async fn session_ended(context: &Context, pid: i32) {
    let blocked = async {
        let mut connection = PgConnection::connect_with(&context.pool.connect_options()).await?;
        loop {
            match sql::query(sql::session_wake(pid))
                .execute(&mut connection)
                .await
            {
                Ok(_) => return sqlx::Result::Ok(()),
                Err(e)
                    if crate::sqlstate::of(&e).as_deref()
                        == Some(crate::sqlstate::LOCK_NOT_AVAILABLE) => {}
                Err(error) => return Err(error),
            }
        }
    };
    if let Err(error) = blocked.await {
        tracing::debug!(%error, pid, "cannot wait in the server for the holder's session to end");
        std::future::pending::<()>().await;
    }
}

/// Confirms leases whose answer came late with a renewal each, under the
/// same token: the database gave them a full TTL from its decision, but
/// the local deadline, counted from the send, would have little or
/// nothing of it left. The deadline starts again from these renewals'
/// send; only a failed renewal makes it a loss.
async fn confirm<W: Won>(context: &Context, mut won: W, ttl: PgInterval) -> Result<Attempt<W>> {
    let sent = Instant::now();
    for i in 0..won.leases().len() {
        match db::renew(context, won.leases()[i].fence(), ttl).await {
            Ok(expires_at) => {
                let lease = &mut won.leases_mut()[i];
                *lease = lease.clone().confirmed(expires_at);
            }
            Err(error) => {
                // Nobody will use leases whose confirmation failed: give
                // them back rather than leave them held until they
                // expire (all but one that was lost, no longer ours).
                let lost = matches!(error, Error::Lost { .. });
                for (j, lease) in won.leases().iter().enumerate() {
                    if !(lost && i == j) {
                        context.release_in_background(lease.fence());
                    }
                }
                return Err(error);
            }
        }
    }
    Ok(Attempt::Acquired { won, sent })
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

    /// The name whose holder the waiter waits out after `held`.
    ///
    /// # Errors
    ///
    /// A protocol error if the answer names what was not asked for.
    fn blocking(&self, held: &Held) -> Result<&str>;
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
    fn blocking(&self, _held: &Held) -> Result<&str> {
        Ok(&self.name[0])
    }
}

/// One attempt of `what`, with the ticket of `place` if it has one, where
/// it is awaited (see [`detached`]).
async fn attempt_detached<A: Acquisition>(
    context: &Arc<Context>,
    what: &Arc<A>,
    place: Option<&line::Place>,
) -> Result<Attempt<A::Won>> {
    let (what, ticket) = (Arc::clone(what), place.map(line::Place::ticket));
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
        let mut line = Line::default();
        loop {
            let outcome = attempt_detached(context, &what, line.place.as_ref()).await;
            if line.ended(&outcome)? {
                continue;
            }
            let now = Instant::now();
            let held = match plan::step(outcome, now >= deadline) {
                Step::Take { won, sent } => {
                    line.taken();
                    took(&won, waiter.as_ref(), start);
                    return Ok((won, sent));
                }
                Step::Retry => continue,
                Step::Wait(held) => held,
                Step::Refuse(held) => {
                    telemetry::acquisition(held.refused().label(), None);
                    return Err(held.refusal());
                }
                Step::Fail(error) => {
                    telemetry::acquisition("error", None);
                    return Err(error);
                }
            };
            if context.is_shut_down() {
                return Err(Error::ShutDown);
            }
            let blocking = what.blocking(&held)?;
            let waiter = match &mut waiter {
                Some(w) if w.name == blocking => w,
                slot => slot.insert(Waiter::new(context, blocking, deadline)),
            };
            waiter.seen_expiry = held.holder_expiry();
            if line
                .join(context, what.names(), how, held.fair, &ttl)
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
            if waiter.watch(held.pinned()).await? {
                // A release that committed before the watch took hold
                // notified nobody: look again now that one would.
                continue;
            }
            let plan = waiter.plan(&held);
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

/// A fair acquisition's place in line across its attempts (none for an
/// acquisition that is not fair, or before its first refusal).
#[derive(Default)]
struct Line {
    place: Option<line::Place>,
    /// Places that ended under the waiter in a row (see `ended`).
    ended: u32,
}

impl Line {
    /// Whether `outcome` says the place has ended (SQLSTATE LE003): the
    /// waiter then joins again after its next attempt. Three in a row
    /// are reported as the error.
    fn ended<T>(&mut self, outcome: &Result<T>) -> Result<bool> {
        let Err(error) = outcome else {
            self.ended = 0;
            return Ok(false);
        };
        if error.sqlstate() != Some(crate::sqlstate::NOT_IN_LINE) || self.ended >= 2 {
            return Ok(false);
        }
        self.ended += 1;
        if let Some(place) = self.place.take() {
            place.taken();
        }
        Ok(true)
    }

    /// Joins the line of `names` if the acquisition is fair and has no
    /// place yet; whether it joined now.
    async fn join(
        &mut self,
        context: &Arc<Context>,
        names: &[String],
        how: &AcquireOptions,
        name_fair: bool,
        ttl: &PgInterval,
    ) -> Result<bool> {
        if !(how.get_fair() || name_fair) || self.place.is_some() {
            return Ok(false);
        }
        // On a task of its own, as attempts are: a waiter cancelled while
        // its join is in flight leaves the place in the background.
        let (joining, holder, ttl, max) = (
            names.to_vec(),
            how.get_holder().into_owned(),
            *ttl,
            how.get_max_waiting(),
        );
        let (place, position) = detached(context, move |context| async move {
            line::Place::join(&context, &joining, &holder, &ttl, max).await
        })
        .await?;
        tracing::debug!(?names, position, "waiting in line");
        self.place = Some(place);
        Ok(true)
    }

    /// The acquisition succeeded: its place ended with it.
    fn taken(&mut self) {
        if let Some(place) = self.place.take() {
            place.taken();
        }
    }

    /// `nap`, shortened so that the place is kept.
    fn nap(&self, nap: Duration, how: &AcquireOptions) -> Duration {
        match self.place {
            Some(_) => line::keep_place(nap, how.get_ttl()),
            None => nap,
        }
    }
}

/// One acquisition's state from one attempt to the next: how it hears of
/// a release or of the holder's end, and what its plan needs to know.
struct Waiter<'a> {
    context: &'a Arc<Context>,
    name: &'a str,
    deadline: Instant,
    /// The manager's release listener, once this waiter started it.
    listener: Option<&'a Listener>,
    /// Names whose release the listener heard (`None` in a message: it
    /// connected again).
    releases: Option<broadcast::Receiver<Option<String>>>,
    /// Whether the listener is connected.
    listening: Option<watch::Receiver<Listening>>,
    /// The previous holder's expiry as last seen, for the takeover delay.
    seen_expiry: Option<DateTime<Utc>>,
    /// The backoffs' steps (see plan.rs).
    counts: plan::Counts,
    /// Releases are notified only for names a session watches: watched
    /// on the listening connection after the first failed attempt.
    watching: Option<Subscription>,
    /// Whether that watch took hold (a release would be heard).
    watched: bool,
    /// The session-bound holder whose session's end last woke us (see
    /// plan.rs).
    woken_by: Option<i32>,
    /// The wait in the server for that holder's session to end, kept from
    /// one nap to the next while the holder stays the same.
    session_wait: Option<(i32, SessionWait<'a>)>,
}

impl<'a> Waiter<'a> {
    /// A waiter for `name` until `deadline`, not yet listening.
    fn new(context: &'a Arc<Context>, name: &'a str, deadline: Instant) -> Waiter<'a> {
        Waiter {
            context,
            name,
            deadline,
            listener: None,
            releases: None,
            listening: None,
            seen_expiry: None,
            counts: plan::Counts::default(),
            watching: None,
            watched: false,
            woken_by: None,
            session_wait: None,
        }
    }

    /// Starts the manager's release listener for this waiter, unless it
    /// has already or the manager does not listen. A `counted` lease's
    /// slots are released under their own names: its waiters poll.
    fn listen(&mut self, counted: bool) {
        if self.listener.is_none() && self.context.options.get_notify() && !counted {
            let started = self.context.listener();
            self.releases = Some(started.releases.subscribe());
            self.listening = Some(started.listening.subscribe());
            self.listener = Some(started);
        }
    }

    /// Watches the name for releases, if listening and it is not watched
    /// yet (nor `pinned`: no release would announce that lease's end);
    /// whether a watch took hold now, confirmed within [`WATCH_CONFIRM`].
    async fn watch(&mut self, pinned: bool) -> Result<bool> {
        let Some(listener) = self.listener.filter(|_| !self.watched && !pinned) else {
            return Ok(false);
        };
        let watching = self
            .watching
            .get_or_insert_with(|| listener.subscribe(Topic::Releases, self.name));
        let until = (Instant::now() + WATCH_CONFIRM).min(self.deadline);
        let confirmed = tokio::select! {
            confirmed = watching.confirmed(listener.is_listening(), until) => confirmed,
            () = self.context.stop.cancelled() => return Err(Error::ShutDown),
        };
        self.watched = confirmed;
        Ok(confirmed)
    }

    /// The plan for the nap after `held`; starts (or keeps, or drops) the
    /// wait in the server for the holder's session that it blocks on.
    fn plan(&mut self, held: &Held) -> plan::Plan {
        // Read (and mark seen) the listener's state whether or not this
        // waiter is watched, so that an old change does not wake it.
        let connected = self
            .listening
            .as_mut()
            .is_some_and(|w| *w.borrow_and_update() == Listening::Yes);
        let seen = plan::Seen {
            expires_at: held.expires_at,
            checked_at: held.checked_at,
            delayed_until: held.delayed_until,
            pinned: held.pinned(),
            holder_session: held.holder_session,
            woken_by: self.woken_by,
            heard: self.watched && connected,
        };
        let plan = plan::plan(&seen, &mut self.counts);
        if self.session_wait.as_ref().map(|(pid, _)| *pid) != plan.block_on {
            let context = self.context;
            self.session_wait = plan.block_on.map(|pid| {
                let wait: SessionWait<'a> = Box::pin(session_ended(context, pid));
                (pid, wait)
            });
        }
        plan
    }

    /// Naps until `wake`, or until sooner: the name's release, the end of
    /// the holder's session blocked on, or a change in what the listener
    /// hears (then the name is watched again).
    async fn nap(&mut self, wake: Instant) -> Result<()> {
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(wake) => return Ok(()),
                () = session_over(&mut self.session_wait) => {
                    self.woken_by = self.session_wait.take().map(|(pid, _)| pid);
                    self.counts.exit_polls = 0;
                    return Ok(());
                }
                () = self.context.stop.cancelled() => return Err(Error::ShutDown),
                released = next_release(&mut self.releases) => match plan::heard(&released, self.name) {
                    Heard::Other => continue,
                    Heard::This => return Ok(()),
                    Heard::Rewatch => {
                        self.watched = false;
                        return Ok(());
                    }
                    Heard::Closed => {
                        self.releases = None;
                        return Ok(());
                    }
                },
                () = listening_changed(&mut self.listening) => {
                    self.watched = false;
                    return Ok(());
                }
            }
        }
    }
}

/// Resolves when the wait in the server for a holder's session does;
/// never without one.
async fn session_over(wait: &mut Option<(i32, SessionWait<'_>)>) {
    match wait {
        Some((_, wait)) => wait.as_mut().await,
        None => std::future::pending().await,
    }
}

/// The listener's next message about releases; never without a listener.
async fn next_release(
    releases: &mut Option<broadcast::Receiver<Option<String>>>,
) -> std::result::Result<Option<String>, broadcast::error::RecvError> {
    match releases {
        Some(receiver) => receiver.recv().await,
        None => std::future::pending().await,
    }
}

/// Resolves when whether the listener is connected changes (or it is
/// gone, then not again); never without a listener.
async fn listening_changed(listening: &mut Option<watch::Receiver<Listening>>) {
    match listening {
        Some(receiver) => {
            if receiver.changed().await.is_err() {
                *listening = None;
            }
        }
        None => std::future::pending().await,
    }
}
