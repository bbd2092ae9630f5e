//! Scenario (e): the holder's network freezes for 3 s while it holds (its
//! renewals or heartbeats get no answer; the server still sees its
//! connections). Another worker tries to take over for those 3 s. Is the
//! holder told it has lost the lease before the other one holds it? If
//! not, two workers act as holders at once, the old one unaware.

use std::time::{Duration, Instant};

use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use pglease::AcquireOptions;
use pglease::testing::TestDatabase;

use crate::looper::{holds, holds_watched, slot};
use crate::paused::{proxied_manager, proxied_pool, target};
use crate::proxy::Proxy;
use crate::{BoxError, Peer, Verdict, dlock, pool, scratch};

/// The leases' TTL in this scenario.
const TTL: Duration = Duration::from_secs(1);
/// How long the holder's network stays frozen.
const FROZEN: Duration = Duration::from_secs(3);

/// pg_lease's settings in this scenario.
fn looper_options() -> pg_lease::LeaseLooperOptions {
    crate::looper::options(TTL)
}

/// What a peer's part of the scenario found: when A was told it had lost
/// the lease and when B held it, both from the freeze (`None`: not within
/// it), and what the peer did.
type Outcome = (Option<Duration>, Option<Duration>, String);

/// Scenario (e) for `peer`, in a database of its own.
///
/// # Errors
///
/// A peer or the database failing in a way the scenario does not expect.
pub async fn silent_renewal(peer: Peer) -> Result<Verdict, BoxError> {
    let db = scratch().await?;
    let proxy = Proxy::start(target(&db).await?).await?;
    let (told, took_over, what) = match peer {
        Peer::Pglease => silent_pglease(&db, &proxy).await?,
        Peer::PgLease => silent_pg_lease(&db, &proxy).await?,
        Peer::DistributedLock => silent_dlock(&db, &proxy).await?,
        Peer::SqlxAdvisoryLock => silent_sqlx_lock(&db, &proxy).await?,
    };
    let ms = |d: Option<Duration>| {
        d.map_or_else(
            || "not within the 3 s".to_owned(),
            |d| format!("after {} ms", d.as_millis()),
        )
    };
    // Two holders: B took over and A had not been told by then.
    let violated = match (took_over, told) {
        (Some(b), Some(a)) => a > b,
        (Some(_), None) => true,
        (None, _) => false,
    };
    Ok(Verdict {
        peer,
        violated,
        took_over,
        detail: format!("{what}; A told {}; B took over {}", ms(told), ms(took_over)),
    })
}

/// Scenario (e) for pglease: A holds a lease through the proxy, B waits to
/// acquire it.
async fn silent_pglease(db: &TestDatabase, proxy: &Proxy) -> Result<Outcome, BoxError> {
    let a = proxied_manager(db, proxy).await?;
    let held = a.hold("res", AcquireOptions::ttl(TTL).holder("A")).await?;
    proxy.freeze();
    let frozen_at = Instant::now();
    let noticed = {
        let held = held.clone();
        tokio::spawn(async move {
            let reason = held.lost().await;
            ((), reason)
        })
    };
    let b = db.manager();
    let took_over = b
        .acquire(
            "res",
            AcquireOptions::ttl(TTL * 30).holder("B").wait(FROZEN),
        )
        .await
        .ok()
        .map(|_| frozen_at.elapsed());
    proxy.thaw();
    let (_, reason) = tokio::time::timeout(Duration::from_secs(10), noticed)
        .await
        .map_err(|_| "A was never told")??;
    // The holder knows from its local deadline on (is_lost(),
    // remaining()), whenever a task gets round to reporting it.
    let known = held
        .lost_at()
        .map_or(held.deadline(), |at| at.min(held.deadline()));
    let told = known.saturating_duration_since(frozen_at);
    Ok((
        Some(told),
        took_over,
        format!("A's HeldLease reported {reason:?}"),
    ))
}

/// Scenario (e) for pg_lease: A's looper works through the proxy without
/// touching the database, B's looper tries to take over; A is told when
/// its work is stopped.
async fn silent_pg_lease(db: &TestDatabase, proxy: &Proxy) -> Result<Outcome, BoxError> {
    let a_pool = proxied_pool(db, proxy).await?;
    let (started, was_started) = slot();
    let (stopped, was_stopped) = slot();
    let a = pg_lease::LeaseLooper::new(
        "res".to_owned(),
        holds_watched,
        "A".to_owned(),
        a_pool.clone(),
        looper_options(),
        (started, stopped),
    );
    a.start().await?;
    tokio::time::timeout(Duration::from_secs(10), was_started)
        .await
        .map_err(|_| "pg_lease: A never acquired")??;
    proxy.freeze();
    let frozen_at = Instant::now();
    let b_pool = pool(db, "peer-B").await?;
    let (got, b_got) = slot();
    let b = pg_lease::LeaseLooper::new(
        "res".to_owned(),
        holds,
        "B".to_owned(),
        b_pool,
        looper_options(),
        got,
    );
    b.start().await?;
    let took_over = tokio::time::timeout(FROZEN, b_got)
        .await
        .ok()
        .and_then(Result::ok)
        .map(|at| at.duration_since(frozen_at));
    // Was A's work stopped during the freeze?
    let mut was_stopped = was_stopped;
    let told =
        match tokio::time::timeout(FROZEN.saturating_sub(frozen_at.elapsed()), &mut was_stopped)
            .await
        {
            Ok(Ok(at)) => Some(at.duration_since(frozen_at)),
            _ => None,
        };
    proxy.thaw();
    a.stop().await?;
    b.stop().await?;
    a_pool.close().await;
    Ok((
        told,
        took_over,
        "A's work is stopped only when a heartbeat fails, and a heartbeat without an answer \
         neither fails nor times out"
            .to_owned(),
    ))
}

/// Scenario (e) for distributed-lock-postgres: A holds the lock through the
/// proxy, B tries to acquire it; A is told if its lost token says so.
async fn silent_dlock(db: &TestDatabase, proxy: &Proxy) -> Result<Outcome, BoxError> {
    let a = dlock(proxied_pool(db, proxy).await?).await?;
    let handle = a.create_lock("res").acquire(Some(FROZEN)).await?;
    proxy.freeze();
    let frozen_at = Instant::now();
    let b = dlock(pool(db, "peer-B").await?).await?;
    let b_handle = b.create_lock("res").acquire(Some(FROZEN)).await.ok();
    let took_over = b_handle.as_ref().map(|_| frozen_at.elapsed());
    let lost = *handle.lost_token().borrow();
    proxy.thaw();
    if let Some(h) = b_handle {
        let _ = h.release().await;
    }
    let _ = handle.release().await;
    Ok((
        lost.then(|| frozen_at.elapsed()),
        took_over,
        format!("the lock stays with A's (frozen) session; lost_token said {lost}"),
    ))
}

/// Scenario (e) for sqlx's `PgAdvisoryLock`: A holds the lock through the
/// proxy, B tries for it every 20 ms; nothing can tell A.
async fn silent_sqlx_lock(db: &TestDatabase, proxy: &Proxy) -> Result<Outcome, BoxError> {
    let a_pool = proxied_pool(db, proxy).await?;
    let lock = sqlx08::postgres::PgAdvisoryLock::new("res");
    let guard = lock.acquire(a_pool.acquire().await?).await?;
    proxy.freeze();
    let frozen_at = Instant::now();
    let b_pool = pool(db, "peer-B").await?;
    let mut took_over = None;
    while frozen_at.elapsed() < FROZEN {
        if let sqlx08::Either::Left(g) = lock.try_acquire(b_pool.acquire().await?).await? {
            took_over = Some(frozen_at.elapsed());
            drop(g);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.thaw();
    drop(guard);
    Ok((
        None,
        took_over,
        "the lock stays with A's (frozen) session; there is nothing to renew and nothing to \
         tell A"
            .to_owned(),
    ))
}
