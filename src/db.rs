//! The one-statement operations that more than one layer sends (the
//! manager's methods, held leases, waiting acquisitions): each is one
//! round trip on the pool, its SQL in [`crate::sql`].

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgPool;
use sqlx::postgres::types::PgInterval;

use crate::error::{Error, LossReason, Result};
use crate::lease::{Fence, LeaseStatus};
use crate::sql;

/// Extends the lease to database-now + `ttl`; [`Error::Lost`] with the
/// reason if the token is no longer valid.
#[tracing::instrument(name = "pglease.renew", level = "debug", skip_all,
                      fields(name = fence.name(), token = fence.token().get()))]
pub(crate) async fn renew(pool: &PgPool, fence: &Fence, ttl: PgInterval) -> Result<DateTime<Utc>> {
    let row = sql::query(sql::renew(fence.name(), fence.token(), &ttl))
        .fetch_one(pool)
        .await?;
    let expires_at: Option<DateTime<Utc>> = row.try_get(0)?;
    match expires_at {
        Some(expires_at) => Ok(expires_at),
        None => Err(lost(pool, fence).await),
    }
}

/// Publishes `value` (or clears it) under a valid token; [`Error::Lost`]
/// with the reason if the token is no longer valid.
#[tracing::instrument(name = "pglease.proclaim", level = "debug", skip_all,
                      fields(name = fence.name(), token = fence.token().get()))]
pub(crate) async fn proclaim(pool: &PgPool, fence: &Fence, value: Option<&str>) -> Result<()> {
    let row = sql::query(sql::proclaim(fence.name(), fence.token(), value))
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
pub(crate) async fn release(pool: &PgPool, fence: &Fence) -> Result<bool> {
    let row = sql::query(sql::release(fence.name(), fence.token()))
        .fetch_one(pool)
        .await?;
    Ok(row.try_get(0)?)
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

/// The error for a lease that a renewal found lost, with the reason read
/// from the status view (one extra read, on the failure path only).
async fn lost(pool: &PgPool, fence: &Fence) -> Error {
    let reason = match inspect(pool, fence.name()).await {
        Ok(status) if status.token == Some(fence.token()) && status.holder.is_none() => {
            LossReason::Released
        }
        Ok(status) => LossReason::Stale {
            current_token: status.token,
            current_holder: status.holder,
        },
        Err(error) => return error,
    };
    Error::Lost {
        name: fence.name().to_owned(),
        token: fence.token(),
        reason,
    }
}
