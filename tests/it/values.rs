//! A value per lease: published at acquisition or later under the token,
//! read by anyone in the status view, refused from a stale holder, gone
//! with the next acquisition; bounded, checked before anything is sent,
//! and the same through SQL.

use std::time::Duration;

use crate::common::TestDb;
use pglease::limits::MAX_VALUE_BYTES;
use pglease::{AcquireOptions, Error, LossReason};

const TTL: Duration = Duration::from_secs(60);

async fn a_value_is_published_changed_and_cleared_by_its_holder() {
    let db = TestDb::new().await;
    let m = db.manager();
    let odd = "10.0.0.7:8080 it's \\ $$ \"quoted\" ünïcode\nline";
    let lease = m
        .acquire("leader", AcquireOptions::ttl(TTL).holder("A").value(odd))
        .await
        .expect("acquire with a value");
    assert_eq!(
        m.inspect("leader").await.expect("inspect").value.as_deref(),
        Some(odd)
    );

    m.set_value(&lease, Some("10.0.0.7:9090"))
        .await
        .expect("set_value");
    assert_eq!(
        m.inspect("leader").await.expect("inspect").value.as_deref(),
        Some("10.0.0.7:9090")
    );
    m.set_value(&lease, None).await.expect("clear");
    assert_eq!(m.inspect("leader").await.expect("inspect").value, None);

    // Empty and exactly the limit are values too.
    m.set_value(&lease, Some("")).await.expect("empty");
    assert_eq!(
        m.inspect("leader").await.expect("inspect").value.as_deref(),
        Some("")
    );
    let largest = "x".repeat(MAX_VALUE_BYTES);
    m.set_value(&lease, Some(&largest))
        .await
        .expect("the largest value");
    assert_eq!(
        m.list(&pglease::ListFilter::default()).await.expect("list")[0]
            .value
            .as_deref(),
        Some(largest.as_str())
    );
}

async fn a_value_belongs_to_its_acquisition_and_a_stale_holder_cannot_change_it() {
    let db = TestDb::new().await;
    let m = db.manager();
    let a = m
        .acquire(
            "leader",
            AcquireOptions::ttl(TTL).holder("A").value("a-address"),
        )
        .await
        .expect("A acquires");
    // A failed acquisition with a value changes nothing.
    assert!(matches!(
        m.acquire(
            "leader",
            AcquireOptions::ttl(TTL).holder("B").value("b-address")
        )
        .await,
        Err(Error::Held { .. })
    ));
    assert_eq!(
        m.inspect("leader").await.expect("inspect").value.as_deref(),
        Some("a-address")
    );
    // It stays readable after the release, until the next acquisition.
    m.release(&a).await.expect("release");
    assert!(matches!(
        m.set_value(&a, Some("late")).await,
        Err(Error::Lost {
            reason: LossReason::Released,
            ..
        })
    ));
    let status = m.inspect("leader").await.expect("inspect");
    assert_eq!(
        (status.holder, status.value.as_deref()),
        (None, Some("a-address"))
    );

    // The next acquisition starts without one, and A cannot publish over it.
    let b = m
        .acquire("leader", AcquireOptions::ttl(TTL).holder("B"))
        .await
        .expect("B acquires");
    assert_eq!(m.inspect("leader").await.expect("inspect").value, None);
    match m.set_value(&a, Some("stale")).await {
        Err(Error::Lost {
            reason: LossReason::Stale { current_token, .. },
            ..
        }) => assert_eq!(current_token, Some(b.token())),
        other => panic!("expected a stale token, got {other:?}"),
    }
    assert_eq!(m.inspect("leader").await.expect("inspect").value, None);
    m.set_value(&b, Some("b-address"))
        .await
        .expect("B publishes");
    assert_eq!(
        m.inspect("leader").await.expect("inspect").value.as_deref(),
        Some("b-address")
    );
}

async fn bad_values_are_refused_before_anything_is_sent() {
    let db = TestDb::new().await;
    let m = db.manager();
    let lease = m
        .acquire("leader", AcquireOptions::ttl(TTL).holder("A"))
        .await
        .expect("acquire");
    let before = db.state().await;
    let too_long = "x".repeat(MAX_VALUE_BYTES + 1);
    for bad in [too_long.as_str(), "nul\0byte"] {
        assert!(matches!(
            m.set_value(&lease, Some(bad)).await,
            Err(Error::InvalidInput {
                argument: "value",
                ..
            })
        ));
        assert!(matches!(
            m.acquire("other", AcquireOptions::ttl(TTL).value(bad))
                .await,
            Err(Error::InvalidInput {
                argument: "value",
                ..
            })
        ));
    }
    assert_eq!(db.state().await, before);
}

async fn the_sql_interface_publishes_and_bounds_values_too() {
    let db = TestDb::new().await;
    let token: i64 = sqlx::query_scalar("SELECT token FROM pglease.acquire('job', 'sql', '1 min')")
        .fetch_one(db.pool())
        .await
        .expect("acquire");
    let published: bool = sqlx::query_scalar("SELECT pglease.set_value('job', $1, 'from sql')")
        .bind(token)
        .fetch_one(db.pool())
        .await
        .expect("set_value");
    assert!(published);
    let read = db.manager().inspect("job").await.expect("inspect");
    assert_eq!(read.value.as_deref(), Some("from sql"));
    let stale: bool = sqlx::query_scalar("SELECT pglease.set_value('job', $1, 'x')")
        .bind(token + 1)
        .fetch_one(db.pool())
        .await
        .expect("set_value under another token");
    assert!(!stale);
    let error = sqlx::query("SELECT pglease.set_value('job', $1, repeat('x', 8193))")
        .bind(token)
        .execute(db.pool())
        .await
        .expect_err("a value over 8 KiB");
    let code = error
        .as_database_error()
        .and_then(|e| e.code().map(|c| c.into_owned()));
    assert_eq!(code.as_deref(), Some("22023"), "{error}");
}

pglease_formations::tests![
    a_value_is_published_changed_and_cleared_by_its_holder,
    a_value_belongs_to_its_acquisition_and_a_stale_holder_cannot_change_it,
    bad_values_are_refused_before_anything_is_sent,
    the_sql_interface_publishes_and_bounds_values_too,
];
