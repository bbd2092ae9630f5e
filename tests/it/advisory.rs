//! The advisory-lock variants: stable keys, exclusion, waiting with a
//! bound, and no lock carried back into the pool.

use std::time::Duration;

use crate::common::TestDb;
use pglease::LeaseManager;
use pglease::advisory::key as advisory_key;
use pglease::advisory::{SessionLock, XactLock};
use sqlx::postgres::PgPoolOptions;

/// Advisory locks held for `key` in this test's database.
async fn holders(db: &TestDb, key: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
           AND classid = (($1::bigint >> 32) & 4294967295)::oid \
           AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1 \
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .bind(key)
    .fetch_one(db.pool())
    .await
    .expect("read pg_locks")
}

async fn keys_are_fnv1a_of_the_name() {
    // Published FNV-1a 64 test vectors.
    assert_eq!(advisory_key(""), 0xcbf29ce484222325_u64 as i64);
    assert_eq!(advisory_key("a"), 0xaf63dc4c8601ec8c_u64 as i64);
    assert_eq!(advisory_key("foobar"), 0x85944171f73967e8_u64 as i64);
}

async fn session_locks_exclude_wait_and_leave_no_lock_in_the_pool() {
    let db = TestDb::new().await;
    // One connection: a lock left on it after release would show at once.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(db.options())
        .await
        .expect("pool");
    let m = LeaseManager::new(pool);
    let key = advisory_key("job");

    let mut a = SessionLock::try_lock(&m, "job")
        .await
        .expect("try")
        .expect("A locks");
    assert!(a.is_held().await.expect("ask"));
    assert!(
        SessionLock::try_lock(&m, "job")
            .await
            .expect("try")
            .is_none()
    );
    let waited = SessionLock::lock(&m, "job", Duration::from_millis(100))
        .await
        .expect("wait");
    assert!(waited.is_none(), "the lock was still held after the wait");

    // Re-entrant: two holds on one session need two unlocks; release
    // clears both before the connection goes back to the pool.
    let conn = a.connection().expect("the lock's connection");
    let relocked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(conn)
        .await
        .expect("relock");
    assert!(relocked);
    assert_eq!(holders(&db, key).await, 1);
    assert!(a.release().await.expect("release"));
    assert_eq!(holders(&db, key).await, 0);

    let b = SessionLock::lock(&m, "job", Duration::from_secs(5))
        .await
        .expect("wait")
        .expect("B locks once it is free");
    // Dropping a held lock closes its connection, which frees the lock.
    drop(b);
    crate::common::poll_until(
        "the dropped lock to be freed",
        Duration::from_secs(10),
        || async { holders(&db, key).await == 0 },
    )
    .await;
}

async fn transaction_locks_last_until_the_transaction_ends() {
    let db = TestDb::new().await;
    let m = db.manager();
    let a = XactLock::try_lock(&m, "job")
        .await
        .expect("try")
        .expect("A locks");
    assert!(XactLock::try_lock(&m, "job").await.expect("try").is_none());
    a.commit().await.expect("commit");
    let b = XactLock::try_lock(&m, "job")
        .await
        .expect("try")
        .expect("B locks");
    b.rollback().await.expect("rollback");
    assert_eq!(holders(&db, advisory_key("job")).await, 0);
}

pglease_formations::tests![
    keys_are_fnv1a_of_the_name,
    session_locks_exclude_wait_and_leave_no_lock_in_the_pool,
    transaction_locks_last_until_the_transaction_ends,
];
