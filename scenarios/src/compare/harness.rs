//! What the demo's contenders share: the manager (A and B are two workers
//! of one process, on one pool), the ledger, the resource's name, the
//! unit every timing is a multiple of, and the database's clock.

use std::time::{Duration, Instant};

use sqlx::PgConnection;

use pglease::{Error, Fence, LeaseManager};

use crate::engine::{BoxError, Ledger, Scenario, Who, Written};

pub(super) fn unique() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One scenario's setting for one contender.
pub(super) struct Ctx {
    pub(super) m: LeaseManager,
    pub(super) ledger: Ledger,
    /// The lease or lock name, of this scenario and contender only.
    pub(super) name: String,
    pub(super) unit: Duration,
    pub(super) scenario: Scenario,
}

/// How long B tries to take over in each scenario, in units.
pub(super) fn window(unit: Duration, scenario: Scenario) -> Duration {
    match scenario {
        // A's pause: longer than a lease's TTL (two units).
        Scenario::PausedHolder => unit * 3,
        Scenario::KilledConnection | Scenario::DeadHolder => unit * 10,
        // One attempt, right after the late release.
        Scenario::LateRelease => Duration::ZERO,
        // Three of a renewing lease's TTLs (three units).
        Scenario::SilentRenewal => unit * 9,
    }
}

impl Ctx {
    /// An unguarded write on `conn`.
    pub(super) async fn write_on(&self, conn: &mut PgConnection, who: Who) -> Result<(), Error> {
        sqlx::query(sqlx::AssertSqlSafe(self.ledger.insert()))
            .bind(who.name())
            .execute(conn)
            .await?;
        Ok(())
    }

    /// An unguarded write through a fresh connection of the pool.
    pub(super) async fn write_fresh(&self, who: Who) -> Result<Written, BoxError> {
        let mut conn = self.m.pool().acquire().await?;
        self.write_on(&mut conn, who).await?;
        Ok(Written::Committed)
    }

    /// A fenced write: refused if the database rejected the token (LE001),
    /// which the refusal says.
    pub(super) async fn fenced_write(&self, lease: &Fence, who: Who) -> Result<Written, BoxError> {
        let insert = self.ledger.insert();
        let outcome = self
            .m
            .fenced(lease, async |conn| {
                sqlx::query(sqlx::AssertSqlSafe(insert))
                    .bind(who.name())
                    .execute(&mut *conn)
                    .await
                    .map_err(Error::from)?;
                Ok::<_, Error>(())
            })
            .await;
        match outcome {
            Ok(()) => Ok(Written::Committed),
            Err(e @ Error::NotHeld { .. }) => Ok(rejected(&e)),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) async fn terminate(&self, pid: i32) -> Result<(), Error> {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(self.m.pool())
            .await?;
        Ok(())
    }
}

/// A write the database refused under a stale token ([`Error::NotHeld`]
/// is its SQLSTATE LE001), saying so.
pub(super) fn rejected(e: &Error) -> Written {
    Written::Refused(format!("by PostgreSQL (LE001): {e}"))
}

/// Calls `attempt` every 2 ms until it yields a lock or `limit` passes
/// (once if `limit` is zero).
pub(super) async fn poll_lock<L, F, Fut>(
    limit: Duration,
    mut attempt: F,
) -> Result<Option<L>, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<L>, Error>>,
{
    let start = Instant::now();
    loop {
        if let Some(lock) = attempt().await? {
            return Ok(Some(lock));
        }
        if start.elapsed() >= limit {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

pub(super) fn pick(flag: bool, yes: &'static str, no: &'static str) -> &'static str {
    if flag { yes } else { no }
}

/// A time in milliseconds, or `none`.
pub(super) fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "none".to_owned(), |d| d.as_millis().to_string())
}
