//! The one-statement operations on the pool: those that more than one
//! layer sends (the manager's methods, held leases, waiting
//! acquisitions), and every statement of the facade and the modules on
//! its surface (`manager`, `history`, `elect`, `observe`), which send
//! none themselves. Each is one round trip, its SQL in [`crate::sql`]; a
//! caller checks its inputs first, and decodes rows into types of its
//! own layer where they are not known here.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgArguments, PgPool, PgRow, Postgres};
use sqlx::query::Query;

use crate::context::Context;

use crate::error::{Error, LossReason, NotHeldReason, Result};
use crate::lease::{Fence, LeaseStatus, ListFilter, SharedHolder};
use crate::sql;
use crate::token::Token;

/// Extends the lease to database-now + `ttl`; [`Error::Lost`] with the
/// reason if the token is no longer valid.
#[tracing::instrument(name = "pglease.renew", level = "debug", skip_all,
                      fields(name = fence.name(), token = fence.token().get()))]
pub(crate) async fn renew(
    context: &Context,
    fence: &Fence,
    ttl: PgInterval,
) -> Result<DateTime<Utc>> {
    let row = fetch_hot(
        context,
        || {
            sqlx::query(sql::RENEW_PREPARED)
                .bind(fence.name())
                .bind(fence.token())
                .bind(ttl)
        },
        || sql::renew(fence.name(), fence.token(), &ttl),
    )
    .await?;
    let expires_at: Option<DateTime<Utc>> = row.try_get(0)?;
    match expires_at {
        Some(expires_at) => Ok(expires_at),
        None => Err(lost(&context.pool, fence).await),
    }
}

/// Sends one of the statements the manager may prepare (acquire, renew,
/// release): `prepared` when it prepares, else `text` (see
/// `ManagerOptions::prepared_statements`). A prepared statement that the
/// server session does not have did not run: the manager stops preparing
/// and the call goes again, as text. Cancel-safe as one statement is.
pub(crate) async fn fetch_hot<'q>(
    context: &Context,
    prepared: impl FnOnce() -> Query<'q, Postgres, PgArguments>,
    text: impl FnOnce() -> String,
) -> sqlx::Result<PgRow> {
    if context.prepared() {
        match prepared().fetch_one(&context.pool).await {
            Err(error) if crate::sqlstate::not_prepared(&error) => context.stop_preparing(&error),
            row => return row,
        }
    }
    sql::query(text()).fetch_one(&context.pool).await
}

/// Publishes `value` (or clears it) under a valid token; [`Error::Lost`]
/// with the reason if the token is no longer valid.
#[tracing::instrument(name = "pglease.set_value", level = "debug", skip_all,
                      fields(name = fence.name(), token = fence.token().get()))]
pub(crate) async fn set_value(pool: &PgPool, fence: &Fence, value: Option<&str>) -> Result<()> {
    let row = sql::query(sql::set_value(fence.name(), fence.token(), value))
        .fetch_one(pool)
        .await?;
    if row.try_get(0)? {
        Ok(())
    } else {
        Err(lost(pool, fence).await)
    }
}

/// Ends the lease if the token is valid; whether it did.
#[tracing::instrument(name = "pglease.release", level = "debug", skip_all,
                      fields(name = fence.name(), token = fence.token().get()))]
pub(crate) async fn release(context: &Context, fence: &Fence) -> Result<bool> {
    let row = fetch_hot(
        context,
        || {
            sqlx::query(sql::RELEASE_PREPARED)
                .bind(fence.name())
                .bind(fence.token())
        },
        || sql::release(fence.name(), fence.token()),
    )
    .await?;
    Ok(row.try_get(0)?)
}

/// [`release`] for a fence from outside (not a lease this process
/// holds): [`Error::NotHeld`] for a token the lease never had, and
/// [`Error::Lost`] with [`LossReason::Forgotten`] for an acquisition the
/// database forgot in a change of timeline, rather than `false`, which
/// says it had ended (one extra read, when it was not released).
pub(crate) async fn release_checked(context: &Context, fence: &Fence) -> Result<bool> {
    if release(context, fence).await? {
        return Ok(true);
    }
    match fence_status(&context.pool, fence).await? {
        Some(found @ (Found::NeverHeld(_) | Found::Forgotten(_))) => Err(found.into_error(fence)),
        _ => Ok(false),
    }
}

/// The status view's row for `name` (checked by the caller).
#[tracing::instrument(name = "pglease.inspect", level = "debug", skip_all, fields(name))]
pub(crate) async fn inspect(pool: &PgPool, name: &str) -> Result<LeaseStatus> {
    let row = sql::query(sql::inspect(name)).fetch_optional(pool).await?;
    match row {
        Some(row) => LeaseStatus::from_row(&row),
        None => Ok(LeaseStatus::never_acquired(name)),
    }
}

/// What the database says of `fence` now (one read of the status view):
/// `Ok(None)` while it is held under that token; else why not, as a loss
/// ([`Found::Lost`]), as an acquisition the database forgot in a change of
/// timeline ([`Found::Forgotten`]), or, for a token this lease has never
/// had, as a refusal ([`Found::NeverHeld`]: the caller's mistake, not a
/// loss).
pub(crate) async fn fence_status(pool: &PgPool, fence: &Fence) -> Result<Option<Found>> {
    let row = sql::query(sql::fence_status(fence)).fetch_one(pool).await?;
    let forgotten_in: Option<i64> = row.try_get("forgotten_in")?;
    if fence.is_shared() {
        // A shared holder's row is gone once it has ended (released, or
        // expired and purged): which of the two is not kept.
        return Ok(
            match (forgotten_in, row.try_get::<bool, _>("shared_held")?) {
                (Some(timeline), _) => Some(Found::Forgotten(timeline)),
                (None, true) => None,
                (None, false) => Some(Found::Lost(LossReason::Expired)),
            },
        );
    }
    let status = match row.try_get::<Option<String>, _>("name")? {
        Some(_) => LeaseStatus::from_row(&row)?,
        None => LeaseStatus::never_acquired(fence.name()),
    };
    Ok(found(&status, fence, forgotten_in))
}

/// A fence that the database does not accept, and why.
pub(crate) enum Found {
    /// The lease was held under the token, and is no longer.
    Lost(LossReason),
    /// The database changed timeline (a failover or a restore) and does
    /// not know the acquisition under the token: lost, for its holder;
    /// never issued, for anyone else who shows the token.
    Forgotten(i64),
    /// The token was never issued for this lease.
    NeverHeld(NotHeldReason),
}

/// [`fence_status`]'s decision, from a status row read for `fence` and the
/// timeline whose change made the database forget the acquisition.
fn found(status: &LeaseStatus, fence: &Fence, forgotten_in: Option<i64>) -> Option<Found> {
    if let Some(timeline) = forgotten_in {
        return Some(Found::Forgotten(timeline));
    }
    match status.token {
        None => Some(Found::NeverHeld(NotHeldReason::NeverAcquired)),
        Some(current) if current < fence.token() => {
            Some(Found::NeverHeld(NotHeldReason::NotIssued {
                current_token: current,
            }))
        }
        Some(current) if current == fence.token() && status.held => None,
        Some(current) if current == fence.token() && status.holder.is_none() => {
            Some(Found::Lost(LossReason::Released))
        }
        Some(current) if current == fence.token() && status.session_ended => {
            Some(Found::Lost(LossReason::SessionEnded))
        }
        Some(_) => Some(Found::Lost(LossReason::Stale {
            current_token: status.token,
            current_holder: status.holder.clone(),
        })),
    }
}

impl Found {
    /// The error for an operation under `fence` that the database refused.
    pub(crate) fn into_error(self, fence: &Fence) -> Error {
        match self {
            Found::Lost(reason) => Error::Lost {
                name: fence.name().to_owned(),
                token: fence.token(),
                reason,
            },
            Found::Forgotten(timeline) => Error::Lost {
                name: fence.name().to_owned(),
                token: fence.token(),
                reason: LossReason::Forgotten { timeline },
            },
            Found::NeverHeld(reason) => Error::NotHeld {
                name: fence.name().to_owned(),
                token: Some(fence.token()),
                reason,
            },
        }
    }
}

/// The error for an operation under `fence` that the database refused,
/// with the reason read from the status view (one extra read, on the
/// failure path only).
async fn lost(pool: &PgPool, fence: &Fence) -> Error {
    match fence_status(pool, fence).await {
        Ok(Some(found)) => found.into_error(fence),
        // Valid again by now (a retry of a renewal whose first answer was
        // lost): still, this statement changed nothing.
        Ok(None) => Error::Lost {
            name: fence.name().to_owned(),
            token: fence.token(),
            reason: LossReason::Stale {
                current_token: Some(fence.token()),
                current_holder: None,
            },
        },
        Err(error) => error,
    }
}

/// The first column of the one row `statement` answers.
async fn scalar<T>(pool: &PgPool, statement: String) -> Result<T>
where
    T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    let row = sql::query(statement).fetch_one(pool).await?;
    Ok(row.try_get(0)?)
}

/// Asks the holder of `name` to step down on behalf of `by`; the token
/// asked, if anyone held it.
pub(crate) async fn request_step_down(
    pool: &PgPool,
    name: &str,
    by: &str,
) -> Result<Option<Token>> {
    let token: Option<i64> = scalar(pool, sql::request_step_down(name, by)).await?;
    Ok(token.map(Token::issued))
}

/// `pglease.hand_over`: the successor's token, or `None` when it did not
/// wait (the lease released if `or_release`, else kept).
pub(crate) async fn hand_over(
    pool: &PgPool,
    fence: &Fence,
    successor: &str,
    ttl: &PgInterval,
    or_release: bool,
) -> Result<Option<Token>> {
    let token: Option<i64> =
        scalar(pool, sql::hand_over(fence, successor, ttl, or_release)).await?;
    Ok(token.map(Token::issued))
}

/// Whether `successor` waits in the line of `fence`'s lease.
pub(crate) async fn successor_waits(pool: &PgPool, fence: &Fence, successor: &str) -> Result<bool> {
    scalar(pool, sql::successor_waits(fence, successor)).await
}

/// The status of the leases `filter` keeps.
pub(crate) async fn list(pool: &PgPool, filter: &ListFilter) -> Result<Vec<LeaseStatus>> {
    let rows = sql::query(sql::list(filter)).fetch_all(pool).await?;
    rows.iter().map(LeaseStatus::from_row).collect()
}

/// Records `token` for `resource`; whether it is at least the highest seen.
pub(crate) async fn admit(pool: &PgPool, resource: &str, token: Token) -> Result<bool> {
    scalar(pool, sql::admit(resource, token)).await
}

/// Whether the functions' owner may end stale fenced sessions.
pub(crate) async fn can_end_stale_transactions(pool: &PgPool) -> Result<bool> {
    let can: Option<bool> = scalar(pool, sql::CAN_END_STALE.to_owned()).await?;
    Ok(can.unwrap_or(false))
}

/// The role that owns the `pglease` functions.
pub(crate) async fn functions_owner(pool: &PgPool) -> Result<String> {
    scalar(pool, sql::FUNCTIONS_OWNER.to_owned()).await
}

/// The database server's clock now.
pub(crate) async fn database_time(pool: &PgPool) -> Result<DateTime<Utc>> {
    scalar(pool, sql::DATABASE_TIME.to_owned()).await
}

/// How many lease names the database knows.
pub(crate) async fn count_leases(pool: &PgPool) -> Result<u64> {
    let count: i64 = scalar(pool, sql::COUNT_LEASES.to_owned()).await?;
    Ok(u64::try_from(count).unwrap_or_default())
}

/// Changes a group's partition count; the count before.
pub(crate) async fn set_group_partitions(
    pool: &PgPool,
    group: &str,
    partitions: u32,
) -> Result<u32> {
    let before: i32 = scalar(pool, sql::set_group_partitions(group, partitions)).await?;
    Ok(u32::try_from(before).unwrap_or(0))
}

/// Every lease group, by name.
pub(crate) async fn groups(pool: &PgPool) -> Result<Vec<crate::GroupSummary>> {
    let rows = sql::query(sql::GROUPS).fetch_all(pool).await?;
    rows.iter()
        .map(|row| {
            Ok(crate::GroupSummary {
                name: row.try_get("name")?,
                partitions: u32::try_from(row.try_get::<i32, _>("partitions")?).unwrap_or(0),
                members: u32::try_from(row.try_get::<i64, _>("members")?).unwrap_or(0),
                owned: u32::try_from(row.try_get::<i64, _>("owned")?).unwrap_or(0),
                created_by: row.try_get("created_by")?,
                created_at: row.try_get("created_at")?,
            })
        })
        .collect()
}

/// The valid shared holders of `name`, the first acquired first.
pub(crate) async fn shared_holders(pool: &PgPool, name: &str) -> Result<Vec<SharedHolder>> {
    let rows = sql::query(sql::shared_holders(name))
        .fetch_all(pool)
        .await?;
    rows.iter().map(SharedHolder::from_row).collect()
}

/// Makes every waiter for `name` wait in line, or undoes it.
pub(crate) async fn set_fair(pool: &PgPool, name: &str, fair: bool) -> Result<()> {
    sql::query(sql::set_fair(name, fair)).execute(pool).await?;
    Ok(())
}

/// Protects `table` with lease `name`.
pub(crate) async fn protect(pool: &PgPool, table: &str, name: &str) -> Result<()> {
    sql::query(sql::protect(table, name)).execute(pool).await?;
    Ok(())
}

/// Removes `table`'s protection; whether it was protected.
pub(crate) async fn unprotect(pool: &PgPool, table: &str) -> Result<bool> {
    scalar(pool, sql::unprotect(table)).await
}

/// Turns the DDL fence on or off; whether it was on.
pub(crate) async fn fence_ddl(pool: &PgPool, on: bool) -> Result<bool> {
    scalar(pool, sql::fence_ddl(on)).await
}

/// The rows of `pglease.timelines`, oldest first (decoded by `history`).
pub(crate) async fn timeline_changes(pool: &PgPool) -> Result<Vec<PgRow>> {
    Ok(sql::query(sql::TIMELINE_CHANGES).fetch_all(pool).await?)
}

/// The rows of `pglease.history` for `name` from `since` on, with the
/// changes of timeline (decoded by `history`).
pub(crate) async fn history(
    pool: &PgPool,
    name: &str,
    since: Option<DateTime<Utc>>,
) -> Result<Vec<PgRow>> {
    Ok(sql::query(sql::history(name, since))
        .fetch_all(pool)
        .await?)
}

/// Ends `name` at once, moving its fence; the token ended, if any.
pub(crate) async fn force_release(
    pool: &PgPool,
    name: &str,
    reason: &str,
) -> Result<Option<Token>> {
    let token: Option<i64> = scalar(pool, sql::force_release(name, reason)).await?;
    Ok(token.map(Token::issued))
}
