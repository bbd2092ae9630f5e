//! The comparison's harness: the scratch table, the writes, the clock, and
//! the locks of the second worker.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, PgConnection};

use pglease::advisory::{SessionLock, XactLock};
use pglease::{Error, Fence, LeaseManager, Result};

use super::{Outcome, Scenario, Variant};

pub(super) fn unique() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub(super) struct Harness {
    pub(super) m: LeaseManager,
    pub(super) table: String,
    pub(super) tag: String,
    pub(super) unit: Duration,
}

impl Harness {
    pub(super) async fn run(&self, scenario: Scenario, variant: Variant) -> Result<Outcome> {
        let name = format!("compare-{}-{:?}-{:?}", self.tag, scenario, variant);
        self.reset().await?;
        let (safe, took_over, detail) = match (scenario, variant) {
            (Scenario::PausedHolder, Variant::Lease) => self.paused_lease(&name).await?,
            (Scenario::PausedHolder, _) => self.paused_lock(&name, variant).await?,
            (Scenario::KilledConnection, Variant::Lease) => self.killed_lease(&name).await?,
            (Scenario::KilledConnection, Variant::SessionLock) => {
                self.killed_session(&name).await?
            }
            (Scenario::KilledConnection, Variant::XactLock) => self.killed_xact(&name).await?,
            (Scenario::DeadHolder, Variant::Lease) => self.dead_lease(&name).await?,
            (Scenario::DeadHolder, _) => self.dead_lock(&name, variant).await?,
            (Scenario::DuplicateRelease, Variant::Lease) => self.duplicate_lease(&name).await?,
            (Scenario::DuplicateRelease, Variant::SessionLock) => {
                self.duplicate_session(&name).await?
            }
            (Scenario::DuplicateRelease, Variant::XactLock) => self.duplicate_xact(&name).await?,
            (Scenario::RenewalTimeout, Variant::Lease) => self.timeout_lease(&name).await?,
            (Scenario::RenewalTimeout, Variant::SessionLock) => self.timeout_session(&name).await?,
            (Scenario::RenewalTimeout, Variant::XactLock) => self.timeout_xact(&name).await?,
        };
        Ok(Outcome {
            scenario,
            variant,
            safe,
            took_over,
            detail,
        })
    }

    /// Worker A's session lock on `name` (which nobody else holds yet).
    pub(super) async fn session(&self, name: &str) -> Result<SessionLock> {
        self.m
            .try_session_lock(name)
            .await?
            .ok_or_else(|| held(name))
    }

    /// Worker A's transaction lock on `name`.
    pub(super) async fn xact(&self, name: &str) -> Result<XactLock> {
        self.m.try_xact_lock(name).await?.ok_or_else(|| held(name))
    }

    pub(super) fn ttl(&self) -> Duration {
        self.unit * 2
    }

    pub(super) async fn reset(&self) -> Result<()> {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} VALUES (1, 'initial') ON CONFLICT (id) DO UPDATE SET value = 'initial'",
            self.table
        )))
        .execute(self.m.pool())
        .await?;
        Ok(())
    }

    pub(super) fn update(&self) -> String {
        format!("UPDATE {} SET value = $1 WHERE id = 1", self.table)
    }

    /// An unguarded write on any connection.
    pub(super) async fn write(&self, conn: &mut PgConnection, who: &str) -> Result<()> {
        sqlx::query(AssertSqlSafe(self.update()))
            .bind(who)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// A write through a fresh connection of the pool.
    pub(super) async fn write_fresh(&self, who: &str) -> Result<()> {
        let mut conn = self.m.pool().acquire().await?;
        self.write(&mut conn, who).await
    }

    /// A fenced write: `Ok(true)` if it committed, `Ok(false)` if the
    /// database rejected the token (LE001).
    pub(super) async fn fenced_write(&self, lease: &Fence, who: &str) -> Result<bool> {
        let update = self.update();
        let outcome = self
            .m
            .fenced(lease, async |conn| {
                sqlx::query(AssertSqlSafe(update))
                    .bind(who)
                    .execute(&mut *conn)
                    .await
                    .map_err(Error::from)?;
                Ok::<_, Error>(())
            })
            .await;
        match outcome {
            Ok(()) => Ok(true),
            Err(Error::NotHeld { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn value(&self) -> Result<String> {
        let value: String = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT value FROM {} WHERE id = 1",
            self.table
        )))
        .fetch_one(self.m.pool())
        .await?;
        Ok(value)
    }

    pub(super) async fn db_now(&self) -> Result<DateTime<Utc>> {
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(self.m.pool())
            .await?;
        Ok(now)
    }

    /// Sleeps until the database clock is past `instant` (a pause that
    /// outlasts a lease, by the clock that decides expiry).
    pub(super) async fn pause_until(&self, instant: DateTime<Utc>) -> Result<()> {
        loop {
            let now = self.db_now().await?;
            if now > instant {
                return Ok(());
            }
            let left = (instant - now).to_std().unwrap_or_default();
            tokio::time::sleep(left.min(self.unit) + Duration::from_millis(1)).await;
        }
    }

    pub(super) async fn terminate(&self, pid: i32) -> Result<()> {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(self.m.pool())
            .await?;
        Ok(())
    }

    /// Polls `try_session_lock` for worker B until it succeeds or `limit`
    /// passes; returns the lock and how long it took.
    pub(super) async fn b_session_lock(
        &self,
        name: &str,
        limit: Duration,
    ) -> Result<Option<(SessionLock, Duration)>> {
        poll_lock(limit, || self.m.try_session_lock(name)).await
    }

    /// The same with `try_xact_lock`.
    pub(super) async fn b_xact_lock(
        &self,
        name: &str,
        limit: Duration,
    ) -> Result<Option<(XactLock, Duration)>> {
        poll_lock(limit, || self.m.try_xact_lock(name)).await
    }
}

/// Calls `attempt` every 2 ms until it yields a lock or `limit` passes.
pub(super) async fn poll_lock<L, F, Fut>(
    limit: Duration,
    mut attempt: F,
) -> Result<Option<(L, Duration)>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<L>>>,
{
    let start = Instant::now();
    loop {
        if let Some(lock) = attempt().await? {
            return Ok(Some((lock, start.elapsed())));
        }
        if start.elapsed() > limit {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

pub(super) fn pick(flag: bool, yes: &'static str, no: &'static str) -> &'static str {
    if flag { yes } else { no }
}

pub(super) fn held(name: &str) -> Error {
    Error::Held {
        name: name.to_owned(),
        holder: "another session".to_owned(),
        expires_at: DateTime::<Utc>::MAX_UTC,
    }
}

/// Sends an unlock for the lock's key on its connection without giving the
/// lock up locally: what a delayed duplicate release does. Session locks
/// count: after lock, unlock, lock, a duplicate unlock frees the second hold.
pub(super) async fn unlock_once(lock: &mut SessionLock) -> Result<bool> {
    let key = lock.key();
    let Some(conn) = lock.connection() else {
        return Ok(false);
    };
    Ok(sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .fetch_one(conn)
        .await?)
}

/// Takes the lock again on the same connection (session locks are
/// re-entrant: each lock needs its own unlock).
pub(super) async fn relock(lock: &mut SessionLock) -> Result<bool> {
    let key = lock.key();
    let Some(conn) = lock.connection() else {
        return Ok(false);
    };
    Ok(sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(conn)
        .await?)
}
