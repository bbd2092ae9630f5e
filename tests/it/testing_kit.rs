//! The test kit (`pglease::testing`, `pglease::provision`), used as a
//! service's tests would use it: a database per test; a lease expired,
//! taken over, its renewals failing or paused on demand, each seen by the
//! holder with the reason production gives and each leaving the old
//! token's writes rejected by the database (safety) and the lease to the
//! next holder at once (liveness); a throwaway cluster that is removed
//! afterwards; and discovery that falls through to it when no server
//! answers.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use pglease::provision::{Source, TempCluster};
use pglease::testing::{SetupError, TestDatabase, expire_now, take_over};
use pglease::{AcquireOptions, Error, HeldLease, LeaseManager, LossReason};
use sqlx::Connection;

const BOUND: Duration = Duration::from_secs(10);

async fn database() -> TestDatabase {
    let db = TestDatabase::new().await.expect("a test database");
    sqlx::raw_sql(
        "CREATE TABLE data (id int PRIMARY KEY, value text NOT NULL); \
         INSERT INTO data VALUES (1, 'initial'); \
         SELECT pglease.protect('data', 'job');",
    )
    .execute(db.pool())
    .await
    .expect("a protected table");
    db
}

/// Writes `value` under `lease`'s token, checked by the database.
async fn write(manager: &LeaseManager, lease: &HeldLease, value: &str) -> Result<(), Error> {
    manager
        .fenced(lease, async |conn| {
            sqlx::query("UPDATE data SET value = $1 WHERE id = 1")
                .bind(value)
                .execute(&mut *conn)
                .await?;
            Ok(())
        })
        .await
}

async fn value(db: &TestDatabase) -> String {
    sqlx::query_scalar("SELECT value FROM data WHERE id = 1")
        .fetch_one(db.pool())
        .await
        .expect("read data")
}

async fn hold(manager: &LeaseManager, ttl: Duration, holder: &str) -> HeldLease {
    manager
        .hold("job", AcquireOptions::ttl(ttl).holder(holder))
        .await
        .expect("hold")
}

/// The lease goes to another holder within `BOUND`: liveness.
async fn next_holder_gets_it(db: &TestDatabase) -> pglease::Lease {
    let other = db.manager();
    let started = Instant::now();
    loop {
        match other
            .acquire(
                "job",
                AcquireOptions::ttl(Duration::from_secs(30)).holder("next"),
            )
            .await
        {
            Ok(next) => return next,
            Err(Error::Held { .. }) => {}
            Err(e) => panic!("acquire: {e}"),
        }
        assert!(started.elapsed() < BOUND, "nobody got the lease");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn expire_now_ends_the_lease_in_the_database_and_the_holder_sees_it_stale() {
    let db = database().await;
    let manager = db.manager();
    let held = hold(&manager, Duration::from_secs(60), "worker").await;
    write(&manager, &held, "first")
        .await
        .expect("a valid write");

    assert!(expire_now(db.pool(), "job").await.expect("expire"));
    // Safety: the old token's writes are refused from this instant.
    assert!(matches!(
        write(&manager, &held, "stale").await,
        Err(Error::NotHeld { .. })
    ));
    // The holder learns it at its next renewal, brought forward.
    manager.faults().renew_now();
    let reason = tokio::time::timeout(BOUND, held.lost())
        .await
        .expect("the holder learns of it");
    assert!(
        matches!(reason, LossReason::Stale { current_token: Some(t), .. } if t == held.token()),
        "{reason:?}"
    );
    // Liveness: the next holder gets it at once, with a larger token.
    let next = next_holder_gets_it(&db).await;
    assert!(next.token() > held.token());
    assert_eq!(value(&db).await, "first");
    // Nothing held: nothing to end.
    manager.release(&next).await.expect("release");
    assert!(!expire_now(db.pool(), "job").await.expect("expire again"));
    assert!(matches!(
        expire_now(db.pool(), "").await,
        Err(Error::InvalidInput { .. })
    ));
}

async fn take_over_ends_the_old_holders_open_fenced_transaction() {
    let db = database().await;
    let manager = db.manager();
    let held = hold(&manager, Duration::from_secs(60), "worker").await;
    let mut open = held.begin_fenced().await.expect("begin fenced");
    sqlx::query("UPDATE data SET value = 'from the old holder' WHERE id = 1")
        .execute(&mut *open)
        .await
        .expect("write while valid");

    let other = db.manager();
    let started = Instant::now();
    let next = take_over(
        &other,
        "job",
        AcquireOptions::ttl(Duration::from_secs(30)).holder("next"),
    )
    .await
    .expect("take over");
    assert!(started.elapsed() < BOUND);
    assert!(next.token() > held.token());
    // Safety: the open transaction never commits.
    assert!(open.commit().await.is_err(), "the old holder's commit");
    assert_eq!(value(&db).await, "initial");
    manager.faults().renew_now();
    let reason = tokio::time::timeout(BOUND, held.lost())
        .await
        .expect("lost");
    assert!(
        matches!(&reason, LossReason::Stale { current_holder: Some(h), .. } if h == "next"),
        "{reason:?}"
    );
}

async fn failing_renewals_lose_the_lease_as_unreachable_and_recover() {
    let db = database().await;
    let manager = db.manager();
    let faults = manager.faults();
    let ttl = Duration::from_secs(2);
    let held = hold(&manager, ttl, "worker").await;
    faults.fail_renewals();
    let reason = tokio::time::timeout(ttl + BOUND, held.lost())
        .await
        .expect("lost by its deadline");
    match &reason {
        LossReason::Unreachable { error } => {
            assert!(error.to_string().contains("connection refused"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    assert!(manager.stats().renewal_failures > 0);
    // Safety: its writes are refused (the deadline comes before the
    // database's expiry, so the database may still accept it for a moment:
    // wait for the database's own expiry, as the next holder must).
    let next = next_holder_gets_it(&db).await;
    assert!(matches!(
        write(&manager, &held, "stale").await,
        Err(Error::NotHeld { .. })
    ));
    assert_eq!(value(&db).await, "initial");
    db.manager().release(&next).await.expect("release");
    // Restored: a new lease is renewed again.
    faults.restore_renewals();
    let again = hold(&manager, Duration::from_millis(600), "worker").await;
    let renewed = manager.stats().leases_renewed;
    faults.renew_now();
    let deadline = Instant::now() + BOUND;
    while manager.stats().leases_renewed == renewed {
        assert!(Instant::now() < deadline, "renewed again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!again.is_lost());
}

async fn a_paused_renewal_task_loses_the_lease_as_expired_and_resumes() {
    let db = database().await;
    let manager = db.manager();
    let faults = manager.faults();
    let ttl = Duration::from_secs(1);
    let held = hold(&manager, ttl, "worker").await;
    let token = held.loss_token();
    faults.pause_renewals();
    let reason = tokio::time::timeout(ttl + BOUND, held.lost())
        .await
        .expect("lost by its deadline");
    assert_eq!(reason, LossReason::Expired);
    assert!(token.is_cancelled(), "the loss token fires too");
    // Liveness: the next holder gets it once it has expired in the
    // database; safety: the old token writes nothing.
    let next = next_holder_gets_it(&db).await;
    assert!(next.token() > held.token());
    assert!(matches!(
        write(&manager, &held, "stale").await,
        Err(Error::NotHeld { .. })
    ));
    // Faults are per manager: another one renews as usual meanwhile.
    let other = db.manager();
    let kept = other
        .hold("other", AcquireOptions::ttl(Duration::from_millis(600)))
        .await
        .expect("hold other");
    other.faults().renew_now();
    let deadline = Instant::now() + BOUND;
    while other.stats().leases_renewed == 0 {
        assert!(Instant::now() < deadline, "the other manager renews");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!kept.is_lost());
    faults.resume_renewals();
    let resumed = hold_other(&manager).await;
    faults.renew_now();
    let deadline = Instant::now() + BOUND;
    while manager.stats().leases_renewed == 0 {
        assert!(Instant::now() < deadline, "renewing after the resume");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!resumed.is_lost());
}

async fn hold_other(manager: &LeaseManager) -> HeldLease {
    manager
        .hold("third", AcquireOptions::ttl(Duration::from_millis(600)))
        .await
        .expect("hold third")
}

async fn an_application_role_cannot_expire_leases() {
    let db = database().await;
    let role = format!("{}_app", db.name());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN; \
         GRANT USAGE ON SCHEMA pglease TO {role}; \
         GRANT SELECT ON pglease.status TO {role};"
    )))
    .execute(db.pool())
    .await
    .expect("a role");
    let manager = db.manager();
    let held = hold(&manager, Duration::from_secs(60), "worker").await;
    let app = sqlx::PgPool::connect_with(db.options().username(&role))
        .await
        .expect("connect as the role");
    let refused = expire_now(&app, "job").await;
    assert!(
        matches!(refused, Err(Error::NotPermitted { .. })),
        "{refused:?}"
    );
    assert_eq!(
        refused.as_ref().err().and_then(Error::sqlstate),
        Some("42501"),
        "{refused:?}"
    );
    assert!(!held.is_lost());
    assert!(manager.inspect("job").await.expect("inspect").held);
    app.close().await;
    drop(db);
    // The role outlives the database (its grants do not): drop it.
    let server = pglease::provision::server().await.expect("server");
    let mut admin = sqlx::PgConnection::connect_with(&server.options)
        .await
        .expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP ROLE IF EXISTS {role}")))
        .execute(&mut admin)
        .await
        .expect("drop the role");
}

async fn a_throwaway_cluster_runs_and_is_removed_on_drop() -> Result<(), SetupError> {
    let cluster = TempCluster::start().await?;
    let dir = cluster.path().to_owned();
    assert!(dir.join("data").exists());
    let manager = LeaseManager::connect_with(cluster.options(), BOUND)
        .await
        .expect("connect");
    manager.migrate().await.expect("migrate");
    manager
        .acquire("job", AcquireOptions::ttl(Duration::from_secs(5)))
        .await
        .expect("acquire");
    manager.pool().close().await;
    let port = cluster.port();
    drop(cluster);
    assert!(!dir.exists(), "{} is removed", dir.display());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the server is stopped"
    );
    Ok(())
}

/// Run by `discovery_falls_through_to_a_throwaway_cluster` in a child
/// process; on its own it checks only that some server was found.
async fn a_test_database_on_the_server_found() {
    let db = TestDatabase::new().await.expect("a test database");
    db.manager()
        .acquire("job", AcquireOptions::ttl(Duration::from_secs(5)))
        .await
        .expect("acquire");
    if std::env::var_os("PGLEASE_EXPECT_CLUSTER").is_some() {
        assert!(
            matches!(db.server().source, Source::TempCluster(_)),
            "{}",
            db.server()
        );
        println!("cluster: {}", db.server());
    }
    if std::env::var_os("PGLEASE_HANG").is_some() {
        // Killed here by `a_killed_process_leaves_no_cluster_behind`.
        println!("ready");
        tokio::time::sleep(Duration::from_secs(120)).await;
    }
}

/// A port of 127.0.0.1 where nothing listens.
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The cluster directories a process left, by its id.
fn clusters_of(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("pglease-cluster-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// This test binary again, running only the test above, with the libpq
/// defaults on a dead port and no DATABASE_URL.
fn inner_test_on_a_cluster() -> Command {
    let mut command = Command::new(std::env::current_exe().expect("this test binary"));
    command
        .args([
            "--exact",
            "testing_kit::a_test_database_on_the_server_found",
            "--nocapture",
        ])
        .env_remove("DATABASE_URL")
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", dead_port().to_string())
        .env("PGLEASE_EXPECT_CLUSTER", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    command
}

/// Waits until process `pid` has no cluster directory left.
fn until_no_cluster_of(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !clusters_of(pid).is_empty() {
        assert!(
            Instant::now() < deadline,
            "left behind: {:?}",
            clusters_of(pid)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn a_killed_process_leaves_no_cluster_behind() -> Result<(), SetupError> {
    use std::io::BufRead;
    TempCluster::binaries()?;
    let mut child = inner_test_on_a_cluster()
        .env("PGLEASE_HANG", "1")
        .spawn()
        .expect("run the inner test");
    let pid = child.id();
    let mut port = None;
    let stdout = child.stdout.take().expect("its stdout");
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.expect("a line");
        if let Some(at) = line.find("127.0.0.1:") {
            port = line[at + 10..]
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|p| p.parse::<u16>().ok());
        }
        if line == "ready" {
            break;
        }
    }
    let port = port.expect("the cluster's port");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    assert!(!clusters_of(pid).is_empty());
    // SIGKILL: no destructor, no panic hook runs.
    child.kill().expect("kill");
    child.wait().expect("reap");
    until_no_cluster_of(pid);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the server is stopped"
    );
    Ok(())
}

async fn discovery_falls_through_to_a_throwaway_cluster() -> Result<(), SetupError> {
    TempCluster::binaries()?;
    // The inner test must run on a throwaway cluster.
    let child = inner_test_on_a_cluster()
        .spawn()
        .expect("run the inner test");
    let pid = child.id();
    let out = child.wait_with_output().expect("inner test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert!(stdout.contains("cluster: a throwaway cluster"), "{stdout}");
    // Its watchdog removes the cluster once the process has exited.
    until_no_cluster_of(pid);
    Ok(())
}

pglease_formations::tests![
    expire_now_ends_the_lease_in_the_database_and_the_holder_sees_it_stale,
    take_over_ends_the_old_holders_open_fenced_transaction,
    failing_renewals_lose_the_lease_as_unreachable_and_recover,
    a_paused_renewal_task_loses_the_lease_as_expired_and_resumes,
    an_application_role_cannot_expire_leases,
    a_throwaway_cluster_runs_and_is_removed_on_drop,
    a_test_database_on_the_server_found,
    a_killed_process_leaves_no_cluster_behind,
    discovery_falls_through_to_a_throwaway_cluster,
];
