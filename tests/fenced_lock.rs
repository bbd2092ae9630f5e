//! While a fenced transaction holds its check, no other acquisition of the
//! lease can commit; renewal and release by the holder are not blocked.

mod common;

use std::time::Duration;

use common::{TestDb, create_data_table, data_value, poll_until};
use pglease::{Error, LeaseManager};
use sqlx::Connection;

const LONG: Duration = Duration::from_secs(600);

/// Waits until backend `pid` is blocked on a lock.
async fn wait_until_blocked(db: &TestDb, pid: i32) {
    poll_until(
        "the acquirer to block on a lock",
        Duration::from_secs(20),
        || async {
            sqlx::query_scalar(
                "SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) \
               FROM pg_stat_activity WHERE pid = $1",
            )
            .bind(pid)
            .fetch_one(db.pool())
            .await
            .expect("read pg_stat_activity")
        },
    )
    .await
}

/// Starts B's acquisition of lease "data" on a connection of its own and
/// returns once PostgreSQL shows it waiting on a lock.
async fn spawn_blocked_acquire(db: &TestDb) -> tokio::task::JoinHandle<Option<i64>> {
    let mut b_conn = db.connect().await;
    let b_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut b_conn)
        .await
        .expect("pid");
    let b = tokio::spawn(async move {
        let row: (Option<i64>,) =
            sqlx::query_as("SELECT token FROM pglease.acquire('data', 'B', '10 min')")
                .fetch_one(&mut b_conn)
                .await
                .expect("B's acquire");
        row.0
    });
    wait_until_blocked(db, b_pid).await;
    b
}

#[tokio::test]
async fn open_fenced_transaction_holds_off_takeover_until_commit() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let old = m
        .try_acquire("data", "A", Duration::from_millis(300))
        .await
        .expect("A acquires");
    let mut tx = m.begin_fenced("data", old.token()).await.expect("A checks");
    sqlx::query("UPDATE data SET value = 'a-1' WHERE id = 1")
        .execute(&mut *tx)
        .await
        .expect("A writes while valid");
    // A's lease expires while its checked transaction is still open.
    db.wait_until_db_time(old.expires_at()).await;

    let b = spawn_blocked_acquire(&db).await;
    assert!(!b.is_finished(), "B acquired while A's check was held");
    let status = m.inspect("data").await.expect("inspect");
    assert_eq!(
        status.token,
        Some(old.token()),
        "no new token is visible yet"
    );

    tx.commit().await.expect("A's checked write commits");
    let b_token = tokio::time::timeout(Duration::from_secs(20), b)
        .await
        .expect("B acquires once A commits")
        .expect("B's task")
        .expect("B acquired");
    assert!(b_token > old.token());
    assert_eq!(
        data_value(&db).await,
        "a-1",
        "A's write committed before B's takeover"
    );
}

#[tokio::test]
async fn fenced_transaction_does_not_block_renew_release_or_held_check() {
    let db = TestDb::new().await;
    let m = db.manager();
    let lease = m.try_acquire("data", "A", LONG).await.expect("acquire");
    let tx = m.begin_fenced("data", lease.token()).await.expect("fenced");

    let other = LeaseManager::new(db.pool().clone());
    let bounded = Duration::from_secs(10);
    // A failed acquire of a held lease returns at once, even while the row
    // is locked by a fenced transaction.
    let attempt = tokio::time::timeout(bounded, other.try_acquire("data", "B", LONG))
        .await
        .expect("acquire of a held lease must not wait");
    assert!(matches!(attempt, Err(Error::Held { .. })));
    tokio::time::timeout(bounded, other.renew("data", lease.token(), LONG))
        .await
        .expect("renew must not wait for the fenced transaction")
        .expect("renew");
    let released = tokio::time::timeout(bounded, other.release("data", lease.token()))
        .await
        .expect("release must not wait for the fenced transaction")
        .expect("release");
    assert!(released);
    tx.commit().await.expect("commit");
}

#[tokio::test]
async fn released_lease_is_not_reacquired_until_open_fenced_transaction_ends() {
    let db = TestDb::new().await;
    let m = db.manager();
    let lease = m.try_acquire("data", "A", LONG).await.expect("acquire");
    let mut conn = db.connect().await;
    let mut tx = conn.begin().await.expect("begin");
    pglease::assert_held(&mut tx, "data", lease.token())
        .await
        .expect("check");
    assert!(m.release("data", lease.token()).await.expect("release"));

    // The released lease is free, but B's acquisition waits for the
    // transaction that still holds A's check.
    let b = spawn_blocked_acquire(&db).await;
    assert!(!b.is_finished());

    // A write checked after the release is rejected; the error aborts A's
    // transaction, which ends its lock (and discards its writes), so B
    // proceeds.
    assert!(matches!(
        pglease::assert_held(&mut tx, "data", lease.token()).await,
        Err(Error::NotHeld { .. })
    ));
    let b_token = tokio::time::timeout(Duration::from_secs(20), b)
        .await
        .expect("B acquires once A's transaction is aborted")
        .expect("B's task")
        .expect("B acquired");
    assert!(b_token > lease.token());
    tx.rollback()
        .await
        .expect("roll back A's failed transaction");
}
