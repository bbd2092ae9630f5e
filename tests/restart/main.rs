//! A held lease survives a PostgreSQL restart: renewal resumes afterwards,
//! its token still fences writes, and tokens issued afterwards are larger.
//!
//! Restarting the server disturbs every test using it, so this is a test
//! binary of its own (cargo runs test binaries one after another), and it
//! runs only where `PGLEASE_TEST_RESTART_CMD` names a command that
//! restarts the server (`.ci/run` sets it); elsewhere it is reported as
//! ignored, with why.

use std::time::Duration;

use pglease::testing::{SetupError, TestDatabase, poll_until};
use pglease::{AcquireOptions, LeaseManager};
use pglease_formations::harness::{Test, run};

const BOUND: Duration = Duration::from_secs(60);

/// The environment variable naming the restart command.
const RESTART_CMD: &str = "PGLEASE_TEST_RESTART_CMD";

async fn a_held_lease_survives_a_server_restart() -> Result<(), SetupError> {
    let Ok(command) = std::env::var(RESTART_CMD) else {
        return Err(SetupError::Unavailable(format!(
            "restarts the server: set {RESTART_CMD} to a command that does (only where the \
             server serves nothing else)"
        )));
    };
    let db = TestDatabase::new().await?;
    db.execute(&[
        "CREATE TABLE data (id int PRIMARY KEY, value text NOT NULL)",
        "INSERT INTO data VALUES (1, 'initial')",
    ])
    .await;
    let m = LeaseManager::new(db.pool().clone());
    let held = m
        .hold(
            "data",
            AcquireOptions::ttl(Duration::from_secs(20)).holder("A"),
        )
        .await
        .expect("hold");

    let status = tokio::task::spawn_blocking(move || {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(&command)
            .status()
    })
    .await
    .expect("join")
    .expect("run the restart command");
    assert!(status.success(), "the restart command failed: {status}");

    // Renewal resumes: a renewal confirmed after the server is back.
    poll_until("the server to answer", BOUND, || async {
        sqlx::query("SELECT 1").execute(db.pool()).await.is_ok()
    })
    .await;
    let renewed = m.stats().leases_renewed;
    poll_until("a renewal after the restart", BOUND, || async {
        m.stats().leases_renewed > renewed
    })
    .await;
    assert_eq!(held.loss_reason(), None);
    let lease = m.inspect("data").await.expect("inspect");
    assert!(lease.held);
    assert_eq!(lease.token, Some(held.token()));

    // The token still fences writes, and new tokens are larger.
    let mut tx = held.begin_fenced().await.expect("fenced after restart");
    sqlx::query("UPDATE data SET value = 'after restart' WHERE id = 1")
        .execute(&mut *tx)
        .await
        .expect("write");
    tx.commit().await.expect("commit");
    let value: String = sqlx::query_scalar("SELECT value FROM data WHERE id = 1")
        .fetch_one(db.pool())
        .await
        .expect("read the data");
    assert_eq!(value, "after restart");
    let other = m
        .acquire(
            "other",
            AcquireOptions::ttl(Duration::from_secs(10)).holder("B"),
        )
        .await
        .expect("acquire after restart");
    assert!(other.token() > held.token());
    assert!(held.release().await.expect("release"));
    Ok(())
}

fn main() -> std::process::ExitCode {
    run([Test::new(
        "a_held_lease_survives_a_server_restart",
        a_held_lease_survives_a_server_restart,
    )])
}
