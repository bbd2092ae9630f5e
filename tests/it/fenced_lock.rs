//! While its lease is valid, a fenced transaction holds off every other
//! acquisition; renewal and release by the holder are not blocked. Once the
//! lease has ended, the next acquisition ends the stale transaction, which
//! rolls back, and takes the lease.

use std::time::Duration;

use crate::common::{TestDb, create_data_table, data_value};
use pglease::{AcquireOptions, Error, FencedTransaction, Lease, LeaseManager};
use sqlx::Connection;

const LONG: Duration = Duration::from_secs(600);
/// A bound for liveness: far above the takeover grace (1 s), far below
/// "waits until the stale transaction ends by itself" (never, here).
const BOUND: Duration = Duration::from_secs(10);

/// B's one attempt at lease "data", bounded: it must end the stale
/// transaction that holds the row and take the lease, with a larger token.
async fn b_takes_over(m: &LeaseManager, old: &Lease) -> Lease {
    let b = tokio::time::timeout(
        BOUND,
        m.acquire("data", AcquireOptions::ttl(LONG).holder("B")),
    )
    .await
    .expect("B's acquisition must not wait for A's transaction")
    .expect("B acquires");
    assert!(b.token() > old.token());
    b
}

/// The sessions fenced on lease `name` right now.
async fn fenced_on(db: &TestDb, name: &str) -> Vec<i32> {
    sqlx::query_scalar("SELECT pid FROM pglease.fenced WHERE name = $1 ORDER BY pid")
        .bind(name)
        .fetch_all(db.pool())
        .await
        .expect("read pglease.fenced")
}

/// A acquires "data" for `ttl` and opens a fenced transaction under it.
async fn a_fenced(m: &LeaseManager, ttl: Duration) -> (Lease, FencedTransaction) {
    let lease = m
        .acquire("data", AcquireOptions::ttl(ttl).holder("A"))
        .await
        .expect("A acquires");
    let tx = m.begin_fenced(&lease).await.expect("A checks");
    (lease, tx)
}

async fn an_acquisition_after_expiry_ends_the_stale_fenced_transaction() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let (old, mut tx) = a_fenced(&m, Duration::from_secs(1)).await;
    sqlx::query("UPDATE data SET value = 'a-1' WHERE id = 1")
        .execute(&mut *tx)
        .await
        .expect("A writes while valid");
    let a_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .expect("A's pid");
    assert_eq!(fenced_on(&db, "data").await, vec![a_pid]);
    // A's lease expires while its checked transaction is still open, idle.
    db.wait_until(old.expires_at()).await;

    // One attempt, bounded: it ends A's session and takes the lease.
    let b = b_takes_over(&m, &old).await;
    assert!(fenced_on(&db, "data").await.is_empty());

    // A's transaction never commits, and its write is gone.
    assert!(
        tx.commit().await.is_err(),
        "A's stale transaction committed"
    );
    assert_eq!(data_value(&db).await, "initial");
    m.release(&crate::common::fence("data", b.token()))
        .await
        .expect("release");
}

async fn fenced_transaction_does_not_block_renew_release_or_held_check() {
    let db = TestDb::new().await;
    let m = db.manager();
    let lease = m
        .acquire("data", AcquireOptions::ttl(LONG).holder("A"))
        .await
        .expect("acquire");
    let tx = m
        .begin_fenced(&crate::common::fence("data", lease.token()))
        .await
        .expect("fenced");

    let other = LeaseManager::new(db.pool().clone());
    // A failed acquire of a held lease returns at once, even while the row
    // is locked by a fenced transaction.
    let attempt = tokio::time::timeout(
        BOUND,
        other.acquire("data", AcquireOptions::ttl(LONG).holder("B")),
    )
    .await
    .expect("acquire of a held lease must not wait");
    assert!(matches!(attempt, Err(Error::Held { .. })));
    tokio::time::timeout(
        BOUND,
        other.renew(&crate::common::fence("data", lease.token()), LONG),
    )
    .await
    .expect("renew must not wait for the fenced transaction")
    .expect("renew");
    let released = tokio::time::timeout(
        BOUND,
        other.release(&crate::common::fence("data", lease.token())),
    )
    .await
    .expect("release must not wait for the fenced transaction")
    .expect("release");
    assert!(released);
    tx.commit().await.expect("commit");
}

async fn a_released_lease_is_taken_at_once_from_its_open_fenced_transaction() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let lease = m
        .acquire("data", AcquireOptions::ttl(LONG).holder("A"))
        .await
        .expect("acquire");
    let mut conn = db.connect().await;
    let mut tx = conn.begin().await.expect("begin");
    pglease::assert_held(&mut tx, &crate::common::fence("data", lease.token()))
        .await
        .expect("check");
    sqlx::query("UPDATE data SET value = 'a-1' WHERE id = 1")
        .execute(&mut *tx)
        .await
        .expect("A writes while valid");
    assert!(
        m.release(&crate::common::fence("data", lease.token()))
            .await
            .expect("release")
    );

    // The released lease is free; the transaction that still holds A's
    // check is stale, and the acquisition ends it.
    b_takes_over(&m, &lease).await;
    assert!(
        tx.commit().await.is_err(),
        "A's stale transaction committed"
    );
    assert_eq!(data_value(&db).await, "initial");
}

async fn a_renewed_holder_keeps_its_fenced_transaction_past_one_ttl() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let a = db.manager();
    // Renewed every 0.5 s: a stall of about a second on a loaded machine
    // does not lose it.
    let ttl = Duration::from_millis(1500);
    let held = a
        .hold("data", AcquireOptions::ttl(ttl).holder("A"))
        .await
        .expect("hold");
    let first_expiry = held.expires_at();
    let mut tx = held.begin_fenced().await.expect("A checks");
    sqlx::query("UPDATE data SET value = 'a-1' WHERE id = 1")
        .execute(&mut *tx)
        .await
        .expect("A writes");

    // B keeps trying while A renews, until two TTLs past the first
    // expiry: every attempt is refused, and none ends A's transaction.
    let b = LeaseManager::new(db.pool().clone());
    let until = first_expiry + chrono::Duration::from_std(ttl * 2).expect("ttl");
    let mut attempts = 0;
    while db.now().await < until {
        match b
            .acquire("data", AcquireOptions::ttl(LONG).holder("B"))
            .await
        {
            Err(Error::Held { holder, .. }) => assert_eq!(holder, "A"),
            other => panic!("B's attempt while A renews: {other:?}"),
        }
        attempts += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(attempts > 20, "B tried {attempts} times");
    assert!(!held.is_lost(), "{:?}", held.loss_reason());

    // Written and committed well after the first TTL ran out.
    sqlx::query("UPDATE data SET value = 'a-2' WHERE id = 1")
        .execute(&mut *tx)
        .await
        .expect("A writes after the first TTL");
    tx.commit().await.expect("A's fenced transaction commits");
    assert_eq!(data_value(&db).await, "a-2");
    assert!(held.release().await.expect("release"));
}

/// A check that fails inside a savepoint leaves neither its row lock nor
/// its marker behind once the savepoint is rolled back: the transaction is
/// not fenced on the lease, and an acquisition does not end it.
async fn a_failed_check_rolled_back_to_a_savepoint_leaves_no_marker() {
    let db = TestDb::new().await;
    let m = db.manager();
    let stale = m
        .acquire("data", AcquireOptions::ttl(LONG).holder("A"))
        .await
        .expect("A acquires");
    assert!(
        m.release(&crate::common::fence("data", stale.token()))
            .await
            .expect("release")
    );
    let mut conn = db.connect().await;
    let mut tx = conn.begin().await.expect("begin");
    sqlx::query("SAVEPOINT check_it")
        .execute(&mut *tx)
        .await
        .expect("savepoint");
    assert!(matches!(
        pglease::assert_held(&mut tx, &crate::common::fence("data", stale.token())).await,
        Err(Error::NotHeld { .. })
    ));
    sqlx::query("ROLLBACK TO SAVEPOINT check_it")
        .execute(&mut *tx)
        .await
        .expect("roll back to the savepoint");
    assert!(fenced_on(&db, "data").await.is_empty());

    let b = b_takes_over(&m, &stale).await;
    // The transaction was not ended: it still works and commits.
    sqlx::query("SELECT 1")
        .execute(&mut *tx)
        .await
        .expect("the transaction is alive");
    tx.commit().await.expect("commit");
    m.release(&crate::common::fence("data", b.token()))
        .await
        .expect("release");
}

/// A fenced transaction that renewed (or released) its own lease inside,
/// and then stayed open, holds the row in a way acquisitions must not wait
/// for: once the lease has ended on its committed row, the next
/// acquisition ends it after the grace, and answers within a bound.
async fn a_fenced_transaction_that_renewed_inside_itself_is_ended_after_the_grace() {
    let db = TestDb::new().await;
    let m = db.manager();
    let (old, mut tx) = a_fenced(&m, Duration::from_secs(1)).await;
    sqlx::query("SELECT pglease.renew('data', $1, '1 second')")
        .bind(old.token())
        .execute(&mut *tx)
        .await
        .expect("A renews inside its fenced transaction");
    db.wait_until(old.expires_at()).await;
    b_takes_over(&m, &old).await;
    assert!(
        tx.commit().await.is_err(),
        "A's stale transaction committed"
    );
}

/// A lock on the lease row that is not a fenced transaction (no marker;
/// here a superuser's FOR KEY SHARE) cannot be ended: the acquisition says
/// the lease is pinned, within a bound, and takes it once the lock goes.
async fn a_lock_taken_without_assert_held_pins_the_lease_within_a_bound() {
    let db = TestDb::new().await;
    let m = db.manager();
    // 1 s: at 300 ms, a first acquisition answered late on a busy machine
    // was confirmed by a renewal after the lease had already expired.
    let old = m
        .acquire(
            "data",
            AcquireOptions::ttl(Duration::from_secs(1)).holder("A"),
        )
        .await
        .expect("A acquires");
    let mut conn = db.connect().await;
    let mut tx = conn.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM pglease.leases WHERE name = 'data' FOR KEY SHARE")
        .execute(&mut *tx)
        .await
        .expect("lock the row");
    db.wait_until(old.expires_at()).await;
    match tokio::time::timeout(
        BOUND,
        m.acquire("data", AcquireOptions::ttl(LONG).holder("B")),
    )
    .await
    {
        Ok(Err(Error::Pinned { holder, reason, .. })) => {
            assert_eq!(holder.as_deref(), Some("A"));
            assert!(reason.contains("cannot end"), "{reason}");
        }
        other => panic!("expected Pinned within {BOUND:?}, got {other:?}"),
    }
    tx.commit().await.expect("the lock goes");
    let b = m
        .acquire("data", AcquireOptions::ttl(LONG).holder("B"))
        .await
        .expect("B acquires");
    assert!(b.token() > old.token());
}

pglease_formations::tests![
    an_acquisition_after_expiry_ends_the_stale_fenced_transaction,
    fenced_transaction_does_not_block_renew_release_or_held_check,
    a_released_lease_is_taken_at_once_from_its_open_fenced_transaction,
    a_renewed_holder_keeps_its_fenced_transaction_past_one_ttl,
    a_failed_check_rolled_back_to_a_savepoint_leaves_no_marker,
    a_fenced_transaction_that_renewed_inside_itself_is_ended_after_the_grace,
    a_lock_taken_without_assert_held_pins_the_lease_within_a_bound,
];
