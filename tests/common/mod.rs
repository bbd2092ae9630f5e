//! Test provisioning: a real PostgreSQL, and a fresh database per test so
//! that tests run in parallel without seeing each other's leases. Both come
//! from the crate's own test kit (`pglease::testing`, `pglease::provision`),
//! which finds the server in this order: `DATABASE_URL`; else the libpq
//! defaults (`PGHOST`, `PGPORT`, `PGUSER`, ... then localhost:5432) if a
//! server answers there; else a throwaway cluster from the installed server
//! binaries; else a container started with `testcontainers`; else the test
//! panics and says how to get a database.

#![allow(dead_code)] // each test binary uses a different part of this file

use std::time::Duration;

use chrono::{DateTime, Utc};
use pglease::testing::TestDatabase;
use pglease::{Acquire, Lease, LeaseManager, ManagerOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgConnection, PgPool};

/// Options for the server (its `postgres` database), found once per test
/// binary.
pub fn server() -> PgConnectOptions {
    // Found once per process by the kit; this thread and its runtime only
    // wait for it, so that the function can be called from `Drop`.
    std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("build a tokio runtime for provisioning");
        rt.block_on(pglease::provision::server())
            .map(|server| server.options.clone())
            .unwrap_or_else(|e| panic!("{e}"))
    })
    .join()
    .expect("provisioning thread panicked")
}

/// A freshly created database, dropped (with its connections) when this
/// value is dropped, also when the test panics.
pub struct TestDb {
    inner: TestDatabase,
    name: String,
    options: PgConnectOptions,
    pool: PgPool,
}

impl TestDb {
    /// A new database with the `pglease` schema applied.
    pub async fn new() -> TestDb {
        TestDb::from(TestDatabase::new().await)
    }

    /// A new database without the `pglease` schema.
    pub async fn empty() -> TestDb {
        TestDb::from(TestDatabase::empty().await)
    }

    fn from(made: Result<TestDatabase, pglease::testing::SetupError>) -> TestDb {
        let inner = made.unwrap_or_else(|e| panic!("{e}"));
        TestDb {
            name: inner.name().to_owned(),
            options: inner.options(),
            pool: inner.pool().clone(),
            inner,
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn manager(&self) -> LeaseManager {
        LeaseManager::new(self.pool.clone())
    }

    /// A manager with `options` on a pool of its own whose connections
    /// carry `application_name` = `app`, so that a test can find them in
    /// `pg_stat_activity`. Build it on the runtime that will use it.
    pub async fn manager_with(&self, app: &str, options: ManagerOptions) -> LeaseManager {
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(self.options.clone().application_name(app))
            .await
            .expect("connect a manager's pool");
        LeaseManager::with_options(pool, options).expect("valid manager options")
    }

    /// This database as a URL, for the command-line tool.
    pub fn url(&self) -> String {
        self.inner.url()
    }

    pub fn options(&self) -> PgConnectOptions {
        self.options.clone()
    }

    /// Runs `statements` in order, each on its own; panics with the one
    /// that fails.
    pub async fn execute_all(&self, statements: &[String]) {
        for sql in statements {
            sqlx::query(AssertSqlSafe(sql.clone()))
                .execute(&self.pool)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    }

    /// A connection of its own, outside the pool.
    pub async fn connect(&self) -> PgConnection {
        self.options
            .connect()
            .await
            .expect("connect to the test database")
    }

    /// The database clock.
    pub async fn db_now(&self) -> DateTime<Utc> {
        sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&self.pool)
            .await
            .expect("read the database clock")
    }

    /// Waits until the database clock is past `instant` (a poll with a
    /// deadline: the database clock is the one that decides expiry).
    pub async fn wait_until_db_time(&self, instant: DateTime<Utc>) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let now = self.db_now().await;
            if now > instant {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "database clock did not reach {instant} within 60 s"
            );
            let left = (instant - now).to_std().unwrap_or_default();
            tokio::time::sleep(left.min(Duration::from_millis(50)) + Duration::from_millis(1))
                .await;
        }
    }

    /// Lease `name` acquired by `m` for 300 ms and expired, then acquired
    /// again by "X" in a transaction that stays open (returned): until it
    /// ends, any other acquisition of `name` is held up inside the
    /// database behind X's row lock, as behind an acquisition or a release
    /// that is slow to commit, for up to about 2 s (then it reports the
    /// lease pinned).
    pub async fn held_up(
        &self,
        m: &LeaseManager,
        name: &str,
    ) -> (Lease, sqlx::Transaction<'static, sqlx::Postgres>) {
        let lease = m
            .acquire(name, Acquire::ttl(Duration::from_millis(300)).holder("A"))
            .await
            .expect("A acquires");
        self.wait_until_db_time(lease.expires_at()).await;
        let mut blocker = self.pool.begin().await.expect("X begins");
        let token: Option<i64> =
            sqlx::query_scalar("SELECT token FROM pglease.acquire($1, 'X', '10 min')")
                .bind(name)
                .fetch_one(&mut *blocker)
                .await
                .expect("X acquires, uncommitted");
        assert!(token.is_some(), "X acquires the expired lease");
        (lease, blocker)
    }

    /// A URL for this database as `user` with `password`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
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

    /// This database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits until a session of this database (with `application_name`
    /// `app`, if given) is running `pglease.acquire`: held up inside the
    /// database, as behind [`TestDb::held_up`]'s open acquisition.
    pub async fn until_acquiring(&self, app: Option<&str>) {
        poll_until(
            "a session to be held up in pglease.acquire",
            Duration::from_secs(30),
            || async {
                sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
                      WHERE datname = current_database() AND state = 'active' \
                        AND query LIKE '%pglease.acquire(%' AND pid <> pg_backend_pid() \
                        AND ($1::text IS NULL OR application_name = $1))",
                )
                .bind(app)
                .fetch_one(self.pool())
                .await
                .expect("read pg_stat_activity")
            },
        )
        .await;
    }

    /// Waits until no session of this database runs `pglease.acquire`.
    pub async fn until_not_acquiring(&self) {
        poll_until(
            "no session to be in pglease.acquire",
            Duration::from_secs(30),
            || async {
                sqlx::query_scalar(
                    "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity \
                      WHERE datname = current_database() AND state = 'active' \
                        AND query LIKE '%pglease.acquire(%' AND pid <> pg_backend_pid())",
                )
                .fetch_one(self.pool())
                .await
                .expect("read pg_stat_activity")
            },
        )
        .await;
    }

    /// Everything the `pglease` schema stores, as text, to prove that a
    /// rejected call changed nothing.
    pub async fn snapshot(&self) -> String {
        sqlx::query_scalar(
            "SELECT concat_ws(E'\\n', \
               (SELECT string_agg(format('%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s', name, holder, \
                                         token, expires_at, acquired_at, renewed_at, released_at, \
                                         value, value_token, step_down_token, step_down_by, \
                                         step_down_at, renewals), E'\\n' ORDER BY name) \
                  FROM pglease.leases), \
               (SELECT format('history %s %s', count(*), max(id)) FROM pglease._history), \
               (SELECT string_agg(format('%s|%s|%s', resource, token, advanced_at), E'\\n' ORDER BY resource) \
                  FROM pglease.fences), \
               (SELECT format('seq %s %s', last_value, is_called) FROM pglease.fence_seq))",
        )
        .fetch_one(&self.pool)
        .await
        .expect("snapshot the pglease schema")
    }
}

/// Runs `statements` on a connection of its own to the server, ignoring
/// failures: clean-up that must finish before a test ends but runs in
/// `Drop`, which cannot await, so on a thread with its own runtime.
pub fn cleanup(statements: Vec<String>) {
    let server = server();
    let _ = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            if let Ok(mut admin) = server.connect().await {
                for statement in statements {
                    let _ = sqlx::query(AssertSqlSafe(statement))
                        .execute(&mut admin)
                        .await;
                }
                let _ = admin.close().await;
            }
        });
    })
    .join();
}

/// Polls `check` every 10 ms until it yields true, failing after `limit`:
/// the deadline-bounded poll that every wait in the tests goes through.
pub async fn poll_until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A data table that the tests write to under a lease.
pub async fn create_data_table(db: &TestDb) {
    sqlx::query("CREATE TABLE data (id int PRIMARY KEY, value text NOT NULL, token bigint)")
        .execute(db.pool())
        .await
        .expect("create the data table");
    sqlx::query("INSERT INTO data VALUES (1, 'initial', NULL)")
        .execute(db.pool())
        .await
        .expect("seed the data table");
}

/// The data table's single value.
pub async fn data_value(db: &TestDb) -> String {
    sqlx::query_scalar("SELECT value FROM data WHERE id = 1")
        .fetch_one(db.pool())
        .await
        .expect("read the data table")
}

/// A write under lease `name` with `token` in a fenced transaction.
pub async fn fenced_write(
    manager: &LeaseManager,
    name: &str,
    token: impl Into<i64>,
    value: &str,
) -> Result<(), pglease::Error> {
    let token: i64 = token.into();
    manager
        .fenced(&fence(name, token), async |conn| {
            // Unnamed, so that it also works through a transaction pooler
            // without prepared-statement support (tests/pooler.rs).
            sqlx::query("UPDATE data SET value = $1, token = $2 WHERE id = 1")
                .persistent(false)
                .bind(value)
                .bind(token)
                .execute(&mut *conn)
                .await
                .map_err(pglease::Error::from)?;
            Ok(())
        })
        .await
}

/// A scratch database and roles made for it; the roles are dropped after
/// the database.
pub struct RolesDb {
    pub db: Option<TestDb>,
    pub roles: Vec<String>,
}

impl RolesDb {
    /// `db` and the names of roles about to be made for it; a role of the
    /// same name left by an earlier run is dropped first.
    pub async fn new(db: TestDb, roles: &[&str]) -> RolesDb {
        let leftovers: Vec<String> = roles
            .iter()
            .map(|role| format!("DROP ROLE IF EXISTS {role}"))
            .collect();
        db.execute_all(&leftovers).await;
        RolesDb {
            db: Some(db),
            roles: roles.iter().map(|role| (*role).to_owned()).collect(),
        }
    }

    pub fn db(&self) -> &TestDb {
        self.db.as_ref().expect("the database")
    }
}

impl Drop for RolesDb {
    fn drop(&mut self) {
        drop(self.db.take());
        let roles = std::mem::take(&mut self.roles);
        cleanup(
            roles
                .into_iter()
                .map(|role| format!("DROP ROLE IF EXISTS {role}"))
                .collect(),
        );
    }
}

/// The fence of lease `name` under `token`, for operations on a lease this
/// test did not acquire through the library (or with a made-up token).
pub fn fence(name: &str, token: impl Into<i64>) -> pglease::Fence {
    pglease::Fence::new(name, self::token(token.into())).expect("a valid fence")
}

/// A token from a number.
pub fn token(token: i64) -> pglease::Token {
    pglease::Token::new(token).expect("a valid token")
}
