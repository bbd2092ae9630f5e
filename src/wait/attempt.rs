//! One acquisition attempt: the statement (on the pool, or on the
//! manager's session for session-bound leases), its answer (a win, or
//! what an attempt that did not acquire saw), and the renewal that
//! confirms a win whose answer came late.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{Connection, Row};
use tokio::time::Instant;

use super::plan;
use crate::context::Context;
use crate::db;
use crate::error::{Error, Result};
use crate::lease::{Lease, ttl_duration};
use crate::options::AcquireOptions;
use crate::sql;
use crate::telemetry;
use crate::token::Token;

/// The outcome of one acquisition statement, for what it would win: a
/// lease, or a set's leases.
pub(super) enum Attempt<W> {
    Acquired {
        won: W,
        /// The instant the term is counted from (the start of the local
        /// deadline): the acquisition's send, earlier by what a term
        /// handed over lacks of the TTL (`plan::counted_from`), or the
        /// send of the renewal that confirmed a late or short one.
        sent: Instant,
    },
    /// Not acquired: held, ended but pinned, or refused for a grant delay.
    Refused(Refusal),
}

/// The part of an answer row of `pglease.acquire` or `acquire_all` that
/// every answer has.
pub(super) struct Answer {
    /// The token drawn; none if refused.
    pub(super) token: Option<i64>,
    /// The holder (the one granted, or the one that kept it).
    pub(super) holder: Option<String>,
    pub(super) expires_at: DateTime<Utc>,
    /// The database time of the decision.
    pub(super) checked_at: DateTime<Utc>,
}

impl Answer {
    /// The answer `row` gives.
    pub(super) fn read(row: &PgRow) -> sqlx::Result<Answer> {
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
    pub(super) fn lease(self, slot: &str, token: i64, holder: &str) -> Lease {
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
pub(super) struct Refusal {
    /// The current or last holder (`None` once released).
    pub(super) holder: Option<String>,
    pub(super) expires_at: DateTime<Utc>,
    /// The database time of the decision, to turn `expires_at` into a
    /// wait without comparing clocks.
    pub(super) checked_at: DateTime<Utc>,
    /// Why an ended lease could not be taken.
    pub(super) note: Option<String>,
    /// The lease the answer describes: the name, or for a counted lease
    /// the slot that expires first.
    pub(super) slot: String,
    /// The process id of the server session a session-bound holder's
    /// lease is bound to.
    pub(super) holder_session: Option<i32>,
    /// Refused for the grant delay after a change of timeline: until when
    /// (database clock).
    pub(super) delayed_until: Option<DateTime<Utc>>,
    /// How many wait in line before this acquisition (with a place in
    /// line, or when the line refused it).
    pub(super) ahead: Option<i32>,
    /// Every waiter for the name waits in line (`pglease.set_fair`).
    pub(super) fair: bool,
}

impl Refusal {
    /// A refusal as an answer row of `pglease.acquire` or `acquire_all`
    /// says it (its `answer` already read), about `slot`; counted in
    /// telemetry.
    pub(super) fn refused_in(row: &PgRow, answer: Answer, slot: String) -> sqlx::Result<Refusal> {
        let refusal = Refusal {
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
        telemetry::acquire_attempt(refusal.refused().label());
        Ok(refusal)
    }

    /// Whether the lease has ended and is only pinned (see [`pinned`]).
    pub(super) fn pinned(&self) -> bool {
        pinned(self.holder.as_deref(), self.expires_at, self.checked_at)
    }

    /// Whether others wait in line before this acquisition.
    pub(super) fn in_line(&self) -> bool {
        self.ahead.is_some_and(|ahead| ahead > 0)
    }

    /// Why the lease was not acquired.
    pub(super) fn refused(&self) -> plan::Refused {
        plan::Refused::of(self.delayed_until.is_some(), self.pinned(), self.in_line())
    }

    /// The holder's expiry, if there is a holder (a released lease has
    /// none): what a takeover's delay is counted from.
    pub(super) fn holder_expiry(&self) -> Option<DateTime<Utc>> {
        self.holder.as_ref().map(|_| self.expires_at)
    }

    /// The error to report, naming the slot the answer describes (a
    /// counted lease's, or the name): [`Error::Pinned`] when the lease has
    /// ended but a stale fenced transaction still holds it,
    /// [`Error::GrantDelayed`] during a grant delay.
    pub(super) fn into_error(self) -> Error {
        let refused = self.refused();
        let pinned = self.pinned();
        let Refusal {
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
pub(super) fn pinned(
    holder: Option<&str>,
    expires_at: DateTime<Utc>,
    checked_at: DateTime<Utc>,
) -> bool {
    holder.is_none() || expires_at <= checked_at
}

/// What an acquisition wins: one lease, or a set's leases.
pub(super) trait Won: Send + 'static {
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

/// One acquisition statement (one round trip), and, if its answer came
/// late, the renewal that confirms it.
#[tracing::instrument(name = "pglease.acquire", level = "debug", skip_all,
                      fields(name, holder, token = tracing::field::Empty))]
pub(super) async fn attempt(
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
        return Ok(Attempt::Refused(Refusal::refused_in(&row, answer, slot)?));
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
pub(super) async fn acquire_row(
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
pub(super) async fn on_session(context: &Context, statement: String) -> sqlx::Result<PgRow> {
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
pub(super) type SessionWait<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Resolves once the server session with process id `pid` has ended (or
/// given up its wake-up lock; see SESSION-BOUND LEASES in the schema):
/// blocks in the server, on a connection of its own, on a shared lock of
/// the key that session holds, in transactions of at most half a second
/// so that a dropped wait leaves the server nothing for longer. Never
/// resolves if the connection cannot be had (the waiter's other wake-ups
/// remain). Cancel-safe: dropping it closes the connection.
pub(super) async fn session_ended(context: &Context, pid: i32) {
    let blocked = async {
        let mut connection = PgConnection::connect_with(&context.pool.connect_options()).await?;
        loop {
            match sql::query(sql::session_wake(pid))
                .execute(&mut connection)
                .await
            {
                Ok(_) => return sqlx::Result::Ok(()),
                Err(e) if crate::sqlstate::lock_timed_out(&e) => {}
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
pub(super) async fn confirm<W: Won>(
    context: &Context,
    mut won: W,
    ttl: PgInterval,
) -> Result<Attempt<W>> {
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
