//! Opening a fenced transaction sends `BEGIN` and the check in one simple
//! query, with the lease name as a literal: names that need escaping, a
//! failed check, a savepoint inside, and a caller who gives up while the
//! check waits must all leave the pool's connections clean.

use std::time::Duration;

use crate::common::{TestDb, create_data_table, data_value, poll_until};
use pglease::{AcquireOptions, Error, LeaseManager, NotHeldReason};
use sqlx::Connection;

const LONG: Duration = Duration::from_secs(600);

/// Names a literal could be broken by: quotes, backslashes, dollar
/// quotes, SQL in the name, non-ASCII.
const AWKWARD: [&str; 6] = [
    "it's",
    r"back\slash\",
    r"\'); DROP TABLE data; --",
    "$$ $x$ done",
    "ünïcødé ✓ 名前",
    r"'' \\ ''",
];

const APP: &str = "fenced_begin_under_test";

/// A manager on a pool of one connection, so that a connection left in a
/// bad state would be the next one used; with pglease's pool settings, so
/// that the server notices a client gone within a second.
async fn single_connection(db: &TestDb) -> LeaseManager {
    let pool = pglease::connect::pool_options()
        .max_connections(1)
        .connect_with(db.options().application_name(APP))
        .await
        .expect("connect");
    LeaseManager::new(pool)
}

/// Whether the manager's one connection answers, and is then idle outside
/// any transaction, as another session sees it.
async fn clean(db: &TestDb, m: &LeaseManager) -> bool {
    sqlx::query("SELECT 1")
        .execute(m.pool())
        .await
        .expect("the pooled connection answers");
    let states: Vec<String> = sqlx::query_scalar(
        "SELECT state FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()",
    )
    .bind(APP)
    .fetch_all(db.pool())
    .await
    .expect("read pg_stat_activity");
    states.iter().all(|state| state == "idle")
}

async fn awkward_names_are_checked_as_themselves() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = single_connection(&db).await;
    for conforming in ["on", "off"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {} SET standard_conforming_strings = {conforming}",
            db.name()
        )))
        .execute(db.pool())
        .await
        .expect("set standard_conforming_strings");
        // A fresh connection picks the setting up.
        let m = if conforming == "off" {
            single_connection(&db).await
        } else {
            m.clone()
        };
        for name in AWKWARD {
            let lease = m
                .acquire(name, AcquireOptions::ttl(LONG))
                .await
                .expect("acquire");
            let mut tx = m.begin_fenced(&lease).await.expect("begin under the lease");
            sqlx::query("UPDATE data SET value = $1 WHERE id = 1")
                .bind(name)
                .execute(&mut *tx)
                .await
                .expect("write");
            tx.commit().await.expect("commit");
            assert_eq!(data_value(&db).await, name);
            // The check saw this name and no other: a neighbour's token
            // is refused under it.
            m.release(&lease).await.expect("release");
            match m.begin_fenced(&lease).await {
                Err(Error::NotHeld {
                    name: refused,
                    reason: NotHeldReason::Released { .. },
                    ..
                }) => assert_eq!(refused, name),
                other => panic!("{name:?} ({conforming}): {other:?}"),
            }
            assert!(clean(&db, &m).await, "{name:?} ({conforming})");
        }
    }
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE tablename = 'data'")
        .fetch_one(db.pool())
        .await
        .expect("count");
    assert_eq!(tables, 1);
}

async fn a_failed_check_leaves_the_connection_usable() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = single_connection(&db).await;
    let lease = m
        .acquire("data", AcquireOptions::ttl(LONG))
        .await
        .expect("acquire");
    let stale = crate::common::fence("data", lease.token().get() + 1);
    for _ in 0..3 {
        assert!(matches!(
            m.begin_fenced(&stale).await,
            Err(Error::NotHeld {
                reason: NotHeldReason::NotIssued { .. },
                ..
            })
        ));
        assert!(clean(&db, &m).await);
    }
    crate::common::fenced_write(&m, "data", lease.token(), "after")
        .await
        .expect("a valid fenced write on the same connection");
    assert_eq!(data_value(&db).await, "after");
}

async fn a_savepoint_inside_is_a_savepoint_and_a_drop_rolls_back() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = single_connection(&db).await;
    let lease = m
        .acquire("data", AcquireOptions::ttl(LONG))
        .await
        .expect("acquire");
    let mut tx = m.begin_fenced(&lease).await.expect("begin");
    {
        let mut inner = (*tx).begin().await.expect("savepoint");
        sqlx::query("UPDATE data SET value = 'inner' WHERE id = 1")
            .execute(&mut *inner)
            .await
            .expect("write in the savepoint");
        inner.rollback().await.expect("roll the savepoint back");
    }
    sqlx::query("UPDATE data SET value = 'outer' WHERE id = 1")
        .execute(&mut *tx)
        .await
        .expect("write");
    tx.commit().await.expect("commit");
    assert_eq!(data_value(&db).await, "outer");

    let mut tx = m.begin_fenced(&lease).await.expect("begin");
    sqlx::query("UPDATE data SET value = 'dropped' WHERE id = 1")
        .execute(&mut *tx)
        .await
        .expect("write");
    drop(tx);
    assert!(clean(&db, &m).await);
    assert_eq!(data_value(&db).await, "outer");
}

async fn giving_up_while_the_check_waits_closes_the_connection() {
    let db = TestDb::new().await;
    let m = single_connection(&db).await;
    let lease = m
        .acquire("data", AcquireOptions::ttl(LONG))
        .await
        .expect("acquire");
    // Another session locks the lease row, so the check waits for it.
    let mut blocker = db.connect().await;
    let mut locked = blocker.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM pglease.leases WHERE name = 'data' FOR UPDATE")
        .execute(&mut *locked)
        .await
        .expect("lock the row");
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE datname = current_database() AND wait_event_type = 'Lock' \
                   AND query LIKE 'BEGIN; SELECT pglease.assert_held%'";
    let begin = m.begin_fenced(&lease);
    tokio::select! {
        outcome = begin => panic!("the check should wait for the row lock: {outcome:?}"),
        () = poll_until("the check to wait for the row lock", Duration::from_secs(10), || async {
            let n: i64 = sqlx::query_scalar(waiting).fetch_one(db.pool()).await.expect("count");
            n == 1
        }) => {}
    }
    // The begin was dropped mid-way: its connection is closed instead of
    // coming back to the pool inside a transaction, and the server ends the
    // session within `client_connection_check_interval` (1 s), although it
    // still waits for the lock.
    poll_until(
        "the abandoned session to end",
        Duration::from_secs(10),
        || async {
            let n: i64 = sqlx::query_scalar(waiting)
                .fetch_one(db.pool())
                .await
                .expect("count");
            n == 0
        },
    )
    .await;
    locked.rollback().await.expect("unlock");
    assert!(clean(&db, &m).await);
    let mut tx = m.begin_fenced(&lease).await.expect("begin again");
    tx.recheck().await.expect("still held");
    tx.commit().await.expect("commit");
}

/// A takeover in the middle of a fenced transaction ends the old holder's
/// session; its commit then reports the lease lost, with the new token
/// (not the broken connection it sees): its write never lands (safety),
/// and the new holder has the lease (liveness).
async fn a_commit_after_a_takeover_reports_the_lease_lost() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let ttl = Duration::from_secs(30);
    let a = db
        .manager_with("a", pglease::ManagerOptions::default())
        .await;
    let lease = a
        .acquire("data", AcquireOptions::ttl(ttl).holder("A"))
        .await
        .expect("A acquires");
    let mut tx = a
        .begin_fenced(&lease)
        .await
        .expect("A's fenced transaction");
    sqlx::query("UPDATE data SET value = 'A', token = $1 WHERE id = 1")
        .bind(lease.token())
        .execute(&mut *tx)
        .await
        .expect("A writes");
    let b = db.manager();
    let taken = tokio::time::timeout(
        Duration::from_secs(10),
        pglease::testing::take_over(&b, "data", AcquireOptions::ttl(ttl).holder("B")),
    )
    .await
    .expect("B takes over within 10 s")
    .expect("B takes over");
    match tx.commit().await {
        Err(Error::Lost {
            token,
            reason:
                pglease::LossReason::Stale {
                    current_token: Some(current),
                    ..
                },
            ..
        }) => {
            assert_eq!(token, lease.token());
            assert_eq!(current, taken.token());
        }
        other => panic!("expected the lease lost to B's token, got {other:?}"),
    }
    assert_eq!(data_value(&db).await, "initial", "A's write must not land");
    let status = b.inspect("data").await.expect("inspect");
    assert!(status.held && status.holder.as_deref() == Some("B"));
}

pglease_formations::tests![
    a_commit_after_a_takeover_reports_the_lease_lost,
    awkward_names_are_checked_as_themselves,
    a_failed_check_leaves_the_connection_usable,
    a_savepoint_inside_is_a_savepoint_and_a_drop_rolls_back,
    giving_up_while_the_check_waits_closes_the_connection,
];
