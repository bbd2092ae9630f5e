//! Listing leases filtered in the database: held, expired, a name prefix
//! taken literally (no pattern characters), a limit, in name order. One
//! picture of a name whoever holds it: shared holders and counted slots
//! are shown held, and a forced release ends them all.

use std::time::Duration;

use crate::common::TestDb;
use pglease::{AcquireOptions, Error, LeaseKind, ListFilter};

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
        m.list(&filter)
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
        m.list(&ListFilter::default().prefix("a\0")).await,
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
    assert_eq!(m.admin().count_leases().await.expect("count"), 0);
    let before = m.admin().database_time().await.expect("database time");
    let lease = m
        .acquire("counted-1", AcquireOptions::ttl(Duration::from_secs(60)))
        .await
        .expect("acquire");
    let after = m.admin().database_time().await.expect("database time");
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
    assert_eq!(m.admin().count_leases().await.expect("count"), 2);
    let owner: String = sqlx::query_scalar(
        "SELECT pg_get_userbyid(nspowner)::text FROM pg_namespace WHERE nspname = 'pglease'",
    )
    .fetch_one(m.pool())
    .await
    .expect("schema owner");
    assert_eq!(m.admin().functions_owner().await.expect("owner"), owner);
}

/// A name held only by shared holders, and a counted lease held only
/// through its slots: `inspect` and `list(held)` show them held,
/// with their counts. `force_release` ends both shared holders at once,
/// also the one inside its checked transaction (its session ends: nothing
/// of it commits after), and every slot; each name is then acquired at
/// once, with a token above every ended one.
async fn shared_and_counted_holders_are_shown_and_forced() {
    let db = TestDb::new().await;
    let m = db.manager();
    let ttl = Duration::from_secs(60);
    let a = m
        .acquire("sh", AcquireOptions::ttl(ttl).shared(true).holder("A"))
        .await
        .expect("A");
    let b = m
        .acquire("sh", AcquireOptions::ttl(ttl).shared(true).holder("B"))
        .await
        .expect("B");
    let s1 = m
        .acquire("jobs", AcquireOptions::ttl(ttl).limit(2))
        .await
        .expect("slot 1");
    let s2 = m
        .acquire("jobs", AcquireOptions::ttl(ttl).limit(2))
        .await
        .expect("slot 2");

    let sh = m.inspect("sh").await.expect("inspect sh");
    assert_eq!(
        (sh.kind, sh.readers, sh.held),
        (LeaseKind::Shared, 2, false)
    );
    assert!(sh.is_held_by_anyone());
    assert_eq!(sh.readers_until, Some(b.expires_at()));
    let holders = m.admin().shared_holders("sh").await.expect("holders");
    let tokens: Vec<_> = holders
        .iter()
        .map(|h| (h.token, h.holder.as_str()))
        .collect();
    assert_eq!(tokens, [(a.token(), "A"), (b.token(), "B")]);
    let jobs = m.inspect("jobs").await.expect("inspect jobs");
    assert_eq!(
        (jobs.kind, jobs.slots, jobs.slots_held),
        (LeaseKind::Counted, Some(2), 2)
    );
    assert_eq!(jobs.expires_at, Some(s2.expires_at()));
    let held: Vec<String> = m
        .list(&ListFilter::default().held())
        .await
        .expect("held")
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(held, ["jobs", "jobs#1", "jobs#2", "sh"]);

    // B checks its token in a transaction left open.
    let mut reader = db.connect().await;
    sqlx::query("BEGIN")
        .execute(&mut reader)
        .await
        .expect("begin");
    sqlx::query("SELECT pglease.assert_shared('sh', $1)")
        .bind(b.token().get())
        .execute(&mut reader)
        .await
        .expect("B's check");
    let ended = m
        .admin()
        .force_release("sh", "test")
        .await
        .expect("force sh");
    assert_eq!(ended, Some(b.token()), "the greatest token ended");
    let commit = sqlx::query("COMMIT").execute(&mut reader).await;
    assert!(
        commit.is_err(),
        "B's checked transaction was ended: {commit:?}"
    );
    for lease in [&a, &b] {
        assert!(
            matches!(m.renew(lease, ttl).await, Err(Error::Lost { .. })),
            "a forced shared token renews no more"
        );
    }
    let after = m.inspect("sh").await.expect("inspect");
    assert_eq!((after.kind, after.readers), (LeaseKind::Free, 0));
    let writer = m
        .acquire("sh", AcquireOptions::ttl(ttl))
        .await
        .expect("an exclusive acquisition at once");
    assert!(writer.token() > b.token());

    assert_eq!(
        m.admin()
            .force_release("jobs", "test")
            .await
            .expect("force jobs"),
        Some(s2.token()).max(Some(s1.token()))
    );
    assert!(matches!(m.renew(&s1, ttl).await, Err(Error::Lost { .. })));
    assert_eq!(m.inspect("jobs").await.expect("jobs").kind, LeaseKind::Free);
    m.acquire("jobs", AcquireOptions::ttl(ttl).limit(2))
        .await
        .expect("a slot at once");
    assert_eq!(
        m.admin()
            .force_release("jobs#9", "test")
            .await
            .expect("none"),
        None
    );
}

pglease_formations::tests![
    shared_and_counted_holders_are_shown_and_forced,
    filters_run_in_the_database_and_take_prefixes_literally,
    the_database_clock_the_lease_count_and_the_functions_owner,
];
