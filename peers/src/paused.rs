//! Scenario (a): the holder has written inside its protected transaction
//! and sends COMMIT when its network freezes (to the server a paused
//! process looks the same: nothing arrives). Another worker tries for 3 s
//! to take over and writes if it can; then the network thaws and the
//! holder's COMMIT arrives. The verdict is
//! whether the holder's row is in the ledger after the new holder's
//! committed first.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use pg_lease::{LeaseContext, LeaseLooper, verify_lease_held};
use pglease::testing::TestDatabase;
use pglease::{AcquireOptions, LeaseManager};
use sqlx08::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::looper::writes_b;
use crate::proxy::{Proxy, Target};
use crate::{BoxError, Peer, Verdict, dlock, ledger, pool, scratch, write};

/// The leases' TTL in this scenario.
const TTL: Duration = Duration::from_secs(1);
/// How long after the freeze the second worker may take over.
const WINDOW: Duration = Duration::from_secs(3);

/// Scenario (a) for `peer`, in a database of its own.
///
/// # Errors
///
/// A peer or the database failing in a way the scenario does not expect.
pub async fn paused_commit(peer: Peer) -> Result<Verdict, BoxError> {
    let db = scratch().await?;
    let proxy = Proxy::start(target(&db).await?).await?;
    match peer {
        Peer::Pglease => paused_pglease(&db, &proxy).await,
        Peer::PgLease => paused_pg_lease(&db, &proxy).await,
        Peer::DistributedLock => paused_dlock(&db, &proxy).await,
        Peer::SqlxAdvisoryLock => paused_sqlx_lock(&db, &proxy).await,
    }
}

/// Where the test database's server listens.
pub(crate) async fn target(db: &TestDatabase) -> Result<Target, BoxError> {
    let options = db.options();
    let (host, port) = (options.get_host().to_owned(), options.get_port());
    if host.starts_with('/') {
        return Ok(Target::Unix(format!("{host}/.s.PGSQL.{port}").into()));
    }
    let addr = tokio::net::lookup_host((host.as_str(), port))
        .await?
        .next()
        .ok_or("the server's host has no address")?;
    Ok(Target::Tcp(addr))
}

/// The password in the test database's URL, if it has one (a container's).
fn password(db: &TestDatabase) -> Option<String> {
    let url = db.url();
    let (_, rest) = url.split_once("://")?;
    let credentials = rest.split_once('@')?.0;
    Some(credentials.split_once(':')?.1.to_owned())
}

/// A sqlx 0.8 pool through the proxy, its connections named `peer-A`.
pub(crate) async fn proxied_pool(db: &TestDatabase, proxy: &Proxy) -> Result<PgPool, BoxError> {
    let options = db.options();
    let mut through = PgConnectOptions::new_without_pgpass()
        .host("127.0.0.1")
        .port(proxy.port())
        .username(options.get_username())
        .database(db.name())
        .application_name("peer-A");
    if let Some(password) = password(db) {
        through = through.password(&password);
    }
    Ok(PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(through)
        .await?)
}

/// A pglease manager through the proxy, its connections named `peer-A`.
pub(crate) async fn proxied_manager(
    db: &TestDatabase,
    proxy: &Proxy,
) -> Result<LeaseManager, BoxError> {
    Ok(LeaseManager::new(
        pglease::connect::pool_options()
            .max_connections(4)
            .connect_with(proxied_options(db, proxy))
            .await?,
    ))
}

/// The same, as pglease's sqlx 0.9 options.
pub(crate) fn proxied_options(
    db: &TestDatabase,
    proxy: &Proxy,
) -> sqlx::postgres::PgConnectOptions {
    let options = db.options();
    let mut through = sqlx::postgres::PgConnectOptions::new()
        .host("127.0.0.1")
        .port(proxy.port())
        .username(options.get_username())
        .database(db.name())
        .application_name("peer-A");
    if let Some(password) = password(db) {
        through = through.password(&password);
    }
    through
}

/// What B managed in the window, for the detail.
fn takeover_text(took_over: Option<Duration>) -> String {
    match took_over {
        Some(t) => format!("took over {} ms after the freeze", t.as_millis()),
        None => format!(
            "could not take over within {} s of the freeze",
            WINDOW.as_secs()
        ),
    }
}

/// Whether the holder's row is there, after the new holder's if it wrote.
async fn verdict(
    db: &TestDatabase,
    peer: Peer,
    took_over: Option<Duration>,
    commit: String,
    what: &str,
) -> Result<Verdict, BoxError> {
    let rows = ledger(db).await?;
    let a_kept = rows.iter().any(|w| w == "A");
    let b_wrote = rows.iter().any(|w| w == "B");
    Ok(Verdict {
        peer,
        // B's write committed before the thaw, so an A row means A's
        // commit landed after it.
        violated: a_kept && b_wrote,
        took_over,
        detail: format!(
            "{what}; B {}; A's commit after the thaw: {commit}; rows by insertion {rows:?}",
            takeover_text(took_over)
        ),
    })
}

/// Scenario (a) for pglease: A's write fenced, B waiting to acquire.
async fn paused_pglease(db: &TestDatabase, proxy: &Proxy) -> Result<Verdict, BoxError> {
    let a = proxied_manager(db, proxy).await?;
    let held = a.hold("res", AcquireOptions::ttl(TTL).holder("A")).await?;
    let mut tx = held.begin_fenced().await?;
    sqlx::query("INSERT INTO ledger (writer) VALUES ('A')")
        .execute(&mut *tx)
        .await?;
    proxy.freeze();
    let frozen_at = Instant::now();
    let commit = tokio::spawn(async move { tx.commit().await });
    let b = db.manager();
    let took_over = match b
        .acquire(
            "res",
            AcquireOptions::ttl(TTL * 30).holder("B").wait(WINDOW),
        )
        .await
    {
        Ok(lease) => {
            let at = frozen_at.elapsed();
            b.fenced(&lease, async |conn| {
                sqlx::query("INSERT INTO ledger (writer) VALUES ('B')")
                    .execute(&mut *conn)
                    .await?;
                Ok::<_, pglease::Error>(())
            })
            .await?;
            Some(at)
        }
        Err(_) => None,
    };
    proxy.thaw();
    let committed = tokio::time::timeout(Duration::from_secs(10), commit)
        .await
        .map_err(|_| "A's commit got no answer")??;
    let commit = match committed {
        Ok(()) => "COMMITTED".to_owned(),
        Err(e) => format!("failed ({e})"),
    };
    verdict(
        db,
        Peer::Pglease,
        took_over,
        commit,
        "A's write was checked against the lease and the check held until commit; the \
         takeover ended A's session",
    )
    .await
}

/// Tells the scenario that A has done a step.
type Step = oneshot::Sender<()>;
/// A's orders: say when written, then commit when told.
type Orders = Arc<Mutex<mpsc::Receiver<(Step, oneshot::Receiver<()>)>>>;

/// A's looper function in scenario (a) for pg_lease: once told, it
/// verifies the lease in a transaction and writes (as pg_lease documents),
/// says so, and commits when told.
async fn writes_when_told(
    ctx: LeaseContext,
    (pool, inbox): (PgPool, Orders),
) -> Result<(), BoxError> {
    let Some((written, commit)) = inbox.lock().await.recv().await else {
        return Ok(());
    };
    let mut tx = pool.begin().await?;
    if !verify_lease_held(&mut tx, &ctx.lease_name, &ctx.worker_id).await? {
        return Err("not held".into());
    }
    sqlx08::query("INSERT INTO ledger (writer) VALUES ('A')")
        .execute(&mut *tx)
        .await?;
    let _ = written.send(());
    let _ = commit.await;
    tx.commit().await?;
    std::future::pending::<()>().await;
    Ok(())
}

/// Scenario (a) for pg_lease: loopers, A's write checked by `verify_lease_held`.
async fn paused_pg_lease(db: &TestDatabase, proxy: &Proxy) -> Result<Verdict, BoxError> {
    let options = crate::looper::options(TTL);
    let (go, inbox) = mpsc::channel::<(Step, oneshot::Receiver<()>)>(1);
    let inbox = Arc::new(Mutex::new(inbox));
    let a_pool = proxied_pool(db, proxy).await?;
    let a = LeaseLooper::new(
        "res".to_owned(),
        writes_when_told,
        "A".to_owned(),
        a_pool.clone(),
        options,
        (a_pool, inbox),
    );
    a.start().await?;
    let reader = pool(db, "reader").await?;
    crate::looper::until_held_by(&reader, "A").await?;
    let (written, was_written) = oneshot::channel();
    let (commit_now, commit) = oneshot::channel();
    go.send((written, commit))
        .await
        .map_err(|_| "A's looper stopped")?;
    tokio::time::timeout(Duration::from_secs(10), was_written)
        .await
        .map_err(|_| "A did not write")??;
    proxy.freeze();
    let frozen_at = Instant::now();
    let _ = commit_now.send(());
    let b_pool = pool(db, "peer-B").await?;
    let b = LeaseLooper::new(
        "res".to_owned(),
        writes_b,
        "B".to_owned(),
        b_pool.clone(),
        options,
        b_pool,
    );
    b.start().await?;
    let took_over = paused_pg_lease_took_over(db, &reader, frozen_at).await?;
    proxy.thaw();
    let committed = paused_pg_lease_committed(db).await?;
    a.stop().await?;
    b.stop().await?;
    verdict(
        db,
        Peer::PgLease,
        took_over,
        if committed {
            "COMMITTED".to_owned()
        } else {
            "not committed within 3 s".to_owned()
        },
        "verify_lease_held passed before the freeze and holds nothing until commit",
    )
    .await
}

/// When, after the freeze, pg_lease's B held the lease and had written
/// (`None`: not within the window).
async fn paused_pg_lease_took_over(
    db: &TestDatabase,
    reader: &PgPool,
    frozen_at: Instant,
) -> Result<Option<Duration>, BoxError> {
    while frozen_at.elapsed() < WINDOW {
        let b_wrote = ledger(db).await?.iter().any(|w| w == "B");
        if crate::looper::holder(reader).await.as_deref() == Some("B") && b_wrote {
            return Ok(Some(frozen_at.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(None)
}

/// Whether pg_lease's A's row is in the ledger within 3 s of the thaw.
async fn paused_pg_lease_committed(db: &TestDatabase) -> Result<bool, BoxError> {
    // A's COMMIT was sent before the freeze ended; whether pg_lease's
    // heartbeat then stops A's task, the server has it.
    let a_row = async {
        loop {
            let rows = ledger(db).await?;
            if rows.iter().any(|w| w == "A") {
                return Ok::<_, BoxError>(true);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(3), a_row)
        .await
        .unwrap_or(Ok(false))
}

/// Scenario (a) for distributed-lock-postgres: A writes in its own transaction.
async fn paused_dlock(db: &TestDatabase, proxy: &Proxy) -> Result<Verdict, BoxError> {
    let a_pool = proxied_pool(db, proxy).await?;
    let a = dlock(a_pool.clone()).await?;
    let handle = a.create_lock("res").acquire(Some(WINDOW)).await?;
    // Its handle offers no connection to write through: a transaction of
    // the application's own, while holding the lock.
    let mut tx = a_pool.begin().await?;
    sqlx08::query("INSERT INTO ledger (writer) VALUES ('A')")
        .execute(&mut *tx)
        .await?;
    proxy.freeze();
    let frozen_at = Instant::now();
    let commit = tokio::spawn(async move { tx.commit().await });
    let b_pool = pool(db, "peer-B").await?;
    let b = dlock(b_pool.clone()).await?;
    let b_handle = b.create_lock("res").acquire(Some(WINDOW)).await.ok();
    let took_over = b_handle.as_ref().map(|_| frozen_at.elapsed());
    if b_handle.is_some() {
        write(&b_pool, "B").await?;
    }
    proxy.thaw();
    let committed = tokio::time::timeout(Duration::from_secs(10), commit)
        .await
        .map_err(|_| "A's commit got no answer")??;
    let _ = handle.release().await;
    if let Some(h) = b_handle {
        let _ = h.release().await;
    }
    verdict(
        db,
        Peer::DistributedLock,
        took_over,
        match committed {
            Ok(()) => "committed".to_owned(),
            Err(e) => format!("failed ({e})"),
        },
        "the lock lives as long as A's session, which a frozen network does not end",
    )
    .await
}

/// Scenario (a) for sqlx's `PgAdvisoryLock`: A writes on the guard's connection.
async fn paused_sqlx_lock(db: &TestDatabase, proxy: &Proxy) -> Result<Verdict, BoxError> {
    use sqlx08::postgres::PgAdvisoryLock;

    let a_pool = proxied_pool(db, proxy).await?;
    let lock = PgAdvisoryLock::new("res");
    let mut guard = lock.acquire(a_pool.acquire().await?).await?;
    // The write in a transaction on the guard's own connection.
    sqlx08::raw_sql("BEGIN; INSERT INTO ledger (writer) VALUES ('A')")
        .execute(&mut *guard)
        .await?;
    proxy.freeze();
    let frozen_at = Instant::now();
    // A's COMMIT goes out (and waits in the frozen network) while B tries.
    let commit = async { sqlx08::raw_sql("COMMIT").execute(&mut *guard).await };
    let b_side = async {
        let b_pool = pool(db, "peer-B").await?;
        let mut took_over = None;
        let mut b_guard = None;
        while frozen_at.elapsed() < WINDOW {
            match lock.try_acquire(b_pool.acquire().await?).await? {
                sqlx08::Either::Left(g) => {
                    took_over = Some(frozen_at.elapsed());
                    b_guard = Some(g);
                    break;
                }
                sqlx08::Either::Right(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        if b_guard.is_some() {
            write(&b_pool, "B").await?;
        }
        proxy.thaw();
        Ok::<_, BoxError>((took_over, b_guard))
    };
    let (committed, b_side) = tokio::join!(
        tokio::time::timeout(WINDOW + Duration::from_secs(10), commit),
        b_side
    );
    let (took_over, b_guard) = b_side?;
    let committed = committed.map_err(|_| "A's commit got no answer")?;
    drop(guard);
    drop(b_guard);
    verdict(
        db,
        Peer::SqlxAdvisoryLock,
        took_over,
        match committed {
            Ok(_) => "committed".to_owned(),
            Err(e) => format!("failed ({e})"),
        },
        "the lock lives as long as A's session, which a frozen network does not end",
    )
    .await
}
