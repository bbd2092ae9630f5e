//! Observation: an observer reports each change of a lease it reads, in
//! commit order, expiry included, and a burst ends in its latest state;
//! after its
//! listening connection is dropped it reports the latest state, then goes
//! on change by change; through polling (no notifications) it reports the
//! changes it can tell apart and the current state otherwise. Step-down
//! requests are shown in the status view and reported. A manager's
//! observers, electors and waiters share one listening connection: a
//! thousand observers cost one server session, not a thousand.

use std::time::Duration;

use crate::common::{TestDb, poll_until};
use pglease::observe::{Change, Observer};
use pglease::{AcquireOptions, LeaseManager, ManagerOptions, Token};

const BOUND: Duration = Duration::from_secs(10);

async fn next(observer: &mut Observer) -> Change {
    tokio::time::timeout(BOUND, observer.next())
        .await
        .expect("a change within the bound")
        .expect("the observer runs")
}

/// The next change, which must be of the kind `matches` accepts.
async fn expect(observer: &mut Observer, what: &str, matches: impl Fn(&Change) -> bool) -> Change {
    let change = next(observer).await;
    assert!(matches(&change), "expected {what}, got {change:?}");
    change
}

async fn acquire(manager: &LeaseManager, holder: &str, ttl: Duration) -> Token {
    manager
        .acquire("obs", AcquireOptions::ttl(ttl).holder(holder))
        .await
        .expect("acquire")
        .token()
}

async fn observers_see_every_change_in_order() {
    let db = TestDb::new().await;
    let manager = db.manager();
    let mut observer = manager.observe("obs").await.expect("observe");
    let first = next(&mut observer).await;
    assert!(
        matches!(&first, Change::Current(s) if s.token.is_none() && !s.held),
        "{first:?}"
    );

    // Acquired with a value, the value changed, a step-down request, a
    // release: each reported as the observer reads it (a notification is
    // only a hint to read).
    let a = manager
        .acquire(
            "obs",
            AcquireOptions::ttl(Duration::from_secs(30))
                .holder("a")
                .value("10.0.0.1:80"),
        )
        .await
        .expect("acquire a");
    let t = a.token();
    expect(
        &mut observer,
        "a acquired",
        |c| matches!(c, Change::Acquired { token, holder, .. } if *token == t && holder == "a"),
    )
    .await;
    expect(&mut observer, "its first value", |c| {
        matches!(c, Change::ValueChanged { token, value: Some(v) } if *token == t && v == "10.0.0.1:80")
    })
    .await;
    manager
        .set_value(&a, Some("10.0.0.1:81"))
        .await
        .expect("set_value");
    expect(&mut observer, "the new value", |c| {
        matches!(c, Change::ValueChanged { token, value: Some(v) } if *token == t && v == "10.0.0.1:81")
    })
    .await;
    let asked = manager
        .request_step_down("obs", "ops")
        .await
        .expect("request step-down");
    assert_eq!(asked, Some(a.token()));
    let status = manager.inspect("obs").await.expect("inspect");
    assert_eq!(status.step_down_requested_by.as_deref(), Some("ops"));
    assert!(status.step_down_requested_at.is_some());
    expect(
        &mut observer,
        "the step-down request",
        |c| matches!(c, Change::StepDownRequested { token, by } if *token == t && by == "ops"),
    )
    .await;
    assert!(manager.release(&a).await.expect("release"));
    // Nobody holds it: a request asks nobody, and the status shows none.
    assert_eq!(manager.request_step_down("obs", "ops").await.unwrap(), None);
    assert_eq!(
        manager.inspect("obs").await.unwrap().step_down_requested_by,
        None
    );
    expect(&mut observer, "a released", |c| {
        *c == Change::Released { token: t }
    })
    .await;

    // A short lease that nobody renews: reported expired (no event in the
    // database), then taken over.
    let b = acquire(&manager, "b", Duration::from_millis(300)).await;
    expect(
        &mut observer,
        "b acquired",
        |c| matches!(c, Change::Acquired { token, .. } if *token == b),
    )
    .await;
    expect(&mut observer, "b expired", |c| {
        *c == Change::Expired { token: b }
    })
    .await;
    // Taken over after its expiry: expired, then acquired, whether the
    // observer read the expiry first or heard the takeover first.
    let c = acquire(&manager, "c", Duration::from_millis(300)).await;
    expect(
        &mut observer,
        "c acquired",
        |ch| matches!(ch, Change::Acquired { token, .. } if *token == c),
    )
    .await;
    let deadline = db.now().await + chrono::Duration::milliseconds(350);
    db.wait_until(deadline).await;
    let d = acquire(&manager, "d", Duration::from_secs(30)).await;
    expect(&mut observer, "c expired", |ch| {
        *ch == Change::Expired { token: c }
    })
    .await;
    expect(
        &mut observer,
        "d acquired",
        |ch| matches!(ch, Change::Acquired { token, .. } if *token == d),
    )
    .await;

    // A value too long for a notification is read from the table.
    let long = "x".repeat(8000);
    sqlx::query("SELECT pglease.set_value('obs', $1, $2)")
        .bind(d)
        .bind(&long)
        .execute(db.pool())
        .await
        .expect("set_value a long value through SQL");
    expect(&mut observer, "the long value", |ch| {
        matches!(ch, Change::ValueChanged { token, value: Some(v) } if *token == d && *v == long)
    })
    .await;
    sqlx::query("SELECT pglease.release('obs', $1)")
        .bind(d)
        .execute(db.pool())
        .await
        .expect("release through SQL");
    expect(&mut observer, "d released", |ch| {
        *ch == Change::Released { token: d }
    })
    .await;

    // A burst: what the observer reports ends in the latest state (changes
    // that commit between two of its reads are reported together, as the
    // current state), and nothing is reported that did not happen.
    let mut tokens = Vec::new();
    for i in 0..50 {
        let lease = manager
            .acquire(
                "obs",
                AcquireOptions::ttl(Duration::from_secs(30)).holder(format!("burst-{i}")),
            )
            .await
            .expect("acquire in the burst");
        manager.release(&lease).await.expect("release in the burst");
        tokens.push(lease.token());
    }
    let last = *tokens.last().expect("a burst");
    loop {
        let change = next(&mut observer).await;
        let token = match &change {
            Change::Acquired { token, .. } | Change::Released { token } => *token,
            Change::Current(status) => status.token.expect("a token"),
            other => panic!("a burst of acquisitions and releases reported {other:?}"),
        };
        assert!(tokens.contains(&token), "{change:?} is not of the burst");
        if change == (Change::Released { token: last })
            || matches!(&change, Change::Current(s) if s.token == Some(last) && !s.held)
        {
            break;
        }
    }
}

/// The manager's listening connection, as `pg_stat_activity` shows it.
async fn observer_pids(db: &TestDb) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity \
          WHERE application_name = 'pglease listener' AND datname = current_database()",
    )
    .fetch_all(db.pool())
    .await
    .expect("read pg_stat_activity")
}

async fn after_a_dropped_connection_the_latest_state_is_reported() {
    let db = TestDb::new().await;
    let manager = db.manager();
    let mut observer = manager.observe("obs").await.expect("observe");
    expect(&mut observer, "the first state", |c| {
        matches!(c, Change::Current(_))
    })
    .await;
    let a = acquire(&manager, "a", Duration::from_secs(30)).await;
    expect(
        &mut observer,
        "a acquired",
        |c| matches!(c, Change::Acquired { token, .. } if *token == a),
    )
    .await;

    // Drop the observer's connection, and keep it from observing again
    // (its `pglease.observe` waits, up to 2 s, for this session's
    // exclusive lock on the name's key) while the lease changes hands
    // twice.
    let pids = observer_pids(&db).await;
    assert_eq!(pids.len(), 1, "one observing connection: {pids:?}");
    let mut blocker = db.connect().await;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pids[0])
        .execute(&mut blocker)
        .await
        .expect("terminate the observer's connection");
    sqlx::query("SELECT pg_advisory_lock(1886154594, hashtext('obs'))")
        .execute(&mut blocker)
        .await
        .expect("take the observe key");
    // (pglease.observe tries the key for up to 2 s, then gives up.)
    poll_until("the observer to reconnect and wait", BOUND, || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
              WHERE application_name = 'pglease listener' AND state = 'active' \
                AND query LIKE '%pglease.observe(%' AND datname = current_database())",
        )
        .fetch_one(db.pool())
        .await
        .expect("read pg_locks")
    })
    .await;
    let other = db.manager();
    sqlx::query("SELECT pglease.release('obs', $1)")
        .bind(a)
        .execute(db.pool())
        .await
        .expect("release a");
    let b = acquire(&other, "b", Duration::from_secs(30)).await;
    sqlx::query("SELECT pg_advisory_unlock(1886154594, hashtext('obs'))")
        .execute(&mut blocker)
        .await
        .expect("let the observer go");

    // What happened meanwhile, as the latest state; then every change.
    expect(&mut observer, "the latest state", |c| {
        matches!(c, Change::Current(s) if s.token == Some(b) && s.held && s.holder.as_deref() == Some("b"))
    })
    .await;
    sqlx::query("SELECT pglease.release('obs', $1)")
        .bind(b)
        .execute(db.pool())
        .await
        .expect("release b");
    expect(&mut observer, "b released", |c| {
        *c == Change::Released { token: b }
    })
    .await;
}

async fn without_notifications_the_observer_polls() {
    let db = TestDb::new().await;
    let manager = db
        .manager_with(
            "polling",
            ManagerOptions::default()
                .notify(false)
                .max_poll_interval(Duration::from_millis(50)),
        )
        .await;
    let mut observer = manager.observe("obs").await.expect("observe");
    expect(&mut observer, "the first state", |c| {
        matches!(c, Change::Current(_))
    })
    .await;
    assert!(
        observer_pids(&db).await.is_empty(),
        "no listening connection"
    );
    let a = acquire(&manager, "a", Duration::from_secs(30)).await;
    expect(
        &mut observer,
        "a acquired",
        |c| matches!(c, Change::Acquired { token, holder, .. } if *token == a && holder == "a"),
    )
    .await;
    sqlx::query("SELECT pglease.request_step_down('obs', 'ops')")
        .execute(db.pool())
        .await
        .expect("request a step-down");
    expect(&mut observer, "the request", |c| {
        *c == Change::StepDownRequested {
            token: a,
            by: "ops".to_owned(),
        }
    })
    .await;
    sqlx::query("SELECT pglease.release('obs', $1)")
        .bind(a)
        .execute(db.pool())
        .await
        .expect("release a");
    expect(&mut observer, "a released", |c| {
        *c == Change::Released { token: a }
    })
    .await;
}

async fn nothing_is_notified_while_nobody_observes() {
    let db = TestDb::new().await;
    let manager = db.manager();
    let mut listener = sqlx::postgres::PgListener::connect_with(db.pool())
        .await
        .expect("listen");
    listener.listen("pglease_change").await.expect("listen");
    let lease = manager
        .acquire(
            "quiet",
            AcquireOptions::ttl(Duration::from_secs(30)).value("v"),
        )
        .await
        .expect("acquire");
    manager.release(&lease).await.expect("release");
    // Notifications arrive in commit order: the marker, sent after the
    // changes committed, must be the first.
    sqlx::query("SELECT pg_notify('pglease_change', 'marker')")
        .execute(db.pool())
        .await
        .expect("notify the marker");
    let first = tokio::time::timeout(BOUND, listener.recv())
        .await
        .expect("a notification")
        .expect("receive");
    assert_eq!(first.payload(), "marker");
}

/// How many distinct keys of `space` (the first half of pglease's
/// two-part advisory keys: 1886154594 observers, 1886156641 waiters)
/// session `pid` holds.
async fn keys_held(db: &TestDb, pid: i32, space: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(DISTINCT objid) FROM pg_locks \
          WHERE locktype = 'advisory' AND objsubid = 2 AND granted \
            AND pid = $1 AND classid = $2::bigint::oid",
    )
    .bind(pid)
    .bind(space)
    .fetch_one(db.pool())
    .await
    .expect("read pg_locks")
}

async fn observers_electors_and_waiters_share_one_listening_connection() {
    const OBSERVERS: usize = 1000;
    const NAMES: usize = 500;
    let db = TestDb::new().await;
    let manager = db.manager_with("shared", ManagerOptions::default()).await;
    let holder = db.manager();
    let busy = holder
        .acquire("busy", AcquireOptions::ttl(Duration::from_secs(60)))
        .await
        .expect("acquire busy");

    // A waiter, two electors and a thousand observers (two per name).
    let waiting = {
        let manager = manager.clone();
        tokio::spawn(async move {
            manager
                .acquire(
                    "busy",
                    AcquireOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(60)),
                )
                .await
        })
    };
    let electors: Vec<_> = ["leader-a", "leader-b"]
        .into_iter()
        .map(|name| {
            let elector = std::sync::Arc::new(
                manager
                    .elector(name, AcquireOptions::ttl(Duration::from_secs(30)))
                    .expect("elector"),
            );
            let run = {
                let elector = std::sync::Arc::clone(&elector);
                tokio::spawn(async move { elector.run(async |_| {}).await })
            };
            (elector, run)
        })
        .collect();
    let mut observers = Vec::with_capacity(OBSERVERS);
    for i in 0..OBSERVERS {
        let mut observer = manager
            .observe(&format!("n{}", i % NAMES))
            .await
            .expect("observe");
        expect(&mut observer, "the first state", |c| {
            matches!(c, Change::Current(_))
        })
        .await;
        observers.push(observer);
    }
    for (elector, _) in &electors {
        poll_until("each elector to lead", BOUND, || async {
            elector.is_leader()
        })
        .await;
    }

    // One listening session, holding every name's key once.
    let pids = observer_pids(&db).await;
    assert_eq!(pids.len(), 1, "one listening connection: {pids:?}");
    let names: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT hashtext(n)) FROM (SELECT 'n' || g AS n FROM generate_series(0, $1 - 1) g \
          UNION ALL VALUES ('leader-a'), ('leader-b')) AS names",
    )
    .bind(NAMES as i32)
    .fetch_one(db.pool())
    .await
    .expect("count the keys");
    poll_until("the waiter's watch", BOUND, || async {
        keys_held(&db, pids[0], 1_886_156_641).await == 1
    })
    .await;
    assert_eq!(keys_held(&db, pids[0], 1_886_154_594).await, names);
    let sessions: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
          WHERE datname = current_database() AND application_name = 'shared'",
    )
    .fetch_one(db.pool())
    .await
    .expect("count the pool's sessions");
    assert!(
        sessions <= 4,
        "the manager's pool has at most 4 sessions: {sessions}"
    );

    // Everyone is still told: the waiter gets the released lease, and the
    // observers of a name see it change hands.
    assert!(holder.release(busy).await.expect("release busy"));
    let taken = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the waiter acquires within the bound")
        .expect("waiter task")
        .expect("the waiter acquires");
    let n7 = holder
        .acquire(
            "n7",
            AcquireOptions::ttl(Duration::from_secs(30)).holder("h7"),
        )
        .await
        .expect("acquire n7");
    for observer in observers.iter_mut().filter(|o| o.name() == "n7") {
        expect(observer, "n7 acquired", |c| {
            matches!(c, Change::Acquired { token, holder, .. } if *token == n7.token() && holder == "h7")
        })
        .await;
    }

    // Dropped, the observers' names are unsubscribed; the electors' stay.
    drop(observers);
    poll_until("the observers' keys to go", BOUND, || async {
        keys_held(&db, pids[0], 1_886_154_594).await == 2
    })
    .await;
    assert_eq!(observer_pids(&db).await, pids, "the same listening session");
    for (elector, run) in electors {
        elector.resign();
        tokio::time::timeout(BOUND, run)
            .await
            .expect("the elector stops")
            .expect("elector task")
            .expect("run");
    }
    drop(taken);
}

pglease_formations::tests![
    observers_see_every_change_in_order(2),
    observers_electors_and_waiters_share_one_listening_connection(2),
    after_a_dropped_connection_the_latest_state_is_reported(2),
    without_notifications_the_observer_polls(2),
    nothing_is_notified_while_nobody_observes(2),
];
