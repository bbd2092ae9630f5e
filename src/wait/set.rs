//! Several leases at once (`LeaseManager::acquire_all`): every lease of a
//! set or none, in one statement (`pglease.acquire_all`), waiting as a
//! single acquisition waits, on the name that blocked the last attempt.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use sqlx::Row;
use sqlx::postgres::types::PgInterval;
use tokio::time::Instant;

use super::{Acquirer, Acquisition, Answer, Attempt, Refusal, confirm};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::lease::{Lease, ttl_duration};
use crate::limits::MAX_SET_NAMES;
use crate::options::AcquireOptions;
use crate::sql;
use crate::telemetry;

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

/// Every name of a set, in byte order (`LeaseManager::acquire_all`).
struct Set {
    names: Vec<String>,
    ttl: PgInterval,
    how: AcquireOptions,
}

impl Acquisition for Set {
    type Won = Vec<Lease>;

    fn names(&self) -> &[String] {
        &self.names
    }

    async fn attempt(&self, context: &Context, ticket: Option<i64>) -> Result<Attempt<Vec<Lease>>> {
        attempt(context, &self.names, self.ttl, &self.how, ticket).await
    }

    /// The name that could not be taken: the one waited for.
    fn blocking(&self, refusal: &Refusal) -> Result<&str> {
        match self.names.iter().find(|name| **name == refusal.slot) {
            Some(name) => Ok(name),
            None => Err(Error::Database(sqlx::Error::Protocol(format!(
                "pglease.acquire_all refused {:?}, which was not asked for",
                refusal.slot
            )))),
        }
    }
}

/// One `pglease.acquire_all` statement (one round trip), and, if its
/// answer came late, the renewals that confirm it.
async fn attempt(
    context: &Context,
    names: &[String],
    ttl: PgInterval,
    how: &AcquireOptions,
    ticket: Option<i64>,
) -> Result<Attempt<Vec<Lease>>> {
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
        let answer = Answer::read(row)?;
        let Some(token) = answer.token else {
            return Ok(Attempt::Refused(Refusal::refused_in(row, answer, name)?));
        };
        leases.push(answer.lease(&name, token, holder.as_ref()));
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
        return Ok(Attempt::Acquired { won: leases, sent });
    }
    confirm(context, leases, ttl).await
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
        let mut names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        let set = Set {
            names,
            ttl,
            how: how.clone(),
        };
        self.run(set, how, ttl).await
    }
}
