//! Test provisioning: a real PostgreSQL, and a fresh database per test so
//! that tests run in parallel without seeing each other's leases. Both come
//! from the crate's own test kit (`pglease::testing`, `pglease::provision`),
//! which finds the server in this order: `DATABASE_URL`; else the libpq
//! defaults (`PGHOST`, `PGPORT`, `PGUSER`, ... then localhost:5432) if a
//! server answers there; else a throwaway cluster from the installed server
//! binaries; else (with `--features containers`) a container started with
//! `testcontainers`; else the test panics and says how to get a database.

use std::time::Duration;

use pglease::testing::TestDatabase;
pub use pglease::testing::poll_until;
use pglease::{LeaseManager, ManagerOptions};
use sqlx::PgConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// A freshly created database (see [`TestDatabase`], whose helpers it
/// dereferences to), dropped with its connections when this value is
/// dropped, also when the test panics.
pub struct TestDb(TestDatabase);

impl std::ops::Deref for TestDb {
    type Target = TestDatabase;

    fn deref(&self) -> &TestDatabase {
        &self.0
    }
}

impl TestDb {
    /// A new database with the `pglease` schema applied.
    pub async fn new() -> TestDb {
        TestDb(TestDatabase::new().await.unwrap_or_else(|e| panic!("{e}")))
    }

    /// A new database without the `pglease` schema.
    pub async fn empty() -> TestDb {
        TestDb(
            TestDatabase::empty()
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        )
    }

    /// A manager with `options` on a pool of its own whose connections
    /// carry `application_name` = `app`, so that a test can find them in
    /// `pg_stat_activity`. Build it on the runtime that will use it.
    pub async fn manager_with(&self, app: &str, options: ManagerOptions) -> LeaseManager {
        manager_on(self.options().application_name(app), options).await
    }

    /// A connection of its own, outside the pool.
    pub async fn connect(&self) -> PgConnection {
        self.0
            .connect()
            .await
            .expect("connect to the test database")
    }

    /// Login roles for a test of authority, one per name in `names`,
    /// named `{name}_{database}` (unique to this test), each with the
    /// application grants the documentation gives (USAGE on the schema,
    /// SELECT on the status and history views) unless it is listed in
    /// `bare` (CONNECT only); dropped after the database.
    pub async fn login_roles(&self, names: &[&str], bare: &[&str]) -> Vec<String> {
        let roles: Vec<String> = names
            .iter()
            .map(|name| format!("{name}_{}", self.name()))
            .collect();
        let refs: Vec<&str> = roles.iter().map(String::as_str).collect();
        self.scratch_roles(&refs).await;
        for (name, role) in names.iter().zip(&roles) {
            let mut sql = vec![format!("CREATE ROLE {role} LOGIN")];
            if !bare.contains(name) {
                sql.push(format!("GRANT USAGE ON SCHEMA pglease TO {role}"));
                sql.push(format!(
                    "GRANT SELECT ON pglease.status, pglease.history, pglease.shared TO {role}"
                ));
            }
            self.execute(&sql).await;
        }
        roles
    }

    /// A connection that logs in as `role` (trust authentication).
    pub async fn connect_as(&self, role: &str) -> PgConnection {
        use sqlx::ConnectOptions;
        self.options()
            .username(role)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect as {role}: {e}"))
    }

    /// A manager whose pool logs in as `role`.
    pub async fn manager_as(&self, role: &str, options: ManagerOptions) -> LeaseManager {
        manager_on(self.options().username(role), options).await
    }
}

/// A manager with `options` on a pool of four connections made with
/// `connect`.
async fn manager_on(connect: PgConnectOptions, options: ManagerOptions) -> LeaseManager {
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(connect)
        .await
        .unwrap_or_else(|e| panic!("connect a manager's pool: {e}"));
    LeaseManager::with_options(pool, options).expect("valid manager options")
}

/// This test binary started again with only the otherwise ignored test
/// `test` (`module::name`), its stdout piped: a process of its own, for a
/// test to stop or kill. Configure it through the environment.
pub fn child_test(test: &str) -> std::process::Command {
    let mut command = std::process::Command::new(std::env::current_exe().expect("test binary"));
    command
        .args([test, "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .stdout(std::process::Stdio::piped());
    command
}

/// The lines `child` prints on its (piped) stdout, read on a thread of
/// their own until the child closes it or the receiver is dropped.
pub fn stdout_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("stdout is piped");
    let (send, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if send.send(line).is_err() {
                return;
            }
        }
    });
    lines
}

/// The SQLSTATE `sql` (one or more statements, simple protocol) fails
/// with on `conn`, or `None` if it succeeds.
pub async fn sqlstate_of(conn: &mut PgConnection, sql: &str) -> Option<String> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(conn)
        .await
        .err()
        .and_then(|e| {
            e.as_database_error()
                .and_then(|d| d.code())
                .map(|c| c.into_owned())
        })
}

/// A data table that the tests write to under a lease.
pub async fn create_data_table(db: &TestDb) {
    create_data_table_on(db.pool()).await;
}

/// The data table, on any server (a replicated pair's primary, say): one
/// row, `(1, 'initial', NULL)`.
pub async fn create_data_table_on(pool: &sqlx::PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE data (id int PRIMARY KEY, value text NOT NULL, token bigint); \
         INSERT INTO data VALUES (1, 'initial', NULL)",
    )
    .execute(pool)
    .await
    .expect("create and seed the data table");
}

/// The pglease schema and the data table on the server of `pool` (a
/// replicated pair's primary, and so its standby).
pub async fn migrate_with_data_table(pool: &sqlx::PgPool) {
    LeaseManager::new(pool.clone())
        .migrate()
        .await
        .expect("migrate");
    create_data_table_on(pool).await;
}

/// Sets the data table's value in a fenced transaction of `held`.
pub async fn held_write(held: &pglease::HeldLease, value: &str) -> Result<(), pglease::Error> {
    let mut tx = held.begin_fenced().await?;
    sqlx::query("UPDATE data SET value = $1 WHERE id = 1")
        .bind(value)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
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

/// The fence of lease `name` under `token`, for operations on a lease this
/// test did not acquire through the library (or with a made-up token).
pub fn fence(name: &str, token: impl Into<i64>) -> pglease::Fence {
    pglease::Fence::new(name, self::token(token.into())).expect("a valid fence")
}

/// A token from a number.
pub fn token(token: i64) -> pglease::Token {
    pglease::Token::new(token).expect("a valid token")
}

/// Waits (up to `within`) until `manager` has confirmed a renewal since its
/// count was `before` (`stats().leases_renewed`), failing the test if
/// `held` is reported lost meanwhile or none comes: a lease riding out a
/// failover.
pub async fn renewed_without_loss(
    manager: &LeaseManager,
    held: &pglease::HeldLease,
    before: u64,
    within: std::time::Duration,
) {
    let deadline = std::time::Instant::now() + within;
    while manager.stats().leases_renewed == before {
        assert!(
            held.loss_reason().is_none(),
            "lost during the failover: {:?}",
            held.loss_reason()
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no renewal on the new primary within {within:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The token of lease `name` and the data table's value, as the server of
/// `pool` has them (the new primary, after a failover).
pub async fn token_and_value(pool: &sqlx::PgPool, name: &str) -> (i64, String) {
    sqlx::query_as("SELECT l.token, d.value FROM pglease.leases AS l, data AS d WHERE l.name = $1")
        .bind(name)
        .fetch_one(pool)
        .await
        .expect("read the lease and the data table")
}

/// While `held` is held, `other` is refused its lease (`Held`); once it
/// is released, `other` acquires it at once under a larger token.
pub async fn handed_over_on_release(other: &LeaseManager, held: pglease::HeldLease) {
    let name = held.name().to_owned();
    let b = || {
        other.acquire(
            &name,
            pglease::AcquireOptions::ttl(std::time::Duration::from_secs(60)).holder("B"),
        )
    };
    assert!(matches!(b().await, Err(pglease::Error::Held { .. })));
    let token = held.token();
    held.release().await.expect("release");
    let taken = b().await.expect("B acquires after the release");
    assert!(taken.token() > token);
}

/// The value and token of the data table's row on the server of `pool`.
pub async fn data_row(pool: &sqlx::PgPool) -> (String, Option<i64>) {
    sqlx::query_as("SELECT value, token FROM data WHERE id = 1")
        .fetch_one(pool)
        .await
        .expect("read the data table")
}

/// What a holder whose acquisition the server forgot gets for everything
/// it tries under `stale` on `leases` (the new server): each refusal names
/// timeline `timeline`, and nothing of it commits.
pub async fn everything_refused(leases: &LeaseManager, stale: &pglease::Fence, timeline: i64) {
    let forgotten = pglease::LossReason::Forgotten { timeline };
    // The write it had prepared, sent now.
    match fenced_write(leases, stale.name(), stale.token(), "A, stale").await {
        Err(pglease::Error::NotHeld {
            reason: pglease::NotHeldReason::Forgotten { timeline: t },
            ..
        }) => assert_eq!(t, timeline),
        other => panic!("the stale holder's write: {other:?}"),
    }
    match leases
        .renew(stale, std::time::Duration::from_secs(60))
        .await
    {
        Err(pglease::Error::Lost { reason, .. }) => assert_eq!(reason, forgotten),
        other => panic!("the stale holder's renewal: {other:?}"),
    }
    match leases.set_value(stale, Some("A's address")).await {
        Err(pglease::Error::Lost { reason, .. }) => assert_eq!(reason, forgotten),
        other => panic!("the stale holder's value: {other:?}"),
    }
    match leases.release(stale).await {
        Err(pglease::Error::Lost { reason, .. }) => assert_eq!(reason, forgotten),
        other => panic!("the stale holder's release: {other:?}"),
    }
    assert!(
        !leases
            .admit("store", stale.token())
            .await
            .expect("admit under the stale token"),
        "a high-water mark accepted a token the server forgot"
    );
    // The message says what happened, for people.
    let said = leases
        .renew(stale, std::time::Duration::from_secs(60))
        .await
        .expect_err("renewal")
        .to_string();
    assert!(
        said.contains("failed over or was restored") && said.contains(&timeline.to_string()),
        "{said}"
    );
}

/// `held`, on a manager that follows the primary, is told by its next
/// renewal there (made at once) that the server forgot its acquisition,
/// within 30 s.
pub async fn told_forgotten(manager: &LeaseManager, held: &pglease::HeldLease, timeline: i64) {
    manager.faults().renew_now();
    let reason = tokio::time::timeout(std::time::Duration::from_secs(30), held.lost())
        .await
        .expect("told within 30 s");
    assert_eq!(reason, pglease::LossReason::Forgotten { timeline });
}

/// The (verdict, detail) of every check named `name` in `diagnosis`.
pub fn checks_named(
    diagnosis: &pglease::doctor::Diagnosis,
    name: &str,
) -> Vec<(pglease::doctor::Verdict, String)> {
    diagnosis
        .checks
        .iter()
        .filter(|c| c.name == name)
        .map(|c| (c.verdict, c.detail.clone()))
        .collect()
}

/// A manager on a formation's multi-host `url` whose primary listens on
/// `primary_port`: connected there, the schema migrated and the data
/// table made.
pub async fn migrated_on_formation(url: &str, primary_port: u16) -> LeaseManager {
    let leases = LeaseManager::connect(url)
        .await
        .expect("connect with the multi-host URL");
    leases.migrate().await.expect("migrate");
    create_data_table_on(leases.pool()).await;
    assert_eq!(
        leases.admin().current_host(),
        Some(format!("127.0.0.1:{primary_port}"))
    );
    leases
}
