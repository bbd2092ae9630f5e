//! Speed and load, each peer measured the same way in the same run, each
//! in a database of its own: acquire+release cycles per second (one
//! client, one name); takeover after a holder dies without releasing;
//! handover from a release to a waiting acquirer; what waiting on a held
//! lease costs the server; what holding 1,000 leases costs the server.
//!
//! Settings: TTL 1 s for the leases (pglease renews at a third of it;
//! pg_lease's heartbeat every 1/3 s and its attempts every 100 ms, as its
//! own tests configure it: its defaults are all zero); the advisory locks
//! have no TTL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use pglease::testing::TestDatabase;
use pglease::{AcquireOptions, Error, LeaseManager};
use sqlx08::postgres::PgPool;
use tokio::sync::Notify;

use crate::looper::{Signal, holds, signal, slot};
use crate::{BoxError, Peer, dlock, pool};

/// The leases' TTL in these measures.
const TTL: Duration = Duration::from_secs(1);
/// How many leases are held for the holding figure.
const HELD: usize = 1000;

/// pg_lease's settings in these measures.
fn looper_options() -> pg_lease::LeaseLooperOptions {
    crate::looper::options(TTL)
}

/// The figures of one peer.
#[derive(Debug, Clone, Default)]
pub struct Speed {
    /// Acquire+release cycles per second, one client.
    pub cycles_per_s: Option<f64>,
    /// From a holder's death (right after acquiring) to another's
    /// acquisition.
    pub takeover: Option<Duration>,
    /// The same for a session-bound lease (pglease only): from the end of
    /// the dead holder's connections.
    pub takeover_session_bound: Option<Duration>,
    /// From a release to the waiting acquirer holding it.
    pub handover: Option<Duration>,
    /// Transactions and WAL bytes per second on the server while one
    /// worker waits for 5 s on a lease another holds.
    pub waiting: Option<Load>,
    /// The same while 1,000 leases are held (`None`: cannot).
    pub holding: Option<Load>,
    /// Why a figure is missing, or a note on one.
    pub note: String,
}

/// Server load, per second.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Write transactions (those given a transaction id), server-wide.
    pub transactions_per_s: f64,
    /// WAL written by the server.
    pub wal_bytes_per_s: f64,
}

/// Every figure for every peer. `hold_for` is how long the 1,000 leases
/// are held (the minute by default in the command).
///
/// # Errors
///
/// A peer or the database failing unexpectedly.
pub async fn speed(
    cycle_for: Duration,
    hold_for: Duration,
) -> Result<Vec<(Peer, Speed)>, BoxError> {
    let mut all = Vec::new();
    for peer in Peer::ALL {
        let mut s = Speed::default();
        let label = peer.label();
        eprintln!("peers: {label}: acquire+release cycles for {cycle_for:?}");
        s.cycles_per_s = Some(cycles(peer, cycle_for).await?);
        eprintln!("peers: {label}: takeover after a holder's death");
        s.takeover = takeover(peer).await?;
        if peer == Peer::Pglease {
            s.takeover_session_bound = Some(takeover_session_bound().await?);
        }
        eprintln!("peers: {label}: handover to a waiter");
        // Five releases at different moments (a polling waiter's delay
        // depends on where the release falls between its attempts).
        let mut total = Duration::ZERO;
        for k in 0..5u64 {
            let offset = Duration::from_millis(300 + 23 * k);
            total += handover(peer, offset).await?.ok_or("no handover")?;
        }
        s.handover = Some(total / 5);
        eprintln!("peers: {label}: a waiter's load for 5 s");
        s.waiting = Some(waiting(peer, Duration::from_secs(5)).await?);
        eprintln!("peers: {label}: holding 1,000 for {hold_for:?}");
        s.holding = holding(peer, hold_for, &mut s.note).await?;
        all.push((peer, s));
    }
    Ok(all)
}

/// Write transactions begun so far (the next transaction id to assign)
/// and the WAL position, server-wide; read without consuming an id.
/// (pg_stat_database's counters would include reads, but each session
/// flushes them only when idle, up to 10 s late.)
async fn counters(reader: &PgPool) -> Result<(i64, i64, Instant), BoxError> {
    let at = Instant::now();
    let (xacts, wal): (i64, i64) = sqlx08::query_as(
        "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, \
                pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint",
    )
    .fetch_one(reader)
    .await?;
    Ok((xacts, wal, at))
}

/// The load from `before` to now, per second of `elapsed`, or, without
/// it, of the time between the two readings (for activity that goes on
/// throughout, such as holding).
async fn load_since(
    reader: &PgPool,
    before: (i64, i64, Instant),
    elapsed: Option<Duration>,
) -> Result<Load, BoxError> {
    let after = counters(reader).await?;
    let secs = elapsed
        .unwrap_or_else(|| after.2.duration_since(before.2))
        .as_secs_f64();
    Ok(Load {
        transactions_per_s: (after.0 - before.0) as f64 / secs,
        wal_bytes_per_s: (after.1 - before.1) as f64 / secs,
    })
}

/// Acquire+release cycles per second for `peer`, one client, one name,
/// over `run_for`.
async fn cycles(peer: Peer, run_for: Duration) -> Result<f64, BoxError> {
    let db = TestDatabase::new().await?;
    let started = Instant::now();
    let n = match peer {
        Peer::Pglease => cycles_pglease(&db, started, run_for).await?,
        Peer::PgLease => cycles_pg_lease(&db, started, run_for).await?,
        Peer::DistributedLock => cycles_dlock(&db, started, run_for).await?,
        Peer::SqlxAdvisoryLock => cycles_sqlx_lock(&db, started, run_for).await?,
    };
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Cycles for pglease: acquire and release through one manager, until
/// `run_for` after `started`; how many.
async fn cycles_pglease(
    db: &TestDatabase,
    started: Instant,
    run_for: Duration,
) -> Result<u64, BoxError> {
    let m = db.manager();
    let mut n = 0u64;
    while started.elapsed() < run_for {
        let lease = m.acquire("res", AcquireOptions::ttl(TTL)).await?;
        m.release(&lease).await?;
        n += 1;
    }
    Ok(n)
}

/// Cycles for pg_lease: a looper per cycle, whose function returns at
/// once.
async fn cycles_pg_lease(
    db: &TestDatabase,
    started: Instant,
    run_for: Duration,
) -> Result<u64, BoxError> {
    let p = pool(db, "peer").await?;
    let mut n = 0u64;
    while started.elapsed() < run_for {
        // Its only way to acquire: a looper whose function runs
        // while the lease is held; returning releases it.
        let (called, was_called) = slot();
        let looper = pg_lease::LeaseLooper::new(
            "res".to_owned(),
            move |_ctx, called: Signal| async move {
                signal(&called);
                Ok(())
            },
            format!("w{n}"),
            p.clone(),
            pg_lease::LeaseLooperOptions {
                loop_interval: Duration::from_millis(1),
                ..looper_options()
            },
            called,
        );
        looper.start().await?;
        tokio::time::timeout(Duration::from_secs(10), was_called)
            .await
            .map_err(|_| "pg_lease: no acquisition within 10 s")??;
        n += 1;
    }
    Ok(n)
}

/// Cycles for distributed-lock-postgres: acquire and release one lock.
async fn cycles_dlock(
    db: &TestDatabase,
    started: Instant,
    run_for: Duration,
) -> Result<u64, BoxError> {
    let provider = dlock_provider(db, "peer").await?;
    let lock = provider.create_lock("res");
    let mut n = 0u64;
    while started.elapsed() < run_for {
        let handle = lock.acquire(Some(Duration::from_secs(10))).await?;
        handle.release().await?;
        n += 1;
    }
    Ok(n)
}

/// Cycles for sqlx's `PgAdvisoryLock`: acquire and release on one
/// connection.
async fn cycles_sqlx_lock(
    db: &TestDatabase,
    started: Instant,
    run_for: Duration,
) -> Result<u64, BoxError> {
    let p = pool(db, "peer").await?;
    let lock = sqlx08::postgres::PgAdvisoryLock::new("res");
    let mut conn = p.acquire().await?;
    let mut n = 0u64;
    while started.elapsed() < run_for {
        let guard = lock.acquire(&mut *conn).await?;
        guard.release_now().await?;
        n += 1;
    }
    Ok(n)
}

/// A holder dies right after acquiring; how long until another holds it.
async fn takeover(peer: Peer) -> Result<Option<Duration>, BoxError> {
    let db = TestDatabase::new().await?;
    let took = match peer {
        Peer::Pglease => takeover_pglease(&db).await?,
        Peer::PgLease => takeover_pg_lease(&db).await?,
        Peer::DistributedLock => takeover_dlock(&db).await?,
        Peer::SqlxAdvisoryLock => takeover_sqlx_lock(&db).await?,
    };
    Ok(Some(took))
}

/// Takeover for pglease: A's lease is never renewed nor released, B waits
/// for it.
async fn takeover_pglease(db: &TestDatabase) -> Result<Duration, BoxError> {
    let a = db.manager();
    // Acquired, never renewed nor released: dead.
    let _dead = a.acquire("res", AcquireOptions::ttl(TTL)).await?;
    pglease_taken_over(db, Instant::now()).await
}

/// Takeover for pg_lease: A's looper and connections end, B's looper
/// tries every 100 ms.
async fn takeover_pg_lease(db: &TestDatabase) -> Result<Duration, BoxError> {
    let p = pool(db, "peer-B").await?;
    let a_pool = pool(db, "peer-A").await?;
    let (held, was_held) = slot();
    let a = pg_lease::LeaseLooper::new(
        "res".to_owned(),
        holds,
        "A".to_owned(),
        a_pool.clone(),
        looper_options(),
        held,
    );
    a.start().await?;
    was_held.await?;
    // The process dies: its tasks stop and its connections close
    // (stop() alone leaves the heartbeat task running: it is
    // spawned apart from the task stop() aborts).
    a.stop().await?;
    a_pool.close().await;
    let died = Instant::now();
    let (got, b_got) = slot();
    let b = pg_lease::LeaseLooper::new(
        "res".to_owned(),
        holds,
        "B".to_owned(),
        p,
        looper_options(),
        got,
    );
    b.start().await?;
    tokio::time::timeout(Duration::from_secs(10), b_got)
        .await
        .map_err(|_| "pg_lease: no takeover within 10 s")??;
    let took = died.elapsed();
    b.stop().await?;
    Ok(took)
}

/// Takeover for distributed-lock-postgres: A's connections are ended, B
/// waits for the lock.
async fn takeover_dlock(db: &TestDatabase) -> Result<Duration, BoxError> {
    let a_pool = pool(db, "peer-A").await?;
    let a = dlock(a_pool.clone()).await?;
    let handle = a.create_lock("res").acquire(Some(TTL)).await?;
    // The process dies: its connections close (ended here from
    // the server's side; the handle is never used again).
    crate::kill(db, "peer-A").await?;
    let died = Instant::now();
    std::mem::forget(handle);
    let b = dlock_provider(db, "peer-B").await?;
    let got = b
        .create_lock("res")
        .acquire(Some(Duration::from_secs(10)))
        .await?;
    let took = died.elapsed();
    let _ = got.release().await;
    Ok(took)
}

/// Takeover for sqlx's `PgAdvisoryLock`: A's guard's connection closes, B
/// waits for the lock.
async fn takeover_sqlx_lock(db: &TestDatabase) -> Result<Duration, BoxError> {
    let a_pool = pool(db, "peer-A").await?;
    let lock = sqlx08::postgres::PgAdvisoryLock::new("res");
    let conn = lock.acquire(a_pool.acquire().await?).await?.leak();
    // The process dies: its connection closes.
    conn.close().await?;
    let died = Instant::now();
    let b_pool = pool(db, "peer-B").await?;
    let guard = lock.acquire(b_pool.acquire().await?).await?;
    let took = died.elapsed();
    guard.release_now().await?;
    Ok(took)
}

/// pglease's session-bound lease (TTL 1 s as the others'): the holder dies
/// right after acquiring (its connections end, as for the advisory locks);
/// until the next worker holds it.
async fn takeover_session_bound() -> Result<Duration, BoxError> {
    let db = TestDatabase::new().await?;
    let a = LeaseManager::new(
        pglease::connect::pool_options()
            .max_connections(4)
            .connect_with(db.options().application_name("peer-A"))
            .await?,
    );
    let _dead = a
        .acquire("res", AcquireOptions::ttl(TTL).session_bound(true))
        .await?;
    crate::kill(&db, "peer-A").await?;
    pglease_taken_over(&db, Instant::now()).await
}

/// From `died` until another pglease worker holds lease "res".
async fn pglease_taken_over(db: &TestDatabase, died: Instant) -> Result<Duration, BoxError> {
    db.manager()
        .acquire(
            "res",
            AcquireOptions::ttl(TTL).wait(Duration::from_secs(10)),
        )
        .await?;
    Ok(died.elapsed())
}

/// A waiter is waiting when the holder releases, `offset` after it began
/// to wait (pglease's: once it listens); how long until it holds.
async fn handover(peer: Peer, offset: Duration) -> Result<Option<Duration>, BoxError> {
    let db = TestDatabase::new().await?;
    let took = match peer {
        Peer::Pglease => handover_pglease(&db).await?,
        Peer::PgLease => handover_pg_lease(&db, offset).await?,
        Peer::DistributedLock => handover_dlock(&db, offset).await?,
        Peer::SqlxAdvisoryLock => handover_sqlx_lock(&db, offset).await?,
    };
    Ok(Some(took))
}

/// Handover for pglease: A releases once B's wait listens for the release.
async fn handover_pglease(db: &TestDatabase) -> Result<Duration, BoxError> {
    let a = db.manager();
    let lease = a.acquire("res", AcquireOptions::ttl(TTL * 30)).await?;
    let b = db.manager();
    let watcher = b.clone();
    let waiting = tokio::spawn(async move {
        b.acquire(
            "res",
            AcquireOptions::ttl(TTL).wait(Duration::from_secs(10)),
        )
        .await
        .map(|_| Instant::now())
    });
    // Until the waiter listens for the release.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(watcher.stats().waiting == 1 && watcher.stats().listening) && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let at = Instant::now();
    a.release(&lease).await?;
    let got: Result<Instant, Error> = waiting.await?;
    Ok(got?.duration_since(at))
}

/// Handover for pg_lease: A's looper function returns `offset` after B's
/// looper started.
async fn handover_pg_lease(db: &TestDatabase, offset: Duration) -> Result<Duration, BoxError> {
    let released = Arc::new(Notify::new());
    let p = pool(db, "peer").await?;
    let release = Arc::clone(&released);
    let (held, was_held) = slot();
    let a = pg_lease::LeaseLooper::new(
        "res".to_owned(),
        move |_ctx, (held, release): (Signal, Arc<Notify>)| async move {
            signal(&held);
            // Returning releases the lease.
            release.notified().await;
            Ok(())
        },
        "A".to_owned(),
        p.clone(),
        looper_options(),
        (held, release),
    );
    a.start().await?;
    was_held.await?;
    let (got, b_got) = slot();
    let b = pg_lease::LeaseLooper::new(
        "res".to_owned(),
        holds,
        "B".to_owned(),
        p,
        looper_options(),
        got,
    );
    b.start().await?;
    tokio::time::sleep(offset).await;
    let at = Instant::now();
    released.notify_one();
    let got = tokio::time::timeout(Duration::from_secs(10), b_got)
        .await
        .map_err(|_| "pg_lease: no handover within 10 s")??;
    b.stop().await?;
    Ok(got.duration_since(at))
}

/// Handover for distributed-lock-postgres: A releases `offset` after B
/// began to wait for the lock.
async fn handover_dlock(db: &TestDatabase, offset: Duration) -> Result<Duration, BoxError> {
    let a = dlock_provider(db, "peer-A").await?;
    let b = dlock_provider(db, "peer-B").await?;
    let handle = a.create_lock("res").acquire(Some(TTL)).await?;
    let waiting = tokio::spawn(async move {
        let lock = b.create_lock("res");
        let got = lock.acquire(Some(Duration::from_secs(10))).await;
        let at = Instant::now();
        got.map(|h| (at, h))
    });
    tokio::time::sleep(offset).await;
    let at = Instant::now();
    handle.release().await?;
    let (got, h) = waiting.await??;
    let _ = h.release().await;
    Ok(got.duration_since(at))
}

/// Handover for sqlx's `PgAdvisoryLock`: A releases `offset` after B began
/// to wait for the lock.
async fn handover_sqlx_lock(db: &TestDatabase, offset: Duration) -> Result<Duration, BoxError> {
    let a_pool = pool(db, "peer-A").await?;
    let b_pool = pool(db, "peer-B").await?;
    let lock = Arc::new(sqlx08::postgres::PgAdvisoryLock::new("res"));
    let guard = lock.acquire(a_pool.acquire().await?).await?;
    let waiting = {
        let lock = Arc::clone(&lock);
        tokio::spawn(async move {
            let conn = b_pool.acquire().await?;
            let guard = lock.acquire(conn).await?;
            let at = Instant::now();
            guard.release_now().await?;
            Ok::<_, BoxError>(at)
        })
    };
    tokio::time::sleep(offset).await;
    let at = Instant::now();
    guard.release_now().await?;
    let got = waiting.await??;
    Ok(got.duration_since(at))
}

/// A distributed-lock-postgres provider on a pool of its own, its
/// connections named `app`.
async fn dlock_provider(
    db: &TestDatabase,
    app: &str,
) -> Result<distributed_lock_postgres::PostgresLockProvider, BoxError> {
    dlock(pool(db, app).await?).await
}

/// One worker holds the lease; another waits for it for `span`.
async fn waiting(peer: Peer, span: Duration) -> Result<Load, BoxError> {
    let db = TestDatabase::new().await?;
    let reader = pool(&db, "reader").await?;
    match peer {
        Peer::Pglease => waiting_pglease(&db, &reader, span).await,
        Peer::PgLease => waiting_pg_lease(&db, &reader, span).await,
        Peer::DistributedLock => waiting_dlock(&db, &reader, span).await,
        Peer::SqlxAdvisoryLock => waiting_sqlx_lock(&db, &reader).await,
    }
}

/// A waiter's load for pglease: B's acquire waits for `span`.
async fn waiting_pglease(
    db: &TestDatabase,
    reader: &PgPool,
    span: Duration,
) -> Result<Load, BoxError> {
    let a = db.manager();
    let _held = a.hold("res", AcquireOptions::ttl(TTL * 30)).await?;
    let b = db.manager();
    let before = counters(reader).await?;
    let started = Instant::now();
    let _ = b.acquire("res", AcquireOptions::ttl(TTL).wait(span)).await;
    load_since(reader, before, Some(started.elapsed())).await
}

/// A waiter's load for pg_lease: B's looper tries for `span`.
async fn waiting_pg_lease(
    db: &TestDatabase,
    reader: &PgPool,
    span: Duration,
) -> Result<Load, BoxError> {
    let p = pool(db, "peer").await?;
    let forever = |_ctx, _: ()| async move {
        std::future::pending::<()>().await;
        Ok(())
    };
    // The holder as pglease's here: a 30 s lease (heartbeat every
    // 10 s), so that the figure is the waiter's.
    let a = pg_lease::LeaseLooper::new(
        "res".to_owned(),
        forever,
        "A".to_owned(),
        p.clone(),
        crate::looper::options(TTL * 30),
        (),
    );
    a.start().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = counters(reader).await?;
    let started = Instant::now();
    let b = pg_lease::LeaseLooper::new(
        "res".to_owned(),
        forever,
        "B".to_owned(),
        p.clone(),
        looper_options(),
        (),
    );
    b.start().await?;
    tokio::time::sleep(span).await;
    b.stop().await?;
    let load = load_since(reader, before, Some(started.elapsed())).await;
    a.stop().await?;
    p.close().await;
    load
}

/// A waiter's load for distributed-lock-postgres: B's acquire waits for
/// `span`.
async fn waiting_dlock(
    db: &TestDatabase,
    reader: &PgPool,
    span: Duration,
) -> Result<Load, BoxError> {
    let a = dlock_provider(db, "peer-A").await?;
    let b = dlock_provider(db, "peer-B").await?;
    let _handle = a.create_lock("res").acquire(Some(TTL)).await?;
    let before = counters(reader).await?;
    let started = Instant::now();
    let _ = b.create_lock("res").acquire(Some(span)).await;
    load_since(reader, before, Some(started.elapsed())).await
}

/// A waiter's load for sqlx's `PgAdvisoryLock`: B's acquire blocks in the
/// server for 5 s.
async fn waiting_sqlx_lock(db: &TestDatabase, reader: &PgPool) -> Result<Load, BoxError> {
    let a_pool = pool(db, "peer-A").await?;
    let b_pool = pool(db, "peer-B").await?;
    let lock = sqlx08::postgres::PgAdvisoryLock::new("res");
    let _guard = lock.acquire(a_pool.acquire().await?).await?;
    let before = counters(reader).await?;
    let started = Instant::now();
    // Its documented wait blocks in the server; bounded here.
    let mut conn = b_pool.acquire().await?;
    let _ = sqlx08::query("SET lock_timeout = '5s'")
        .execute(&mut *conn)
        .await;
    let _ = lock.acquire(&mut *conn).await;
    load_since(reader, before, Some(started.elapsed())).await
}

/// `HELD` leases held for `span`.
async fn holding(peer: Peer, span: Duration, note: &mut String) -> Result<Option<Load>, BoxError> {
    let db = TestDatabase::new().await?;
    let reader = pool(&db, "reader").await?;
    match peer {
        Peer::Pglease => holding_pglease(&db, &reader, span, note).await.map(Some),
        Peer::PgLease => holding_pg_lease(&db, &reader, span, note).await.map(Some),
        Peer::DistributedLock => {
            note.push_str(
                "distributed-lock-postgres: each lock keeps a pooled connection for as long as \
                 it is held, so 1,000 locks need 1,000 server connections (max_connections \
                 is usually 100 or 200): not measured. ",
            );
            Ok(None)
        }
        Peer::SqlxAdvisoryLock => holding_sqlx_lock(&db, &reader, span, note).await.map(Some),
    }
}

/// Holding for pglease: one manager holds them all and renews them
/// together.
async fn holding_pglease(
    db: &TestDatabase,
    reader: &PgPool,
    span: Duration,
    note: &mut String,
) -> Result<Load, BoxError> {
    let m = LeaseManager::new(db.pool().clone());
    let mut held = Vec::with_capacity(HELD);
    for i in 0..HELD {
        held.push(
            m.hold(&format!("res-{i}"), AcquireOptions::ttl(TTL * 30))
                .await?,
        );
    }
    let before = counters(reader).await?;
    tokio::time::sleep(span).await;
    let load = load_since(reader, before, None).await;
    m.shutdown().await?;
    note.push_str("pglease: TTL 30 s here (renewed every 10 s, all 1,000 in one statement). ");
    load
}

/// Holding for pg_lease: a looper per lease, each with its heartbeat.
async fn holding_pg_lease(
    db: &TestDatabase,
    reader: &PgPool,
    span: Duration,
    note: &mut String,
) -> Result<Load, BoxError> {
    let p = pool(db, "peer").await?;
    let mut loopers = Vec::with_capacity(HELD);
    for i in 0..HELD {
        let looper = pg_lease::LeaseLooper::new(
            format!("res-{i}"),
            |_ctx, _: ()| async move {
                std::future::pending::<()>().await;
                Ok(())
            },
            "A".to_owned(),
            p.clone(),
            crate::looper::options(TTL * 30),
            (),
        );
        looper.start().await?;
        loopers.push(looper);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held: i64 = sqlx08::query_scalar(
        "SELECT count(*) FROM _pg_lease WHERE worker_id = 'A' AND held_until > now()",
    )
    .fetch_one(reader)
    .await?;
    if held < HELD as i64 {
        note.push_str(&format!("pg_lease: only {held} of the 1,000 held. "));
    }
    let before = counters(reader).await?;
    tokio::time::sleep(span).await;
    let load = load_since(reader, before, None).await;
    for looper in &loopers {
        looper.stop().await?;
    }
    p.close().await;
    note.push_str("pg_lease: lease 30 s, heartbeat every 10 s, one per lease. ");
    load
}

/// Holding for sqlx's `PgAdvisoryLock`: session locks on one connection.
async fn holding_sqlx_lock(
    db: &TestDatabase,
    reader: &PgPool,
    span: Duration,
    note: &mut String,
) -> Result<Load, BoxError> {
    let p = pool(db, "peer").await?;
    let mut conn = p.acquire().await?;
    for i in 0..HELD {
        let lock = sqlx08::postgres::PgAdvisoryLock::new(format!("res-{i}"));
        lock.acquire(&mut *conn).await?.leak();
    }
    let before = counters(reader).await?;
    tokio::time::sleep(span).await;
    let load = load_since(reader, before, None).await;
    note.push_str("sqlx PgAdvisoryLock: 1,000 session locks on one connection. ");
    load
}

/// The figures as a Markdown table, with ratios to pglease's.
pub fn speed_table(all: &[(Peer, Speed)]) -> String {
    let base = all
        .iter()
        .find(|(p, _)| *p == Peer::Pglease)
        .map(|(_, s)| s);
    let ratio = |v: Option<f64>, b: Option<f64>| match (v, b) {
        (Some(v), Some(b)) if b > 0.0 => format!(" ({:.2}x)", v / b),
        _ => String::new(),
    };
    let mut out = String::from(
        "| peer | acquire+release /s | takeover after death | handover | waiting: write xacts/s, WAL B/s | holding 1,000: write xacts/s, WAL B/s |\n|---|---|---|---|---|---|",
    );
    for (peer, s) in all {
        let load = |l: &Option<Load>| {
            l.map_or_else(
                || "not possible".to_owned(),
                |l| format!("{:.1}, {:.0}", l.transactions_per_s, l.wal_bytes_per_s),
            )
        };
        out.push_str(&format!(
            "\n| {} | {}{} | {} | {} | {} | {} |",
            peer.label(),
            s.cycles_per_s.map_or("-".to_owned(), |c| format!("{c:.0}")),
            ratio(s.cycles_per_s, base.and_then(|b| b.cycles_per_s)),
            match (s.takeover, s.takeover_session_bound) {
                (Some(t), Some(b)) => format!(
                    "{} ms (session-bound: {:.1} ms)",
                    t.as_millis(),
                    b.as_secs_f64() * 1000.0
                ),
                (t, _) => t.map_or("-".to_owned(), |t| format!("{} ms", t.as_millis())),
            },
            s.handover.map_or("-".to_owned(), |t| format!(
                "{:.1} ms",
                t.as_secs_f64() * 1000.0
            )),
            load(&s.waiting),
            load(&s.holding),
        ));
    }
    let notes: Vec<&str> = all.iter().map(|(_, s)| s.note.as_str()).collect();
    out.push_str(&format!("\n\n{}", notes.concat().trim_end()));
    out
}
