//! Listing leases filtered in the database: held, expired, a name prefix
//! taken literally (no pattern characters), a limit, in name order.

use std::time::Duration;

use crate::common::TestDb;
use pglease::{AcquireOptions, Error, ListFilter};

async fn filters_run_in_the_database_and_take_prefixes_literally() {
    let db = TestDb::new().await;
    let m = db.manager();
    let long = AcquireOptions::ttl(Duration::from_secs(60));
    for name in ["a%1", "a_2", "ab", "b'3", "b\\4"] {
        m.acquire(name, long.clone()).await.expect("acquire");
    }
    let released = m.acquire("c", long.clone()).await.expect("acquire c");
    m.release(&released).await.expect("release c");
    let short = m
        .acquire("d", AcquireOptions::ttl(Duration::from_millis(200)))
        .await
        .expect("acquire d");
    db.wait_until(short.expires_at()).await;

    let names = async |filter: ListFilter| -> Vec<String> {
        m.list_matching(&filter)
            .await
            .expect("list")
            .into_iter()
            .map(|s| s.name)
            .collect()
    };
    assert_eq!(names(ListFilter::default()).await.len(), 7);
    assert_eq!(
        names(ListFilter::default().held()).await,
        ["a%1", "a_2", "ab", "b'3", "b\\4"]
    );
    assert_eq!(names(ListFilter::default().expired()).await, ["d"]);
    // `%` and `_` are not patterns; quotes and backslashes are literal.
    assert_eq!(names(ListFilter::default().prefix("a%")).await, ["a%1"]);
    assert_eq!(names(ListFilter::default().prefix("a_")).await, ["a_2"]);
    assert_eq!(names(ListFilter::default().prefix("b'")).await, ["b'3"]);
    assert_eq!(names(ListFilter::default().prefix("b\\")).await, ["b\\4"]);
    assert_eq!(
        names(ListFilter::default().held().prefix("a").limit(2)).await,
        ["a%1", "a_2"]
    );
    assert!(names(ListFilter::default().limit(0)).await.is_empty());
    assert!(matches!(
        m.list_matching(&ListFilter::default().prefix("a\0")).await,
        Err(Error::InvalidInput {
            argument: "prefix",
            ..
        })
    ));
}

/// The facts the command line asks for instead of sending SQL of its
/// own: the database's clock (the one leases are decided on), how many
/// lease names there are, and the role that owns the functions.
async fn the_database_clock_the_lease_count_and_the_functions_owner() {
    let db = TestDb::new().await;
    let m = db.manager();
    assert_eq!(m.count_leases().await.expect("count"), 0);
    let before = m.database_time().await.expect("database time");
    let lease = m
        .acquire("counted-1", AcquireOptions::ttl(Duration::from_secs(60)))
        .await
        .expect("acquire");
    let after = m.database_time().await.expect("database time");
    assert!(
        before <= lease.acquired_at() && lease.acquired_at() <= after,
        "{before} <= {} <= {after}",
        lease.acquired_at()
    );
    m.release(&lease).await.expect("release");
    m.acquire("counted-2", AcquireOptions::ttl(Duration::from_secs(60)))
        .await
        .expect("acquire");
    // Released or held, each name is a row.
    assert_eq!(m.count_leases().await.expect("count"), 2);
    let owner: String = sqlx::query_scalar(
        "SELECT pg_get_userbyid(nspowner)::text FROM pg_namespace WHERE nspname = 'pglease'",
    )
    .fetch_one(m.pool())
    .await
    .expect("schema owner");
    assert_eq!(m.functions_owner().await.expect("owner"), owner);
}

tests![
    filters_run_in_the_database_and_take_prefixes_literally,
    the_database_clock_the_lease_count_and_the_functions_owner,
];
