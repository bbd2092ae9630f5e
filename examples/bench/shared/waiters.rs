//! Waiters the handover and takeover measures time: a pglease waiter
//! asleep in its acquisition, and its baseline, a session blocked on an
//! advisory lock.

use std::time::{Duration, Instant};

use pglease::{AcquireOptions, Error, Lease, LeaseManager};
use sqlx::PgPool;

use super::ops::LONG;

/// A session waiting for an advisory lock: when it got it, and its
/// connection.
pub(crate) type AdvisoryWaiter =
    tokio::task::JoinHandle<Result<(Instant, sqlx::PgConnection), sqlx::Error>>;

/// The advisory-lock baseline: a session (returned, with its process id)
/// holds lock `key`; another waits for it in the server (the task returns
/// when it got it, and its connection); 100 ms after the wait began.
pub(crate) async fn advisory_waiter(
    pool: &PgPool,
    key: i64,
) -> Result<(sqlx::PgConnection, i32, AdvisoryWaiter), Error> {
    let mut holding = pool.acquire().await?.detach();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid() FROM pg_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut holding)
        .await?;
    let mut blocked = pool.acquire().await?.detach();
    let task = tokio::spawn(async move {
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(key)
            .execute(&mut blocked)
            .await
            .map(|_| (Instant::now(), blocked))
    });
    wait_for_advisory_waiter(pool, key).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok((holding, pid, task))
}

/// Returns once a session waits in the server for advisory lock `key`.
async fn wait_for_advisory_waiter(pool: &PgPool, key: i64) -> Result<(), Error> {
    loop {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
               AND NOT granted AND objid = ($1::bigint & 4294967295)::oid)",
        )
        .bind(key)
        .fetch_one(pool)
        .await?;
        if waiting {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A waiter's acquisition on a task of its own: what it got, and the
/// instant it returned.
pub(crate) type Acquiring = tokio::task::JoinHandle<(Result<Lease, Error>, Instant)>;

/// A waiter's acquisition of `name` on a task of its own (with the instant
/// it returned), once the waiter has tried, gone to sleep and had 100 ms
/// to settle there (a poller's backoff begun, a server-side wait entered);
/// and the waiter's attempts counted before it started.
pub(crate) async fn waiting_acquirer(waiter: &LeaseManager, name: &str) -> (Acquiring, u64) {
    let attempts = waiter.stats().acquire_attempts;
    let task = {
        let (waiter, name) = (waiter.clone(), name.to_owned());
        tokio::spawn(async move {
            let got = waiter
                .acquire(&name, AcquireOptions::ttl(LONG).holder("waiter").wait(LONG))
                .await;
            (got, Instant::now())
        })
    };
    while waiter.stats().acquire_attempts == attempts || waiter.stats().waiting == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    (task, attempts)
}
