//! Release notifications go only to names a session watches
//! (`pglease.watch`), and the watch protocol misses no release: a watch is
//! refused while a release that nobody watched is committing.

use std::time::Duration;

use crate::common::{TestDb, poll_until};
use pglease::schema::RELEASE_CHANNEL;
use pglease::{AcquireOptions, Lease, LeaseManager, ManagerOptions};
use sqlx::postgres::PgListener;

const BOUND: Duration = Duration::from_secs(30);
const SLOW: Duration = Duration::from_secs(120);

/// The sessions of this database that watch a name (hold a shared watch
/// lock; a committing release holds the exclusive one).
async fn watching_sessions(db: &TestDb) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT k.pid FROM pg_locks AS k \
          WHERE k.locktype = 'advisory' AND k.classid = 1886156641::oid AND k.mode = 'ShareLock' \
            AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
          ORDER BY k.pid",
    )
    .fetch_all(db.pool())
    .await
    .expect("read pg_locks")
}

async fn listen(db: &TestDb) -> PgListener {
    let mut listener = PgListener::connect_with(db.pool())
        .await
        .expect("listener connects");
    listener.listen(RELEASE_CHANNEL).await.expect("LISTEN");
    listener
}

async fn watch(listener: &mut PgListener, name: &str) -> bool {
    sqlx::query_scalar("SELECT pglease.watch($1)")
        .bind(name)
        .fetch_one(&mut *listener)
        .await
        .expect("pglease.watch")
}

async fn unwatch(listener: &mut PgListener, name: &str) -> bool {
    sqlx::query_scalar("SELECT pglease.unwatch($1)")
        .bind(name)
        .fetch_one(&mut *listener)
        .await
        .expect("pglease.unwatch")
}

async fn acquire(m: &LeaseManager, name: &str) -> Lease {
    m.acquire(name, AcquireOptions::ttl(SLOW).holder("A"))
        .await
        .expect("A acquires")
}

/// B waits for "job" (held by A) through a manager that polls at most every
/// two minutes, on a task; returns once its listener watches "job".
async fn watching_waiter(
    db: &TestDb,
    app: &str,
) -> tokio::task::JoinHandle<pglease::Result<Lease>> {
    let waiter = db
        .manager_with(app, ManagerOptions::default().max_poll_interval(SLOW))
        .await;
    let waiting = tokio::spawn(async move {
        waiter
            .acquire("job", AcquireOptions::ttl(SLOW).holder("B").wait(SLOW))
            .await
    });
    poll_until("the waiter to watch", BOUND, || async {
        watching_sessions(db).await.len() == 1
    })
    .await;
    waiting
}

/// The lease B's waiting acquisition got, within [`BOUND`].
async fn woken(waiting: tokio::task::JoinHandle<pglease::Result<Lease>>) -> Lease {
    tokio::time::timeout(BOUND, waiting)
        .await
        .expect("woken by the release")
        .expect("join")
        .expect("B acquires")
}

async fn only_watched_names_are_notified() {
    let db = TestDb::new().await;
    let m = db.manager();
    let mut listener = listen(&db).await;
    assert!(watch(&mut listener, "watched").await);
    let quiet = acquire(&m, "quiet").await;
    let watched = acquire(&m, "watched").await;

    // Notifications arrive in commit order: had the first release
    // notified, its name would come first.
    assert!(
        m.release(&crate::common::fence("quiet", quiet.token()))
            .await
            .expect("release")
    );
    assert!(
        m.release(&crate::common::fence("watched", watched.token()))
            .await
            .expect("release")
    );
    let first = tokio::time::timeout(BOUND, listener.recv())
        .await
        .expect("a notification")
        .expect("recv");
    // The payload is only the name's key: a hint, which names no lease.
    let key: String = sqlx::query_scalar("SELECT hashtext('watched')::text")
        .fetch_one(db.pool())
        .await
        .expect("the key");
    assert_eq!(first.payload(), key);

    // Unwatched, the name is quiet again; watches nest.
    assert!(watch(&mut listener, "watched").await);
    assert!(unwatch(&mut listener, "watched").await);
    assert!(unwatch(&mut listener, "watched").await);
    assert!(
        !unwatch(&mut listener, "watched").await,
        "nothing left to undo"
    );
    let again = acquire(&m, "watched").await;
    let marker = acquire(&m, "marker").await;
    assert!(watch(&mut listener, "marker").await);
    assert!(
        m.release(&crate::common::fence("watched", again.token()))
            .await
            .expect("release")
    );
    assert!(
        m.release(&crate::common::fence("marker", marker.token()))
            .await
            .expect("release")
    );
    let next = tokio::time::timeout(BOUND, listener.recv())
        .await
        .expect("a notification")
        .expect("recv");
    let key: String = sqlx::query_scalar("SELECT hashtext('marker')::text")
        .fetch_one(db.pool())
        .await
        .expect("the key");
    assert_eq!(next.payload(), key);
}

async fn a_watch_is_refused_while_an_unwatched_release_commits() {
    let db = TestDb::new().await;
    let m = db.manager();
    let lease = acquire(&m, "job").await;
    let mut listener = listen(&db).await;

    let mut tx = db.pool().begin().await.expect("begin");
    let released: bool = sqlx::query_scalar("SELECT pglease.release('job', $1)")
        .bind(lease.token())
        .fetch_one(&mut *tx)
        .await
        .expect("release");
    assert!(released);
    // Watching now would come too late for this release's notification:
    // refused, without waiting for the releasing transaction.
    assert!(!watch(&mut listener, "job").await);
    assert!(
        watching_sessions(&db).await.is_empty(),
        "a refused watch holds nothing"
    );
    tx.commit().await.expect("commit");
    // After the commit the lease is visibly free, and watching works.
    assert!(!m.inspect("job").await.expect("inspect").held);
    assert!(watch(&mut listener, "job").await);
    assert_eq!(watching_sessions(&db).await.len(), 1);
}

async fn watch_rejects_bad_names() {
    let db = TestDb::new().await;
    for name in [None, Some(""), Some(&"x".repeat(256) as &str)] {
        let err = sqlx::query("SELECT pglease.watch($1)")
            .bind(name)
            .execute(db.pool())
            .await
            .expect_err("invalid name");
        let code = err.as_database_error().and_then(|e| e.code());
        assert_eq!(code.as_deref(), Some("22023"), "{err}");
        assert!(err.to_string().contains("name"), "{err}");
    }
    assert!(watching_sessions(&db).await.is_empty());
}

/// A manager's waiter watches its name on the listener's connection while
/// it waits, and nothing once it has the lease.
async fn a_waiter_watches_only_while_it_waits() {
    let db = TestDb::new().await;
    let holder = db.manager();
    let first = acquire(&holder, "job").await;
    let waiting = watching_waiter(&db, "watcher").await;
    assert!(
        holder
            .release(&crate::common::fence("job", first.token()))
            .await
            .expect("release")
    );
    assert!(woken(waiting).await.token() > first.token());
    poll_until("the watch to be dropped", BOUND, || async {
        watching_sessions(&db).await.is_empty()
    })
    .await;
}

/// The listener's connection dies while a waiter waits: the listener
/// reconnects, watches the name again, and the release still wakes the
/// waiter at once (its poll interval and the lease are two minutes long).
async fn a_waiter_is_woken_after_its_listener_reconnected() {
    let db = TestDb::new().await;
    let holder = db.manager();
    let first = acquire(&holder, "job").await;
    let waiting = watching_waiter(&db, "rewatcher").await;
    let old = watching_sessions(&db).await;
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(old[0])
        .fetch_one(db.pool())
        .await
        .expect("terminate the listener's session");
    assert!(terminated);
    poll_until("a new session to watch", BOUND, || async {
        let now = watching_sessions(&db).await;
        now.len() == 1 && now != old
    })
    .await;
    assert!(
        holder
            .release(&crate::common::fence("job", first.token()))
            .await
            .expect("release")
    );
    assert!(woken(waiting).await.token() > first.token());
}

/// Each release nobody watches keeps a lock until commit, so that no
/// watch can slip in; a transaction that releases thousands of leases
/// would fill the shared lock table. Past 32 such locks, release notifies
/// instead.
async fn a_transaction_releasing_many_leases_holds_few_locks() {
    let db = TestDb::new().await;
    let acquired: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM generate_series(1, 2000) AS g, \
                LATERAL pglease.acquire('bulk-' || g, 'A', '10 minutes') AS a \
          WHERE a.token IS NOT NULL",
    )
    .fetch_one(db.pool())
    .await
    .expect("acquire 2,000 leases");
    assert_eq!(acquired, 2000);
    let mut listener = listen(&db).await;
    let mut tx = db.pool().begin().await.expect("begin");
    let released: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pglease.release(l.name, l.token)) \
           FROM pglease.leases AS l WHERE l.name LIKE 'bulk-%'",
    )
    .fetch_one(&mut *tx)
    .await
    .expect("release 2,000 leases in one transaction");
    assert_eq!(released, 2000);
    let locks: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
            AND pid = pg_backend_pid() AND classid = 1886156641::oid",
    )
    .fetch_one(&mut *tx)
    .await
    .expect("count this transaction's release locks");
    assert_eq!(locks, 32);
    tx.commit().await.expect("commit");
    // Past the cap, releases notified: nobody watched, but a waiter would
    // have been told.
    let first = tokio::time::timeout(BOUND, listener.recv())
        .await
        .expect("a notification")
        .expect("recv");
    let bulk: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM generate_series(1, 2000) AS g \
          WHERE hashtext('bulk-' || g)::text = $1)",
    )
    .bind(first.payload())
    .fetch_one(db.pool())
    .await
    .expect("match the key");
    assert!(bulk, "{}", first.payload());
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM pglease.status WHERE held")
        .fetch_one(db.pool())
        .await
        .expect("status");
    assert_eq!(held, 0);
}

pglease_formations::tests![
    only_watched_names_are_notified,
    a_watch_is_refused_while_an_unwatched_release_commits,
    watch_rejects_bad_names,
    a_waiter_watches_only_while_it_waits,
    a_waiter_is_woken_after_its_listener_reconnected,
    a_transaction_releasing_many_leases_holds_few_locks,
];
