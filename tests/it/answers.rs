//! Every answer decodes: each way the SQL refuses an acquisition, driven
//! on purpose and read through the library as a typed outcome, never as a
//! decoding error. The answers' times are checked to be finite (a
//! timestamp of ±infinity is one the library cannot read).

use std::time::Duration;

use sqlx::{Connection, PgConnection, Row};

use pglease::{AcquireOptions, Error};

use crate::common::TestDb;

const TTL: Duration = Duration::from_secs(30);

fn opts(holder: &str) -> AcquireOptions {
    AcquireOptions::ttl(TTL).holder(holder)
}

/// A transaction on `conn` that holds the row of `name` locked FOR UPDATE
/// (as a client that calls pglease's functions inside a long transaction
/// of its own would), until it is rolled back.
async fn lock_row(conn: &mut PgConnection, name: &str) {
    sqlx::query("BEGIN")
        .execute(&mut *conn)
        .await
        .expect("begin");
    let locked: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM pglease.leases WHERE name = $1 FOR UPDATE")
            .bind(name)
            .fetch_optional(&mut *conn)
            .await
            .expect("lock the row");
    assert_eq!(locked, Some(1), "the row of {name:?} exists");
}

/// Asserts that no timestamp column of the answer to each of `sqls` is
/// ±infinity (read as text, which always decodes).
async fn assert_finite_times(conn: &mut PgConnection, sqls: &[&str]) {
    for sql in sqls {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT expires_at::text AS e, checked_at::text AS c, delayed_until::text AS d FROM {sql}"
        )))
        .fetch_one(&mut *conn)
        .await
        .expect("the answer");
        let infinite: Vec<String> = ["e", "c", "d"]
            .into_iter()
            .filter_map(|c| row.get::<Option<String>, _>(c))
            .filter(|t| t.contains("infinity"))
            .collect();
        assert_eq!(infinite, Vec::<String>::new(), "{sql}: finite times");
    }
}

/// The row of a name never acquired, locked for over
/// 1 s by another transaction. `acquire` and `acquire_shared` answer a
/// finite time (not -infinity), and the library reads both as `Pinned`
/// (ended: nobody holds it, a transaction holds its row) saying why; once
/// the transaction ends, both kinds acquire.
async fn a_locked_row_of_a_name_never_acquired_is_pinned() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let created: Option<String> = sqlx::query_scalar("SELECT pglease._create('hot')")
        .fetch_one(&mut admin)
        .await
        .expect("create the row");
    assert_eq!(created, None, "the row is created");
    let mut locker = db.connect().await;
    lock_row(&mut locker, "hot").await;

    assert_finite_times(
        &mut admin,
        &[
            "pglease.acquire('hot', 'raw', '10 s')",
            "pglease.acquire_shared('hot', 'raw', '10 s')",
        ],
    )
    .await;
    let m = db.manager();
    for how in [opts("a"), opts("b").shared(true)] {
        match m.acquire("hot", how.clone()).await {
            Err(Error::Pinned {
                holder: None,
                reason,
                ..
            }) => assert!(
                reason.contains("not committed") || reason.contains("could not"),
                "{how:?}: {reason}"
            ),
            other => panic!("{how:?} on a locked row: {other:?}"),
        }
    }
    locker.close().await.expect("end the locking transaction");
    let shared = m
        .acquire("hot", opts("b").shared(true))
        .await
        .expect("acquired shared once the row is free");
    m.release(&shared).await.expect("released");
    let lease = m
        .acquire("hot", opts("a"))
        .await
        .expect("acquired once the row is free");
    assert!(lease.token() > shared.token(), "a new token");
}

/// Each other refusal, driven on purpose, decodes to its outcome: held by
/// an exclusive holder (`Held`), a waiting exclusive acquirer (`Held` by
/// it, for shared acquirers), every slot of a counted lease taken
/// (`Held`), acquirers ahead in line (`InLine`), a full line
/// (`LineFull`). Every answer's times are finite.
async fn every_refusal_decodes_to_its_outcome() {
    let db = TestDb::new().await;
    let m = db.manager();
    let mut conn = db.connect().await;

    // Held exclusive.
    let _held = m.acquire("x", opts("owner")).await.expect("owner acquires");
    match m.acquire("x", opts("other")).await {
        Err(Error::Held { holder, .. }) => assert_eq!(holder, "owner"),
        other => panic!("held exclusive: {other:?}"),
    }

    // A waiting exclusive acquirer keeps a new shared one out.
    let _reader = m
        .acquire("s", opts("r1").shared(true))
        .await
        .expect("r1 shared");
    let waits = "pglease.acquire('s', 'writer', '30 s', waits => true)";
    let marked: Option<i64> =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT token FROM {waits}")))
            .fetch_one(&mut conn)
            .await
            .expect("the writer's attempt");
    assert_eq!(marked, None, "refused while r1 holds it shared");
    match m.acquire("s", opts("r2").shared(true)).await {
        Err(Error::Held { holder, .. }) => assert_eq!(holder, "writer"),
        other => panic!("behind a waiting writer: {other:?}"),
    }

    // Every slot taken.
    let slots = opts("c").limit(2);
    let _one = m.acquire("jobs", slots.clone()).await.expect("slot 1");
    let _two = m.acquire("jobs", slots.clone()).await.expect("slot 2");
    match m.acquire("jobs", slots).await {
        Err(Error::Held { .. }) => {}
        other => panic!("every slot taken: {other:?}"),
    }

    // Acquirers ahead in line, and a full line.
    let place: Option<i64> =
        sqlx::query_scalar("SELECT ticket FROM pglease.enqueue(ARRAY['q'], 'first', '30 s')")
            .fetch_one(&mut conn)
            .await
            .expect("join the line");
    assert!(place.is_some(), "a place in line");
    match m.acquire("q", opts("late")).await {
        Err(Error::InLine { ahead, .. }) => assert_eq!(ahead, 1),
        other => panic!("one ahead in line: {other:?}"),
    }
    match m
        .acquire(
            "q",
            opts("late")
                .fair(true)
                .wait(Duration::from_secs(1))
                .max_waiting(1),
        )
        .await
    {
        Err(Error::LineFull { waiting, .. }) => assert_eq!(waiting, 1),
        other => panic!("a full line: {other:?}"),
    }

    assert_finite_times(
        &mut conn,
        &[
            "pglease.acquire('x', 'other', '10 s')",
            "pglease.acquire_shared('s', 'r3', '10 s')",
            "pglease.acquire('q', 'late', '10 s')",
            "pglease.acquire('never', 'n', '10 s')",
        ],
    )
    .await;
}

/// The two refusals of the timeline check, driven on a single server:
/// another transaction's check not committed within 1 s (the check's
/// lock held by a transaction, this server's row missing as after a
/// crash restart) and an administrator's grant delay after a declared
/// restore. Each answers finite times in SQL, and the library reads the
/// first as `Pinned` saying so, the second as `GrantDelayed` with its end;
/// both kinds of acquisition, and a counted one, alike.
async fn the_timeline_checks_refusals_decode() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let m = db.manager();
    m.acquire("warm", opts("w"))
        .await
        .expect("the server's timeline checked");
    // This server's row gone, as after a crash restart, and the check's
    // lock held by a transaction that does not commit.
    sqlx::query("TRUNCATE pglease._checked")
        .execute(&mut admin)
        .await
        .expect("truncate");
    let mut checker = db.connect().await;
    let mut tx = checker.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM pglease._timeline_config FOR UPDATE")
        .execute(&mut *tx)
        .await
        .expect("hold the check's lock");
    assert_finite_times(
        &mut admin,
        &[
            "pglease.acquire('t', 'raw', '10 s')",
            "pglease.acquire_shared('t', 'raw', '10 s')",
        ],
    )
    .await;
    for how in [opts("a"), opts("b").shared(true), opts("c").limit(2)] {
        match m.acquire("t", how.clone()).await {
            Err(Error::Pinned { reason, .. }) => assert!(
                reason.contains("checking the server's timeline"),
                "{how:?}: {reason}"
            ),
            other => panic!("{how:?} with the check not committed: {other:?}"),
        }
    }
    tx.rollback().await.expect("end the check's transaction");

    sqlx::query("SELECT pglease.set_grant_delay('30 s')")
        .execute(&mut admin)
        .await
        .expect("set the grant delay");
    sqlx::query("SELECT pglease.restored('a restore, for the test')")
        .execute(&mut admin)
        .await
        .expect("declare a restore");
    assert_finite_times(
        &mut admin,
        &[
            "pglease.acquire('t', 'raw', '10 s')",
            "pglease.acquire_shared('t', 'raw', '10 s')",
        ],
    )
    .await;
    for how in [opts("a"), opts("b").shared(true), opts("c").limit(2)] {
        match m.acquire("t", how.clone()).await {
            Err(Error::GrantDelayed { reason, until, .. }) => {
                assert!(reason.contains("grant delay"), "{how:?}: {reason}");
                assert!(until > chrono::Utc::now(), "{how:?}: ends later: {until}");
            }
            other => panic!("{how:?} during the grant delay: {other:?}"),
        }
    }
}

pglease_formations::tests![
    a_locked_row_of_a_name_never_acquired_is_pinned,
    every_refusal_decodes_to_its_outcome,
    the_timeline_checks_refusals_decode,
];
