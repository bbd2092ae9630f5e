//! Counted leases: up to N holders of one name at once, each holding a slot
//! (`NAME#k`) with its own token and expiry and every guarantee of a lease:
//! renewal, release, fenced writes by token, takeover of an expired slot
//! within the bound; a failed attempt writes nothing; bad limits are
//! refused before anything is sent.

use std::time::{Duration, Instant};

use crate::common::TestDb;
use pglease::{AcquireOptions, Error};

const TTL: Duration = Duration::from_secs(30);

fn counted(holder: &str) -> AcquireOptions {
    AcquireOptions::ttl(TTL).holder(holder).limit(3)
}

async fn up_to_the_limit_hold_at_once_each_with_its_own_token() {
    let db = TestDb::new().await;
    crate::common::create_data_table(&db).await;
    let m = db.manager();
    let mut leases = Vec::new();
    for holder in ["a", "b", "c"] {
        leases.push(m.acquire("jobs", counted(holder)).await.expect("a slot"));
    }
    let names: Vec<&str> = leases.iter().map(|l| l.name()).collect();
    assert_eq!(names, ["jobs#1", "jobs#2", "jobs#3"]);
    assert!(leases.windows(2).all(|w| w[0].token() < w[1].token()));
    // The fourth is refused, read-only: it is told the slot that expires
    // first.
    let before = db.state().await;
    match m.acquire("jobs", counted("d")).await {
        Err(Error::Held { holder, .. }) => assert_eq!(holder, "a"),
        other => panic!("a fourth holder: {other:?}"),
    }
    assert_eq!(
        db.state().await,
        before,
        "a failed attempt changed something"
    );
    // Each slot is a lease: renewed, fenced and released by its token.
    m.renew(&leases[1], TTL).await.expect("renew a slot");
    crate::common::fenced_write(&m, "jobs#3", leases[2].token(), "by c")
        .await
        .expect("a fenced write under c's slot");
    assert_eq!(crate::common::data_value(&db).await, "by c");
    assert!(m.release(&leases[1]).await.expect("release b"));
    assert!(matches!(
        crate::common::fenced_write(&m, "jobs#2", leases[1].token(), "by b, released").await,
        Err(Error::NotHeld { .. })
    ));
    // The freed slot goes to the next holder, under a new token.
    let d = m
        .acquire("jobs", counted("d"))
        .await
        .expect("the freed slot");
    assert_eq!(d.name(), "jobs#2");
    assert!(d.token() > leases[2].token());
    let status = m.inspect("jobs#2").await.expect("inspect the slot");
    assert_eq!(status.holder.as_deref(), Some("d"));
    // With a value, published on the slot.
    m.release(&d).await.expect("release d");
    let e = m
        .acquire("jobs", counted("e").value("10.0.0.5:80"))
        .await
        .expect("a slot with a value");
    assert_eq!(
        m.inspect(e.name()).await.unwrap().value.as_deref(),
        Some("10.0.0.5:80")
    );
}

async fn an_expired_slot_is_taken_over_and_held_slots_are_renewed() {
    let db = TestDb::new().await;
    let m = db.manager();
    let how = |holder: &str, ttl: Duration| AcquireOptions::ttl(ttl).holder(holder).limit(2);
    // One slot renewed in the background, one left to expire.
    let held = m
        .hold("pool", how("kept", Duration::from_millis(600)))
        .await
        .expect("hold a slot");
    let dying = m
        .acquire("pool", how("dying", Duration::from_millis(500)))
        .await
        .expect("the other slot");
    let started = Instant::now();
    let taken = m
        .acquire("pool", how("next", TTL).wait(Duration::from_secs(10)))
        .await
        .expect("the expired slot, taken over");
    let took = started.elapsed();
    eprintln!("counted takeover after {took:?} (TTL 500 ms)");
    assert_eq!(taken.name(), dying.name());
    assert!(taken.acquired_at() >= dying.expires_at());
    // Safety: the expired slot's old token fences nothing.
    crate::common::create_data_table(&db).await;
    assert!(matches!(
        crate::common::fenced_write(&m, dying.name(), dying.token(), "stale").await,
        Err(Error::NotHeld { .. })
    ));
    assert_eq!(crate::common::data_value(&db).await, "initial");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // The renewed slot was never free.
    assert!(!held.is_lost());
    assert_eq!(
        m.inspect(held.name()).await.unwrap().holder.as_deref(),
        Some("kept")
    );
    assert!(m.inspect(held.name()).await.unwrap().renewals >= 1);
    held.release().await.expect("release");
}

async fn bad_limits_are_refused_before_anything_is_sent() {
    let db = TestDb::new().await;
    let m = db.manager();
    let before = db.state().await;
    for (limit, name, argument) in [
        (0, "jobs".to_owned(), "limit"),
        (1001, "jobs".to_owned(), "limit"),
        (10, "n".repeat(253), "name"),
    ] {
        match m
            .acquire(&name, AcquireOptions::ttl(TTL).limit(limit))
            .await
        {
            Err(Error::InvalidInput { argument: got, .. }) => {
                assert_eq!(got, argument, "limit {limit}")
            }
            other => panic!("limit {limit}: {other:?}"),
        }
    }
    let elector = m.elector("leader", AcquireOptions::ttl(TTL).limit(2));
    assert!(matches!(
        elector,
        Err(Error::InvalidInput {
            argument: "limit",
            ..
        })
    ));
    for sql in [
        "SELECT * FROM pglease.acquire_counted('jobs', 0, 'h', '1 min')",
        "SELECT * FROM pglease.acquire_counted('jobs', NULL, 'h', '1 min')",
        "SELECT * FROM pglease.acquire_counted(repeat('n', 254), 10, 'h', '1 min')",
        "SELECT * FROM pglease.acquire_counted('jobs', 2, '', '1 min')",
    ] {
        let err = sqlx::query(sql).execute(db.pool()).await.expect_err(sql);
        assert_eq!(
            err.as_database_error().and_then(|d| d.code()).as_deref(),
            Some("22023"),
            "{sql}"
        );
    }
    assert_eq!(db.state().await, before, "a refused call changed something");
    // 252 bytes and "#9": 254 in all, allowed.
    let fits = m
        .acquire(&"n".repeat(252), AcquireOptions::ttl(TTL).limit(9))
        .await
        .expect("a name that fits with its suffix");
    assert_eq!(fits.name(), format!("{}#1", "n".repeat(252)));
}

/// Two transactions that each acquire two counted names, in opposite
/// orders and with new limits, neither committing yet: neither waits
/// for the other on the status view's record of the limit (it waited
/// without bound, and the two deadlocked); every attempt is answered
/// (granted, or refused as new names whose creation another open
/// transaction holds up), none with an error, within a bound.
async fn counted_acquisitions_in_open_transactions_do_not_wait_for_each_other() {
    let db = TestDb::new().await;
    // The server's timeline checked once, in a transaction of its own.
    db.manager()
        .acquire("warm", AcquireOptions::ttl(TTL))
        .await
        .expect("warm");
    let (mut a, mut b) = (db.connect().await, db.connect().await);
    for conn in [&mut a, &mut b] {
        sqlx::query("BEGIN")
            .execute(&mut *conn)
            .await
            .expect("begin");
    }
    let acquire = "SELECT token FROM pglease.acquire_counted($1, $2, $3, '30 s')";
    let started = Instant::now();
    let first: Option<i64> = sqlx::query_scalar(acquire)
        .bind("ca")
        .bind(2)
        .bind("A")
        .fetch_one(&mut a)
        .await
        .expect("A: ca");
    let second: Option<i64> = sqlx::query_scalar(acquire)
        .bind("cb")
        .bind(2)
        .bind("B")
        .fetch_one(&mut b)
        .await
        .expect("B: cb");
    // Each now acquires the other's name, with another limit.
    let (third, fourth) = tokio::join!(
        sqlx::query_scalar::<_, Option<i64>>(acquire)
            .bind("cb")
            .bind(3)
            .bind("A")
            .fetch_one(&mut a),
        sqlx::query_scalar::<_, Option<i64>>(acquire)
            .bind("ca")
            .bind(3)
            .bind("B")
            .fetch_one(&mut b),
    );
    let took = started.elapsed();
    println!("two open transactions, counted names in opposite orders: {took:?}");
    let (third, fourth) = (third.expect("A: cb"), fourth.expect("B: ca"));
    println!("answers: {first:?} {second:?} {third:?} {fourth:?}");
    assert!(
        first.is_some() && second.is_some(),
        "each one's first name, nobody else about"
    );
    assert!(
        took < Duration::from_secs(15),
        "answered within a bound: {took:?}"
    );
    for conn in [&mut a, &mut b] {
        sqlx::query("COMMIT")
            .execute(&mut *conn)
            .await
            .expect("commit");
    }
}

pglease_formations::tests![
    counted_acquisitions_in_open_transactions_do_not_wait_for_each_other(2),
    up_to_the_limit_hold_at_once_each_with_its_own_token(2),
    an_expired_slot_is_taken_over_and_held_slots_are_renewed(2),
    bad_limits_are_refused_before_anything_is_sent,
];
