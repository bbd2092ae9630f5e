//! A test kit for services that use pglease (feature `testing`, for
//! dev-dependencies): a database of its own per test, and lease loss on
//! demand.
//!
//! - [`TestDatabase`]: a fresh database with the schema migrated, on the
//!   server that [`crate::provision`] finds (`DATABASE_URL`, a running
//!   server, a throwaway cluster, a container), dropped afterwards; tests
//!   run in parallel, each in its own database.
//! - [`expire_now`] and [`take_over`]: end a lease in the database at once,
//!   and let another holder have it, without waiting for a TTL.
//! - [`Faults`] (from [`LeaseManager::faults`]): make a manager's renewals
//!   fail as if the server could not be reached, pause its renewal task,
//!   or renew at once.
//!
//! Each drives the code that runs in production: the holder learns of the
//! loss from its renewal or its deadline and reports the same
//! [`LossReason`](crate::LossReason) it would report there, and its fenced
//! writes are rejected by the database. Nothing here can be switched on
//! in a build without the feature, and the SQL side is a plain `UPDATE` of
//! `pglease.leases`, which only the schema's owner (or a role granted
//! `UPDATE` on the table) may run: an application role that follows
//! the documented grants gets `42501`.
//!
//! See the README's "Testing your service" and `examples/worker_test.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};
use tokio::sync::watch;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::hold::Registry;
use crate::input::check_text;
use crate::lease::{Acquire, Lease};
use crate::manager::LeaseManager;
use crate::provision::{NoServer, Server};

static NEXT_DB: AtomicU32 = AtomicU32::new(0);

/// Why a [`TestDatabase`] could not be made. Its `Debug` is its message,
/// so that `.expect()` prints it readably.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// No server was found or started.
    #[error(transparent)]
    NoServer(#[from] NoServer),
    /// The server refused to create the database or to apply the schema.
    #[error("cannot set up a test database on {server}: {error}")]
    Database {
        /// The server, as [`Server`]'s `Display` names it.
        server: String,
        /// What failed.
        error: Error,
    },
}

impl std::fmt::Debug for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// A database of its own for one test, on the process's server
/// ([`crate::provision::server`]): created with a unique name, with the
/// pglease schema applied ([`TestDatabase::new`]) or without
/// ([`TestDatabase::empty`]), and dropped (its connections ended) when this
/// value is dropped, also when the test panics.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use pglease::testing::TestDatabase;
///
/// let db = TestDatabase::new().await?;
/// let manager = db.manager();
/// let lease = manager
///     .acquire("job", pglease::Acquire::ttl(Duration::from_secs(30)))
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    server: &'static Server,
    options: PgConnectOptions,
    pool: PgPool,
}

impl TestDatabase {
    /// A new database with the pglease schema applied.
    ///
    /// # Errors
    ///
    /// [`SetupError`]: no server, or the server refused.
    ///
    /// # Cancel safety
    ///
    /// Cancelled after the database was created, it is left behind (named
    /// `pglease_test_PID_N`) until a later run drops it with the same name.
    pub async fn new() -> std::result::Result<TestDatabase, SetupError> {
        let db = TestDatabase::empty().await?;
        db.manager()
            .migrate()
            .await
            .map_err(|error| db.failed(error))?;
        Ok(db)
    }

    /// A new database without the pglease schema.
    ///
    /// # Errors
    ///
    /// As [`TestDatabase::new`].
    ///
    /// # Cancel safety
    ///
    /// As [`TestDatabase::new`].
    pub async fn empty() -> std::result::Result<TestDatabase, SetupError> {
        let server = crate::provision::server().await?;
        let failed = |error: sqlx::Error| SetupError::Database {
            server: server.to_string(),
            error: Error::from(error),
        };
        let name = format!(
            "pglease_test_{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = server.options.connect().await.map_err(failed)?;
        for statement in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        ] {
            sqlx::raw_sql(AssertSqlSafe(statement))
                .execute(&mut admin)
                .await
                .map_err(failed)?;
        }
        let _ = admin.close().await;
        let options = server.options.clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(12)
            .acquire_timeout(Duration::from_secs(30))
            .connect_lazy_with(options.clone());
        Ok(TestDatabase {
            name,
            server,
            options,
            pool,
        })
    }

    fn failed(&self, error: Error) -> SetupError {
        SetupError::Database {
            server: self.server.to_string(),
            error,
        }
    }

    /// Its name (`pglease_test_PID_N`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server it is on, and which step of [`crate::provision`] found
    /// it.
    pub fn server(&self) -> &'static Server {
        self.server
    }

    /// A pool on it (up to 12 connections).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Connect options for it.
    pub fn options(&self) -> PgConnectOptions {
        self.options.clone()
    }

    /// It as a URL, for programs that take one (the `pglease` command,
    /// a service's configuration).
    pub fn url(&self) -> String {
        self.server.url(&self.name)
    }

    /// A manager on [`TestDatabase::pool`].
    pub fn manager(&self) -> LeaseManager {
        LeaseManager::new(self.pool.clone())
    }

    /// A manager with `options` on a pool of its own (4 connections), as a
    /// second process would have. Build it on the runtime that uses it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for invalid options.
    pub fn manager_with(&self, options: crate::ManagerOptions) -> Result<LeaseManager> {
        let pool = crate::pool_options()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect_lazy_with(self.options.clone());
        LeaseManager::with_options(pool, options)
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop cannot await: a thread with a runtime of its own, joined, so
        // that the database is gone when the test ends.
        let admin = self.server.options.clone();
        let statement = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(mut connection) = admin.connect().await {
                    let _ = sqlx::raw_sql(AssertSqlSafe(statement))
                        .execute(&mut connection)
                        .await;
                    let _ = connection.close().await;
                }
            });
        })
        .join();
    }
}

/// Ends lease `name` now, in the database: its expiry becomes the
/// database clock's now, so its token fences nothing from here on (fenced
/// writes fail with `LE001`, renewals are refused, the next acquisition
/// takes it over). Its holder learns of it at its next renewal
/// ([`Faults::renew_now`] makes that happen at once) and loses it with
/// [`LossReason::Stale`](crate::LossReason::Stale). Observers are not
/// notified of the earlier expiry (they see it when they next read).
///
/// Returns whether a held lease was ended (`false`: it was not held).
///
/// # Errors
///
/// [`Error::InvalidInput`] for a bad name; [`Error::Database`] with
/// SQLSTATE `42501` for a role that may not update `pglease.leases` (an
/// application role never may).
///
/// # Cancel safety
///
/// One statement: cancelled, it has ended the lease or not.
pub async fn expire_now(pool: &PgPool, name: &str) -> Result<bool> {
    check_text("name", name)?;
    let ended = sqlx::query(
        "UPDATE pglease.leases SET expires_at = clock_timestamp() \
          WHERE name = $1 AND holder IS NOT NULL AND expires_at > clock_timestamp()",
    )
    .persistent(false)
    .bind(name)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(ended > 0)
}

/// Ends lease `name` now ([`expire_now`]) and acquires it through
/// `manager` as `how` says: another holder takes it over, as after a real
/// expiry (a transaction still fenced under the old token is ended, its
/// writes rolled back).
///
/// # Errors
///
/// As [`expire_now`] and [`LeaseManager::acquire`]; [`Error::Timeout`] if
/// the acquisition is held up longer than `how` allows.
///
/// # Cancel safety
///
/// As [`LeaseManager::acquire`]; cancelled after the first step, the lease
/// has ended and nobody holds it.
pub async fn take_over(manager: &LeaseManager, name: &str, how: Acquire) -> Result<Lease> {
    expire_now(manager.pool(), name).await?;
    manager.acquire(name, how).await
}

/// The faults a test has switched on for one manager.
pub(crate) struct FaultFlags {
    failing: AtomicBool,
    paused: watch::Sender<bool>,
}

impl Default for FaultFlags {
    fn default() -> Self {
        FaultFlags {
            failing: AtomicBool::new(false),
            paused: watch::Sender::new(false),
        }
    }
}

impl FaultFlags {
    pub(crate) fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    pub(crate) fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Resolves once the renewal task is no longer paused.
    pub(crate) async fn resumed(&self) {
        let mut paused = self.paused.subscribe();
        let _ = paused.wait_for(|paused| !paused).await;
    }
}

/// The error a renewal made to fail reports: the one a server that
/// refuses connections gives.
pub(crate) fn refused() -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "connection refused (made to fail by pglease::testing::Faults::fail_renewals)",
    ))
}

/// Faults for one manager (and its clones), for tests: see
/// [`LeaseManager::faults`].
#[derive(Clone)]
pub struct Faults {
    context: Arc<Context>,
    registry: Arc<Registry>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("renewals_failing", &self.context.faults.is_failing())
            .field("renewals_paused", &self.context.faults.is_paused())
            .finish()
    }
}

impl Faults {
    pub(crate) fn new(context: Arc<Context>, registry: Arc<Registry>) -> Faults {
        Faults { context, registry }
    }

    /// From now on every renewal statement fails as if the server refused
    /// connections: the manager retries with its backoff, and a lease
    /// whose deadline passes is lost with
    /// [`LossReason::Unreachable`](crate::LossReason::Unreachable) (its
    /// release is tried in the background, as in production). Until
    /// [`Faults::restore_renewals`]. Only renewals fail: acquisitions,
    /// releases and fenced transactions still reach the database.
    pub fn fail_renewals(&self) {
        self.context.faults.failing.store(true, Ordering::Release);
    }

    /// Renewals reach the database again; leases not yet lost are renewed
    /// at their next retry ([`Faults::renew_now`]: at once).
    pub fn restore_renewals(&self) {
        self.context.faults.failing.store(false, Ordering::Release);
        self.registry.wake.notify_one();
    }

    /// Pauses the manager's renewal task, as if it were starved or its
    /// process stopped: nothing is renewed, the leases expire in the
    /// database, and each holder loses its lease at its local deadline
    /// with [`LossReason::Expired`](crate::LossReason::Expired). Until
    /// [`Faults::resume_renewals`].
    pub fn pause_renewals(&self) {
        self.context.faults.paused.send_replace(true);
        self.registry.wake.notify_one();
    }

    /// Resumes the renewal task; a lease taken over meanwhile is then lost
    /// with [`LossReason::Stale`](crate::LossReason::Stale) at its next
    /// renewal.
    pub fn resume_renewals(&self) {
        self.context.faults.paused.send_replace(false);
    }

    /// Makes every lease the manager holds due for renewal now, so that a
    /// test learns at once what the database says of them (after
    /// [`expire_now`], say) instead of at the next renewal.
    pub fn renew_now(&self) {
        self.registry.make_due(tokio::time::Instant::now());
    }
}
