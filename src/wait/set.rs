//! Several leases at once (`LeaseManager::acquire_all`): every lease of a
//! set or none, in one statement (`pglease.acquire_all`), waiting as a
//! single acquisition waits, on the name that blocked the last attempt.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::types::PgInterval;
use tokio::time::Instant;

use super::{
    Acquirer, Attempt, GiveBack, Held, Line, Waiter, Waiting, detached, line, plan, plan::Step,
};
use crate::context::Context;
use crate::db;
use crate::error::{Error, Result};
use crate::lease::{Lease, ttl_duration};
use crate::limits::MAX_SET_NAMES;
use crate::options::AcquireOptions;
use crate::sql;
use crate::telemetry;
use crate::token::Token;

/// What one attempt at a set gave: every lease, or the answer for the
/// first name that could not be taken.
enum SetAttempt {
    Acquired { leases: Vec<Lease>, sent: Instant },
    Held(Held),
}

/// Checks a set before anything is sent: 1 to [`MAX_SET_NAMES`] distinct
/// names, each and the rest of `how` as a single acquisition checks them;
/// a counted limit, a value and session binding are a single lease's.
/// Returns the TTL as the statement sends it.
pub(super) fn check(names: &[&str], how: &AcquireOptions) -> Result<PgInterval> {
    let invalid = |argument, reason: String| Error::InvalidInput { argument, reason };
    if names.is_empty() || names.len() > MAX_SET_NAMES {
        return Err(invalid(
            "names",
            format!("must hold 1 to {MAX_SET_NAMES} names, got {}", names.len()),
        ));
    }
    let mut seen = BTreeSet::new();
    if let Some(twice) = names.iter().find(|name| !seen.insert(**name)) {
        return Err(invalid(
            "names",
            format!("must differ, {twice:?} is there twice"),
        ));
    }
    let unsupported = if how.get_limit().is_some() {
        Some("limit")
    } else if how.get_value().is_some() {
        Some("value")
    } else if how.get_session_bound() {
        Some("session_bound")
    } else if how.get_shared() {
        Some("shared")
    } else {
        None
    };
    if let Some(argument) = unsupported {
        return Err(invalid(
            argument,
            "is for a single lease: acquire_all takes plain leases".to_owned(),
        ));
    }
    let mut ttl = None;
    for name in names {
        ttl = Some(how.check(name)?);
    }
    ttl.ok_or_else(|| invalid("names", "must hold a name".to_owned()))
}

/// One `pglease.acquire_all` statement (one round trip), and, if its
/// answer came late, the renewals that confirm it.
async fn attempt(
    context: &Context,
    names: &[String],
    ttl: PgInterval,
    how: &AcquireOptions,
    ticket: Option<i64>,
) -> Result<SetAttempt> {
    let holder = how.get_holder();
    let sent = Instant::now();
    let rows = sql::query(sql::acquire_all(names, holder.as_ref(), &ttl, ticket))
        .fetch_all(&context.pool)
        .await;
    context
        .counters
        .acquire_attempts
        .fetch_add(1, Ordering::Relaxed);
    let rows = rows.inspect_err(|_| telemetry::acquire_attempt("error"))?;
    let mut leases = Vec::with_capacity(rows.len());
    for row in &rows {
        let name: String = row.try_get("name")?;
        let token: Option<i64> = row.try_get("token")?;
        let current_holder: Option<String> = row.try_get("holder")?;
        let checked_at: DateTime<Utc> = row.try_get("checked_at")?;
        // A refusal with no time to give (none does today) is one that has
        // ended as it was decided.
        let expires_at: DateTime<Utc> = row
            .try_get::<Option<DateTime<Utc>>, _>("expires_at")?
            .unwrap_or(checked_at);
        let Some(token) = token else {
            let held = Held::refused_in(row, current_holder, expires_at, checked_at, name)?;
            return Ok(SetAttempt::Held(held));
        };
        leases.push(Lease::new(
            &name,
            current_holder.unwrap_or_else(|| holder.as_ref().to_owned()),
            Token::issued(token),
            expires_at,
            checked_at,
        ));
    }
    if leases.len() != names.len() {
        return Err(Error::Database(sqlx::Error::Protocol(format!(
            "pglease.acquire_all answered {} leases for {} names",
            leases.len(),
            names.len()
        ))));
    }
    telemetry::acquire_attempt("acquired");
    let window = context.options.confirm_after(ttl_duration(ttl));
    if sent.elapsed() <= window {
        return Ok(SetAttempt::Acquired { leases, sent });
    }
    confirm(context, leases, ttl).await
}

/// Confirms a set whose answer came late, one renewal per lease (see
/// `super::confirm`); if one fails, the whole set is given back.
async fn confirm(context: &Context, leases: Vec<Lease>, ttl: PgInterval) -> Result<SetAttempt> {
    let sent = Instant::now();
    let mut confirmed = Vec::with_capacity(leases.len());
    for lease in &leases {
        match db::renew(context, lease.fence(), ttl).await {
            Ok(expires_at) => confirmed.push(lease.clone().confirmed(expires_at)),
            Err(error) => {
                for lease in &leases {
                    context.release_in_background(lease.fence());
                }
                return Err(error);
            }
        }
    }
    Ok(SetAttempt::Acquired {
        leases: confirmed,
        sent,
    })
}

impl GiveBack for SetAttempt {
    fn give_back(self, context: &Context) {
        if let SetAttempt::Acquired { leases, .. } = self {
            for lease in &leases {
                context.release_in_background(lease.fence());
            }
        }
    }
}

/// One attempt at the set on a task of its own (see `super::detached`).
async fn attempt_detached(
    context: &Arc<Context>,
    names: &[String],
    ttl: PgInterval,
    how: &AcquireOptions,
    place: Option<&line::Place>,
) -> Result<SetAttempt> {
    let (names, how) = (names.to_vec(), how.clone());
    let ticket = place.map(line::Place::ticket);
    detached(context, move |context| async move {
        attempt(&context, &names, ttl, &how, ticket).await
    })
    .await
}

impl Acquirer {
    /// Acquires every lease of `names` or none, as `how` says (see
    /// `LeaseManager::acquire_all`); returns the leases in byte order of
    /// their names and when the statement that confirmed them was sent.
    pub(crate) async fn acquire_all(
        &self,
        names: &[&str],
        how: &AcquireOptions,
    ) -> Result<(Vec<Lease>, Instant)> {
        let ttl = check(names, how)?;
        let context = &self.context;
        if context.is_shut_down() {
            return Err(Error::ShutDown);
        }
        let mut names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
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
            let outcome = attempt_detached(context, &names, ttl, how, line.place.as_ref()).await;
            if line.ended(&outcome)? {
                continue;
            }
            let now = Instant::now();
            let held = match outcome {
                Ok(SetAttempt::Acquired { leases, sent }) => {
                    line.taken();
                    telemetry::acquisition("acquired", Some(start.elapsed()));
                    return Ok((leases, sent));
                }
                Ok(SetAttempt::Held(held)) => Ok(Attempt::Held(held)),
                Err(error) => Err(error),
            };
            let held = match plan::step(held, now >= deadline) {
                Step::Take { .. } | Step::Retry => continue,
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
            if line.join(context, &names, how, false, &ttl).await? {
                continue;
            }
            let Some(blocking) = names.iter().find(|n| **n == held.slot) else {
                return Err(Error::Database(sqlx::Error::Protocol(format!(
                    "pglease.acquire_all refused {:?}, which was not asked for",
                    held.slot
                ))));
            };
            let waiter = match &mut waiter {
                Some(w) if w.name == blocking.as_str() => w,
                slot => slot.insert(Waiter::new(context, blocking, deadline)),
            };
            waiter.seen_expiry = held.holder_expiry();
            waiter.listen(false);
            if waiter.watch(held.pinned()).await? {
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
