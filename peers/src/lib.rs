//! pglease side by side with the crates a Rust user would pick instead,
//! each driven through its public API at its crates.io version, on the same
//! server, in the same run: `pg_lease` 0.1.3 (a looping function run while
//! a lease row is heartbeated), `distributed-lock-postgres` 0.2.0
//! (session advisory locks behind a lock trait) and sqlx 0.8's
//! `PgAdvisoryLock`.
//!
//! Each verdict is read from the database afterwards (the order in which
//! the writes committed), not assumed.
//!
//! Scenarios so far, each with the write protected the way the peer's
//! documentation says (or, where it offers no way, the obvious way):
//! (a) the holder has written and is committing when its network freezes
//! (a paused process looks the same to the server) past its TTL; another
//! worker tries to take over and writes; then the holder's commit arrives.
//! (b) the holder's connection is killed, another worker tries to take
//! over, then the first holder writes. (d) A release arrives late, after
//! the same holder acquired again. (e) The holder's network freezes for
//! 3 s while it holds: are its renewals' missing answers noticed before
//! another worker takes over? The letters are those of `pglease demo`'s
//! comparison; its (c), a holder that dies without releasing, is not run
//! here.

mod duplicate;
mod looper;
mod paused;
pub mod proxy;
mod silent;
mod speed;

pub use duplicate::late_release;
pub use paused::paused_commit;
pub use silent::silent_renewal;
pub use speed::{Load, Speed, speed, speed_table};

use std::sync::Arc;
use std::time::{Duration, Instant};

use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use pg_lease::{LeaseContext, LeaseLooper, LeaseLooperOptions, verify_lease_held};
use pglease::testing::TestDatabase;
use pglease::{AcquireOptions, LeaseManager};
use sqlx08::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::looper::writes_b;

/// Errors of any of the libraries, as text.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long the second worker tries to take over.
const WINDOW: Duration = Duration::from_secs(3);

/// A library compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// pglease: a lease with fenced writes.
    Pglease,
    /// `pg_lease` 0.1.3: `LeaseLooper`, writes checked with
    /// `verify_lease_held` in their transaction.
    PgLease,
    /// `distributed-lock-postgres` 0.2.0, session mode (its default).
    DistributedLock,
    /// sqlx 0.8's `PgAdvisoryLock` (session level).
    SqlxAdvisoryLock,
}

impl Peer {
    /// Every peer, in table order.
    pub const ALL: [Peer; 4] = [
        Peer::Pglease,
        Peer::PgLease,
        Peer::DistributedLock,
        Peer::SqlxAdvisoryLock,
    ];

    /// A short label.
    pub fn label(self) -> &'static str {
        match self {
            Peer::Pglease => "pglease",
            Peer::PgLease => "pg_lease 0.1.3",
            Peer::DistributedLock => "distributed-lock-postgres 0.2.0",
            Peer::SqlxAdvisoryLock => "sqlx 0.8 PgAdvisoryLock",
        }
    }
}

/// What a scenario did to a peer, as measured.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The peer.
    pub peer: Peer,
    /// The scenario's safety property was violated: a write by the old
    /// holder committed after the new holder's ((a), (b)), or two workers
    /// held the resource at once ((d): a late release ended the holder's
    /// new term; (e): the old one not told).
    pub violated: bool,
    /// How long after the fault the second worker held the resource;
    /// `None` if it could not within the window (3 s).
    pub took_over: Option<Duration>,
    /// What happened, with the figures.
    pub detail: String,
}

/// A scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// (a) The holder's commit is held up past its TTL.
    PausedCommit,
    /// (b) The holder's connection is killed.
    KilledConnection,
    /// (d) A release arrives late, after the holder acquired again.
    LateRelease,
    /// (e) The holder's renewals get no answer.
    SilentRenewal,
}

impl Scenario {
    /// Every scenario, in table order.
    pub const ALL: [Scenario; 4] = [
        Scenario::PausedCommit,
        Scenario::KilledConnection,
        Scenario::LateRelease,
        Scenario::SilentRenewal,
    ];

    /// A short label.
    pub fn label(self) -> &'static str {
        match self {
            Scenario::PausedCommit => {
                "(a) the holder's commit is held up past its TTL of 1 s (its network frozen until \
                 another worker has taken over and written, or for 3 s)"
            }
            Scenario::KilledConnection => "(b) the holder's connection is killed, then it writes",
            Scenario::LateRelease => {
                "(d) a release arrives late, after the same holder acquired again"
            }
            Scenario::SilentRenewal => {
                "(e) the holder's renewals get no answer (its network frozen for 3 s; TTL 1 s)"
            }
        }
    }

    /// What `violated` means in this scenario, as a column heading.
    pub fn violation(self) -> &'static str {
        match self {
            Scenario::PausedCommit | Scenario::KilledConnection => {
                "stale write applied after the new holder's"
            }
            Scenario::LateRelease => "the late release ended the new term, another took it",
            Scenario::SilentRenewal => "two holders at once, the old one not told",
        }
    }
}

/// Every scenario for every peer, each in a database of its own.
///
/// # Errors
///
/// A peer or the database failing in a way the scenario does not expect.
pub async fn safety() -> Result<Vec<(Scenario, Verdict)>, BoxError> {
    let mut verdicts = Vec::new();
    for peer in Peer::ALL {
        verdicts.push((Scenario::PausedCommit, paused_commit(peer).await?));
    }
    for peer in Peer::ALL {
        verdicts.push((Scenario::KilledConnection, killed_connection(peer).await?));
    }
    for peer in Peer::ALL {
        verdicts.push((Scenario::LateRelease, late_release(peer).await?));
    }
    for peer in Peer::ALL {
        verdicts.push((Scenario::SilentRenewal, silent_renewal(peer).await?));
    }
    Ok(verdicts)
}

/// Scenario (b) for every peer, each in a database of its own.
///
/// # Errors
///
/// A peer or the database failing in a way the scenario does not expect.
pub async fn killed_connection_all() -> Result<Vec<Verdict>, BoxError> {
    let mut verdicts = Vec::new();
    for peer in Peer::ALL {
        verdicts.push(killed_connection(peer).await?);
    }
    Ok(verdicts)
}

/// Scenario (b): the holder's connection is killed (`pg_terminate_backend`
/// on every connection of its pool), a second worker tries for up to 3 s
/// to take over and writes if it did, then the first holder writes as its
/// library says to.
///
/// # Errors
///
/// As [`killed_connection_all`].
pub async fn killed_connection(peer: Peer) -> Result<Verdict, BoxError> {
    let db = scratch().await?;
    let verdict = match peer {
        Peer::Pglease => killed_pglease(&db).await?,
        Peer::PgLease => killed_pg_lease(&db).await?,
        Peer::DistributedLock => killed_dlock(&db).await?,
        Peer::SqlxAdvisoryLock => killed_sqlx_lock(&db).await?,
    };
    Ok(verdict)
}

/// A database of its own with the ledger the writers append to.
async fn scratch() -> Result<TestDatabase, BoxError> {
    let db = TestDatabase::new().await?;
    sqlx08::raw_sql("CREATE TABLE ledger (seq bigserial PRIMARY KEY, writer text NOT NULL)")
        .execute(&pool(&db, "setup").await?)
        .await?;
    Ok(db)
}

/// A sqlx 0.8 pool on the scenario's database, its connections named `app`.
async fn pool(db: &TestDatabase, app: &str) -> Result<PgPool, BoxError> {
    let options: PgConnectOptions = db.url().parse()?;
    Ok(PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options.application_name(app))
        .await?)
}

/// A distributed-lock-postgres provider on `pool`.
async fn dlock(pool: PgPool) -> Result<distributed_lock_postgres::PostgresLockProvider, BoxError> {
    Ok(distributed_lock_postgres::PostgresLockProvider::builder()
        .pool(pool)
        .build()
        .await?)
}

/// Ends every session named `app`; how many.
async fn kill(db: &TestDatabase, app: &str) -> Result<i64, BoxError> {
    let killed: i64 = sqlx08::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
          WHERE datname = current_database() AND application_name = $1",
    )
    .bind(app)
    .fetch_one(&pool(db, "killer").await?)
    .await?;
    Ok(killed)
}

/// The writers in commit order.
async fn ledger(db: &TestDatabase) -> Result<Vec<String>, BoxError> {
    Ok(
        sqlx08::query_scalar("SELECT writer FROM ledger ORDER BY seq")
            .fetch_all(&pool(db, "reader").await?)
            .await?,
    )
}

/// Whether an `A` row follows a `B` row.
fn stale_after_new(rows: &[String]) -> bool {
    rows.iter()
        .position(|w| w == "B")
        .is_some_and(|b| rows[b..].iter().any(|w| w == "A"))
}

/// Appends `writer`'s row to the ledger.
async fn write(pool: &PgPool, writer: &str) -> Result<(), BoxError> {
    sqlx08::query("INSERT INTO ledger (writer) VALUES ($1)")
        .bind(writer)
        .execute(pool)
        .await?;
    Ok(())
}

/// Scenario (b) for pglease: A's write fenced.
async fn killed_pglease(db: &TestDatabase) -> Result<Verdict, BoxError> {
    let options = db.options().application_name("peer-A");
    let a = LeaseManager::new(
        pglease::connect::pool_options()
            .max_connections(4)
            .connect_with(options)
            .await?,
    );
    let held = a
        .hold(
            "res",
            AcquireOptions::ttl(Duration::from_secs(2)).holder("A"),
        )
        .await?;
    let killed = kill(db, "peer-A").await?;
    let b = db.manager();
    let started = Instant::now();
    let took_over = match b
        .acquire(
            "res",
            AcquireOptions::ttl(Duration::from_secs(30))
                .holder("B")
                .wait(WINDOW),
        )
        .await
    {
        Ok(lease) => {
            let at = started.elapsed();
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
    let wrote = a
        .fenced(&held, async |conn| {
            sqlx::query("INSERT INTO ledger (writer) VALUES ('A')")
                .execute(&mut *conn)
                .await?;
            Ok::<_, pglease::Error>(())
        })
        .await;
    let rows = ledger(db).await?;
    let lost = held.is_lost();
    held.release().await.ok();
    Ok(Verdict {
        peer: Peer::Pglease,
        violated: stale_after_new(&rows),
        took_over,
        detail: format!(
            "A's connections ended: {killed}; the lease lives in its table, not in a \
             connection: A renewed through new ones (lost: {lost}), B {}; A's fenced write: {}",
            match took_over {
                Some(t) => format!("took over after {} ms", t.as_millis()),
                None => format!("could not take over within {} s", WINDOW.as_secs()),
            },
            match wrote {
                Ok(()) => "committed, as the holder's".to_owned(),
                Err(e) => format!("refused ({e})"),
            }
        ),
    })
}

/// Answers one of A's writes with its outcome.
type Ack = oneshot::Sender<Result<(), String>>;
/// A's commands: write once each and answer it.
type Commands = Arc<Mutex<mpsc::Receiver<Ack>>>;

/// A's looper function in scenario (b) for pg_lease: writes once per
/// command, as pg_lease documents: in a transaction that first calls
/// `verify_lease_held`.
async fn writes_on_command(
    ctx: LeaseContext,
    (pool, inbox): (PgPool, Commands),
) -> Result<(), BoxError> {
    loop {
        let Some(ack) = inbox.lock().await.recv().await else {
            return Ok(());
        };
        let outcome = async {
            let mut tx = pool.begin().await?;
            if !verify_lease_held(&mut tx, &ctx.lease_name, &ctx.worker_id).await? {
                return Err::<(), BoxError>("not held".into());
            }
            sqlx08::query("INSERT INTO ledger (writer) VALUES ('A')")
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        }
        .await;
        let _ = ack.send(outcome.map_err(|e| e.to_string()));
    }
}

/// Scenario (b) for pg_lease: loopers, A's write checked by `verify_lease_held`.
async fn killed_pg_lease(db: &TestDatabase) -> Result<Verdict, BoxError> {
    let options = LeaseLooperOptions {
        loop_interval: Duration::from_millis(100),
        loop_interval_jitter: Duration::ZERO,
        lease_duration: Duration::from_secs(2),
        lease_heartbeat_interval: Duration::from_millis(500),
    };
    let (commands, inbox) = mpsc::channel::<Ack>(1);
    let inbox = Arc::new(Mutex::new(inbox));
    let a_pool = pool(db, "peer-A").await?;
    let a = LeaseLooper::new(
        "res".to_owned(),
        writes_on_command,
        "A".to_owned(),
        a_pool.clone(),
        options,
        (a_pool, inbox),
    );
    a.start().await?;
    let reader = pool(db, "reader").await?;
    crate::looper::until_held_by(&reader, "A").await?;
    let killed = kill(db, "peer-A").await?;
    let b_pool = pool(db, "peer-B").await?;
    let b = LeaseLooper::new(
        "res".to_owned(),
        writes_b,
        "B".to_owned(),
        b_pool.clone(),
        options,
        b_pool,
    );
    let started = Instant::now();
    b.start().await?;
    let mut took_over = None;
    while started.elapsed() < WINDOW {
        if crate::looper::holder(&reader).await.as_deref() == Some("B") {
            took_over = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (ack, acked) = oneshot::channel();
    commands.send(ack).await.map_err(|_| "A's looper stopped")?;
    let wrote = tokio::time::timeout(Duration::from_secs(10), acked)
        .await
        .map_err(|_| "A's write got no answer")?
        .map_err(|_| "A's looper dropped the write")?;
    let rows = ledger(db).await?;
    a.stop().await?;
    b.stop().await?;
    Ok(Verdict {
        peer: Peer::PgLease,
        violated: stale_after_new(&rows),
        took_over,
        detail: format!(
            "A's connections ended: {killed}; the lease row outlives them: A's heartbeat went on \
             through new connections, B {}; A's verified write: {}",
            match took_over {
                Some(t) => format!("took over after {} ms", t.as_millis()),
                None => format!("could not take over within {} s", WINDOW.as_secs()),
            },
            match wrote {
                Ok(()) => "committed".to_owned(),
                Err(e) => format!("refused ({e})"),
            }
        ),
    })
}

/// Scenario (b) for distributed-lock-postgres: A writes through its pool.
async fn killed_dlock(db: &TestDatabase) -> Result<Verdict, BoxError> {
    let a_pool = pool(db, "peer-A").await?;
    let a = dlock(a_pool.clone()).await?;
    let handle = a.create_lock("res").acquire(Some(WINDOW)).await?;
    let killed = kill(db, "peer-A").await?;
    let b_pool = pool(db, "peer-B").await?;
    let b = dlock(b_pool.clone()).await?;
    let started = Instant::now();
    let b_handle = b.create_lock("res").acquire(Some(WINDOW)).await.ok();
    let took_over = b_handle.as_ref().map(|_| started.elapsed());
    if b_handle.is_some() {
        write(&b_pool, "B").await?;
    }
    // The library's signal for a lost lock, then the write (it offers no
    // way to tie a write to the lock: the handle's connection is private).
    let lost = *handle.lost_token().borrow();
    let wrote = write(&a_pool, "A").await;
    let rows = ledger(db).await?;
    let _ = handle.release().await;
    if let Some(h) = b_handle {
        let _ = h.release().await;
    }
    Ok(Verdict {
        peer: Peer::DistributedLock,
        violated: stale_after_new(&rows),
        took_over,
        detail: format!(
            "A's connections ended: {killed}; the lock went with them, B {}; A's lost_token \
             still said {lost}; A's write through its pool: {}",
            match took_over {
                Some(t) => format!("took over after {} ms", t.as_millis()),
                None => format!("could not take over within {} s", WINDOW.as_secs()),
            },
            match wrote {
                Ok(()) if stale_after_new(&rows) => "APPLIED after B's".to_owned(),
                Ok(()) => "applied".to_owned(),
                Err(e) => format!("refused ({e})"),
            }
        ),
    })
}

/// Scenario (b) for sqlx's `PgAdvisoryLock`: A writes on the guard's connection.
async fn killed_sqlx_lock(db: &TestDatabase) -> Result<Verdict, BoxError> {
    use sqlx08::postgres::PgAdvisoryLock;

    let a_pool = pool(db, "peer-A").await?;
    let lock = PgAdvisoryLock::new("res");
    let mut guard = lock.acquire(a_pool.acquire().await?).await?;
    let killed = kill(db, "peer-A").await?;
    let b_pool = pool(db, "peer-B").await?;
    let started = Instant::now();
    let mut took_over = None;
    let mut b_guard = None;
    while started.elapsed() < WINDOW {
        match lock.try_acquire(b_pool.acquire().await?).await? {
            sqlx08::Either::Left(g) => {
                took_over = Some(started.elapsed());
                b_guard = Some(g);
                break;
            }
            sqlx08::Either::Right(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    if b_guard.is_some() {
        write(&b_pool, "B").await?;
    }
    // Through the guard's own connection (dead), then the obvious retry
    // through the pool.
    let through_guard = sqlx08::query("INSERT INTO ledger (writer) VALUES ('A')")
        .execute(&mut *guard)
        .await;
    let retried = write(&a_pool, "A").await;
    let rows = ledger(db).await?;
    let b_wrote = rows.iter().any(|w| w == "B");
    drop(guard);
    drop(b_guard);
    Ok(Verdict {
        peer: Peer::SqlxAdvisoryLock,
        // Judged by the documented use, the write through the guard's
        // connection; the retry without re-acquiring is the application's
        // mistake, shown in the detail.
        violated: through_guard.is_ok() && b_wrote,
        took_over,
        detail: format!(
            "A's connections ended: {killed}; the lock went with them, B {}; A's write through \
             the guard's connection, as documented: {}; an application that retries through \
             its pool without re-acquiring: {}",
            match took_over {
                Some(t) => format!("took over after {} ms", t.as_millis()),
                None => format!("could not take over within {} s", WINDOW.as_secs()),
            },
            match through_guard {
                Ok(_) => "applied".to_owned(),
                Err(e) => format!("failed ({e})"),
            },
            match retried {
                Ok(()) if b_wrote && stale_after_new(&rows) => "APPLIED after B's".to_owned(),
                Ok(()) => "applied".to_owned(),
                Err(e) => format!("refused ({e})"),
            }
        ),
    })
}

/// The verdicts as Markdown tables, one per scenario.
pub fn tables(verdicts: &[(Scenario, Verdict)]) -> String {
    let mut out = String::new();
    for scenario in Scenario::ALL {
        let these: Vec<Verdict> = verdicts
            .iter()
            .filter(|(s, _)| *s == scenario)
            .map(|(_, v)| v.clone())
            .collect();
        if !these.is_empty() {
            out.push_str(&format!(
                "\n{}\n\n{}\n",
                scenario.label(),
                table(scenario.violation(), &these)
            ));
        }
    }
    out
}

/// The verdicts of one scenario as a Markdown table; `violation` heads
/// the verdict's column.
pub fn table(violation: &str, verdicts: &[Verdict]) -> String {
    let mut out = format!(
        "| peer | {violation} | takeover | what happened |\n\
         |---|---|---|---|"
    );
    for v in verdicts {
        out.push_str(&format!(
            "\n| {} | {} | {} | {} |",
            v.peer.label(),
            if v.violated { "YES" } else { "no" },
            v.took_over
                .map_or_else(|| "none".to_owned(), |t| format!("{} ms", t.as_millis())),
            v.detail
        ));
    }
    out
}
