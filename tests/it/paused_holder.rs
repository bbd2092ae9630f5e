//! The paused-holder scenario, step by step, in real (scaled) time
//! against PostgreSQL. One time unit of the scenario is `UNIT`; every step waits for
//! the database clock, and no assertion depends on an exact instant.
//!
//! Written against the library alone, not through the scenario engine
//! (`pglease-scenarios`), on purpose: the engine's and the demo's verdicts
//! on the lease rest on what this test checks, so it must not share their
//! code, where one mistake could make both agree.

use std::time::Duration;

use crate::common::{TestDb, create_data_table, data_value, fenced_write};
use chrono::{DateTime, TimeDelta, Utc};
use pglease::AcquireOptions;
use pglease::Error;

const UNIT: Duration = Duration::from_millis(400);

fn at(t0: DateTime<Utc>, units: u32) -> DateTime<Utc> {
    t0 + TimeDelta::from_std(UNIT * units).expect("small duration")
}

fn assert_not_held(result: Result<(), Error>) {
    match result {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("expected the database to reject the write, got {other:?}"),
    }
}

async fn paused_holder_scenario_holds_against_postgres() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let name = "paused-holder";

    // A acquires at 0 for 5 units.
    let a = m
        .acquire(name, AcquireOptions::ttl(UNIT * 5).holder("A"))
        .await
        .expect("A acquires");
    let t0 = a.acquired_at();
    db.wait_until(at(t0, 2)).await;
    fenced_write(&m, name, a.token(), "a-1")
        .await
        .expect("A writes at 2");

    // Renew at 4 to expiry 9.
    db.wait_until(at(t0, 4)).await;
    let expiry = m
        .renew(&crate::common::fence(name, a.token()), UNIT * 5)
        .await
        .expect("A renews at 4");
    assert!(
        expiry > at(t0, 9),
        "renewal at 4 moves expiry past 9: {expiry}"
    );
    assert!(
        expiry < at(t0, 11),
        "renewal at 4 for 5 units ends near 9: {expiry}"
    );

    db.wait_until(at(t0, 8)).await;
    fenced_write(&m, name, a.token(), "a-2")
        .await
        .expect("A writes at 8");

    // Expired at 9 (equality is expired): writes and renewal are rejected.
    db.wait_until(expiry).await;
    assert_not_held(fenced_write(&m, name, a.token(), "forbidden").await);
    assert_eq!(data_value(&db).await, "a-2");
    assert!(matches!(
        m.renew(&crate::common::fence(name, a.token()), UNIT * 5)
            .await,
        Err(Error::Lost { .. })
    ));

    // B acquires at 10 with a larger token and writes.
    db.wait_until(at(t0, 10)).await;
    let b = m
        .acquire(name, AcquireOptions::ttl(UNIT * 5).holder("B"))
        .await
        .expect("B acquires at 10");
    assert!(b.token() > a.token());
    fenced_write(&m, name, b.token(), "b-1")
        .await
        .expect("B writes");

    // Stale tokens cannot change data, whoever carries them.
    assert_not_held(fenced_write(&m, name, a.token(), "forbidden").await);
    assert_eq!(data_value(&db).await, "b-1");

    // C cannot acquire a held lease; A's delayed release changes nothing.
    assert!(matches!(
        m.acquire(name, AcquireOptions::ttl(UNIT * 5).holder("C")).await,
        Err(Error::Held { ref holder, .. }) if holder == "B"
    ));
    assert!(
        !m.release(&crate::common::fence(name, a.token()))
            .await
            .expect("release call")
    );
    assert!(
        m.release(&crate::common::fence(name, b.token()))
            .await
            .expect("B releases")
    );

    // B reacquires under a new token; its old token can neither release
    // nor renew the new lease.
    let new_b = m
        .acquire(name, AcquireOptions::ttl(UNIT * 5).holder("B"))
        .await
        .expect("B reacquires");
    assert!(new_b.token() > b.token());
    assert!(
        !m.release(&crate::common::fence(name, b.token()))
            .await
            .expect("release call")
    );
    assert!(matches!(
        m.renew(&crate::common::fence(name, b.token()), UNIT * 5)
            .await,
        Err(Error::Lost { .. })
    ));
    fenced_write(&m, name, new_b.token(), "new-b")
        .await
        .expect("new B writes");
    assert!(
        m.release(&crate::common::fence(name, new_b.token()))
            .await
            .expect("new B releases")
    );

    let c = m
        .acquire(name, AcquireOptions::ttl(UNIT * 5).holder("C"))
        .await
        .expect("C acquires");
    assert!(c.token() > new_b.token());
    fenced_write(&m, name, c.token(), "c-1")
        .await
        .expect("C writes");
    assert_eq!(data_value(&db).await, "c-1");

    // Invalid TTLs are rejected.
    assert!(matches!(
        m.acquire(name, AcquireOptions::ttl(Duration::ZERO).holder("D"))
            .await,
        Err(Error::InvalidInput {
            argument: "ttl",
            ..
        })
    ));
    assert!(matches!(
        m.renew(&crate::common::fence(name, c.token()), Duration::ZERO)
            .await,
        Err(Error::InvalidInput {
            argument: "ttl",
            ..
        })
    ));
}

pglease_formations::tests![paused_holder_scenario_holds_against_postgres,];
