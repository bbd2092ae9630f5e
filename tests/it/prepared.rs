//! Acquire, renew and release as prepared statements (see
//! `ManagerOptions::prepared_statements`): the same answers as text,
//! prepared only where the manager decided to, and a manager that finds
//! no pooler in the way preparing by itself.

use std::time::{Duration, Instant};

use crate::common::TestDb;
use pglease::{AcquireOptions, Error, LeaseManager, ManagerOptions};
use sqlx::postgres::PgPoolOptions;

/// A manager with `options` on a pool of one connection, whose prepared
/// statements [`prepared_acquires`] can then read.
async fn one_connection(db: &TestDb, options: ManagerOptions) -> LeaseManager {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(db.options())
        .await
        .expect("connect");
    LeaseManager::with_options(pool, options).expect("options")
}

/// How many of the pool's prepared statements call `pglease.acquire`,
/// `renew` and `release` with parameters.
async fn prepared_calls(m: &LeaseManager) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_prepared_statements \
          WHERE statement LIKE '%pglease.acquire($1, $2, $3, false, $4, $5)%' \
             OR statement LIKE '%pglease.renew($1, $2, $3)%' \
             OR statement LIKE '%pglease.release($1, $2)%'",
    )
    .persistent(false)
    .fetch_one(m.pool())
    .await
    .expect("read pg_prepared_statements")
}

/// Every answer of the three calls: taken, refused with the holder and its
/// expiry, renewed, released, and a stale token's renewal lost.
async fn every_answer(m: &LeaseManager, name: &str) {
    let ttl = Duration::from_secs(30);
    let lease = m
        .acquire(name, AcquireOptions::ttl(ttl).holder("first"))
        .await
        .expect("acquire a free lease");
    match m
        .acquire(name, AcquireOptions::ttl(ttl).holder("second"))
        .await
    {
        Err(Error::Held {
            holder, expires_at, ..
        }) => {
            assert_eq!(holder, "first");
            assert_eq!(expires_at, lease.expires_at());
        }
        other => panic!("a held lease was not refused as held: {other:?}"),
    }
    let renewed = m.renew(&lease, ttl).await.expect("renew");
    assert!(renewed >= lease.expires_at());
    assert!(m.release(&lease).await.expect("release"));
    assert!(!m.release(&lease).await.expect("release again"));
    match m.renew(&lease, ttl).await {
        Err(Error::Lost { .. }) => {}
        other => panic!("a released token was renewed: {other:?}"),
    }
    let next = m
        .acquire(name, AcquireOptions::ttl(ttl).holder("second"))
        .await
        .expect("acquire after the release");
    assert!(next.token() > lease.token(), "tokens increase");
    assert!(m.release(&next).await.expect("release"));
}

async fn prepared_and_text_statements_give_the_same_answers() {
    let db = TestDb::new().await;
    let prepared = one_connection(&db, ManagerOptions::default().prepared_statements(true)).await;
    every_answer(&prepared, "prepared ' name").await;
    assert_eq!(
        prepared_calls(&prepared).await,
        3,
        "acquire, renew and release are prepared"
    );
    let text = one_connection(&db, ManagerOptions::default().prepared_statements(false)).await;
    every_answer(&text, "text ' name").await;
    assert_eq!(
        prepared_calls(&text).await,
        0,
        "prepared_statements(false) prepares nothing"
    );
}

/// With no pooler in the way, a manager left to decide prepares, after
/// its check has run in the background; until then its calls go as text.
async fn a_manager_that_finds_no_pooler_prepares() {
    let db = TestDb::new().await;
    let m = one_connection(&db, ManagerOptions::default()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut round = 0;
    while prepared_calls(&m).await == 0 {
        assert!(
            Instant::now() < deadline,
            "no call was prepared after {round} rounds in 10 s"
        );
        every_answer(&m, &format!("auto {round}")).await;
        round += 1;
    }
    every_answer(&m, "auto, prepared").await;
    assert_eq!(prepared_calls(&m).await, 3);
}

pglease_formations::tests![
    prepared_and_text_statements_give_the_same_answers,
    a_manager_that_finds_no_pooler_prepares,
];
