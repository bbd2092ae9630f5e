//! A database of its own for each test, and the helpers a test of
//! leases needs on it: the database clock, a wait for a database time,
//! the schema's whole state, an acquisition held up inside the database.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgConnection};

use super::{SetupError, poll_until};
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::manager::LeaseManager;
use crate::options::AcquireOptions;
use crate::provision::Server;

static NEXT_DB: AtomicU32 = AtomicU32::new(0);

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
///     .acquire("job", pglease::AcquireOptions::ttl(Duration::from_secs(30)))
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    server: &'static Server,
    options: PgConnectOptions,
    pool: PgPool,
    /// Roles to drop after the database ([`TestDatabase::scratch_roles`]).
    roles: std::sync::Mutex<Vec<String>>,
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
            roles: std::sync::Mutex::default(),
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

    /// Takes charge of `roles`, which the test is about to create for this
    /// database: each is dropped now if an earlier run left it, and again
    /// when this database is dropped, after it (roles belong to the server,
    /// not to a database, and one that owns objects cannot be dropped
    /// before them). Choose names no other test uses (this database's name
    /// is unique).
    ///
    /// # Panics
    ///
    /// If a role left behind cannot be dropped.
    pub async fn scratch_roles(&self, roles: &[&str]) {
        let leftovers: Vec<String> = roles
            .iter()
            .map(|role| format!("DROP ROLE IF EXISTS {role}"))
            .collect();
        self.execute(&leftovers).await;
        crate::sync::lock(&self.roles).extend(roles.iter().map(|role| (*role).to_owned()));
    }

    /// A connection of its own, outside the pool.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] if the server cannot be reached.
    pub async fn connect(&self) -> Result<PgConnection> {
        Ok(self.options.connect().await?)
    }

    /// It as a URL for another role, `user` with `password` (a test of
    /// grants; the role is the test's to create).
    pub fn url_for(&self, user: &str, password: &str) -> String {
        let o = &self.options;
        let host = o.get_host();
        if host.starts_with('/') {
            format!(
                "postgres://{user}:{password}@localhost:{}/{}?host={host}",
                o.get_port(),
                self.name
            )
        } else {
            format!(
                "postgres://{user}:{password}@{host}:{}/{}",
                o.get_port(),
                self.name
            )
        }
    }

    /// Runs `statements` in order, each on its own, on the pool.
    ///
    /// # Panics
    ///
    /// With the statement that failed, and why.
    pub async fn execute<S: AsRef<str>>(&self, statements: &[S]) {
        for sql in statements {
            let sql = sql.as_ref();
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&self.pool)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    }

    /// The database clock now (`clock_timestamp()`): the clock every
    /// expiry is decided on.
    ///
    /// # Panics
    ///
    /// If the database cannot be read.
    pub async fn now(&self) -> DateTime<Utc> {
        sqlx::query_scalar("SELECT clock_timestamp()")
            .persistent(false)
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("read the database clock: {e}"))
    }

    /// Waits until the database clock is past `instant` (such as a lease's
    /// `expires_at`): a poll with a deadline, on the clock that decides.
    ///
    /// # Panics
    ///
    /// If the database clock has not passed `instant` within 60 s.
    pub async fn wait_until(&self, instant: DateTime<Utc>) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let now = self.now().await;
            if now > instant {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the database clock did not pass {instant} within 60 s"
            );
            let left = (instant - now).to_std().unwrap_or_default();
            tokio::time::sleep(left.min(Duration::from_millis(50)) + Duration::from_millis(1))
                .await;
        }
    }

    /// Everything the `pglease` schema stores (leases, history, the
    /// separate-resource marks, the token sequence), as text: equal before
    /// and after a call that must change nothing.
    ///
    /// # Panics
    ///
    /// If the schema cannot be read.
    pub async fn state(&self) -> String {
        sqlx::query_scalar(
            "SELECT concat_ws(E'\\n', \
               (SELECT string_agg(format('%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s', name, \
                                         holder, token, expires_at, acquired_at, renewed_at, \
                                         released_at, value, value_token, step_down_token, \
                                         step_down_by, step_down_at, renewals, role, \
                                         value_changes), E'\\n' ORDER BY name) \
                  FROM pglease.leases), \
               (SELECT format('history %s %s', count(*), max(id)) FROM pglease._history), \
               (SELECT string_agg(format('%s|%s|%s', resource, token, advanced_at), E'\\n' \
                                  ORDER BY resource) FROM pglease.fences), \
               (SELECT format('seq %s %s', last_value, is_called) FROM pglease.fence_seq))",
        )
        .persistent(false)
        .fetch_one(&self.pool)
        .await
        .unwrap_or_else(|e| panic!("read the pglease schema: {e}"))
    }

    /// Makes every acquisition of `name` wait inside the database, as
    /// behind an acquisition, renewal or release that is slow to commit:
    /// `manager` acquires the lease for 300 ms (holder `A`), the database
    /// clock passes its expiry, and holder `X` acquires it again in a
    /// transaction that stays open, returned with A's lease. Until that
    /// transaction ends, another acquisition of `name` waits in
    /// `pglease.acquire` (for up to about 2 s; then it reports the lease
    /// pinned).
    ///
    /// # Panics
    ///
    /// If either acquisition fails.
    pub async fn hold_up(
        &self,
        manager: &LeaseManager,
        name: &str,
    ) -> (Lease, sqlx::Transaction<'static, sqlx::Postgres>) {
        let lease = manager
            .acquire(
                name,
                AcquireOptions::ttl(Duration::from_millis(300)).holder("A"),
            )
            .await
            .unwrap_or_else(|e| panic!("A acquires {name:?}: {e}"));
        self.wait_until(lease.expires_at()).await;
        let mut blocker = self
            .pool
            .begin()
            .await
            .unwrap_or_else(|e| panic!("X begins: {e}"));
        let token: Option<i64> =
            sqlx::query_scalar("SELECT token FROM pglease.acquire($1, 'X', '10 min')")
                .persistent(false)
                .bind(name)
                .fetch_one(&mut *blocker)
                .await
                .unwrap_or_else(|e| panic!("X acquires {name:?}, uncommitted: {e}"));
        assert!(token.is_some(), "X acquires the expired lease {name:?}");
        (lease, blocker)
    }

    /// Waits until a session of this database (with `application_name`
    /// `app`, if given) runs `pglease.acquire`: held up inside the
    /// database, as behind [`TestDatabase::hold_up`].
    ///
    /// # Panics
    ///
    /// After 30 s.
    pub async fn until_acquiring(&self, app: Option<&str>) {
        self.until_sessions_acquiring(true, app).await;
    }

    /// Waits until no session of this database runs `pglease.acquire`.
    ///
    /// # Panics
    ///
    /// After 30 s.
    pub async fn until_not_acquiring(&self) {
        self.until_sessions_acquiring(false, None).await;
    }

    async fn until_sessions_acquiring(&self, acquiring: bool, app: Option<&str>) {
        let what = if acquiring {
            "a session to be held up in pglease.acquire"
        } else {
            "no session to be in pglease.acquire"
        };
        poll_until(what, Duration::from_secs(30), || async {
            let found: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
                  WHERE datname = current_database() AND state = 'active' \
                    AND query LIKE '%pglease.acquire(%' AND pid <> pg_backend_pid() \
                    AND ($1::text IS NULL OR application_name = $1))",
            )
            .persistent(false)
            .bind(app)
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("read pg_stat_activity: {e}"));
            found == acquiring
        })
        .await;
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
        let pool = crate::connect::pool_options()
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
        let roles = std::mem::take(&mut *crate::sync::lock(&self.roles));
        let statements: Vec<String> = std::iter::once(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ))
        .chain(
            roles
                .iter()
                .map(|role| format!("DROP ROLE IF EXISTS {role}")),
        )
        .collect();
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(mut connection) = admin.connect().await {
                    for statement in statements {
                        let _ = sqlx::raw_sql(AssertSqlSafe(statement))
                            .execute(&mut connection)
                            .await;
                    }
                    let _ = connection.close().await;
                }
            });
        })
        .join();
    }
}
