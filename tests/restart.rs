//! A held lease survives a PostgreSQL restart: renewal resumes afterwards
//! and tokens issued afterwards are larger.
//!
//! Restarting the server disturbs every other test using it, so this test
//! runs only when `PGLEASE_TEST_RESTART_CMD` names a command that restarts
//! the server (`.ci/run` sets it), and it is the only test in this binary
//! (cargo runs test binaries one after another).

mod common;

use std::time::Duration;

use common::{TestDb, create_data_table, data_value, poll_until};
use pglease::Acquire;
use pglease::ManagerOptions;

const BOUND: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_held_lease_survives_a_server_restart() {
    let Ok(command) = std::env::var("PGLEASE_TEST_RESTART_CMD") else {
        eprintln!("skipped: set PGLEASE_TEST_RESTART_CMD to a command that restarts the server");
        return;
    };
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager_with("restart", ManagerOptions::default()).await;
    let held = m
        .hold("data", Acquire::ttl(Duration::from_secs(20)).holder("A"))
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
    assert_eq!(data_value(&db).await, "after restart");
    let other = m
        .acquire("other", Acquire::ttl(Duration::from_secs(10)).holder("B"))
        .await
        .expect("acquire after restart");
    assert!(other.token() > held.token());
    assert!(held.release().await.expect("release"));
}
