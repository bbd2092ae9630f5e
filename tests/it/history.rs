//! The history: every transition recorded with its token, holder, time and
//! detail, renewals counted per term; retention pruned by the transitions
//! themselves; and the break-glass `force_release`, which ends a running
//! holder's lease at once and moves its fence (its renewal fails, its
//! fenced writes and its open fenced transaction are refused, its release
//! is ignored), is recorded with its reason, and is for administrators.

use std::time::Duration;

use crate::common::TestDb;
use pglease::history::{Event, Transition};
use pglease::{AcquireOptions, Error, LossReason};
use sqlx::AssertSqlSafe;

const BOUND: Duration = Duration::from_secs(10);

/// (event, token, holder, detail) of each transition of `name`.
async fn events(db: &TestDb, name: &str) -> Vec<(Event, i64, Option<String>, Option<String>)> {
    db.manager()
        .history(name, None)
        .await
        .expect("history")
        .into_iter()
        .map(|t: Transition| (t.event, t.token.get(), t.holder, t.detail))
        .collect()
}

async fn every_transition_is_recorded_in_order() {
    let db = TestDb::new().await;
    let m = db.manager();
    let a = m
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_secs(30))
                .holder("a")
                .value("v1"),
        )
        .await
        .expect("acquire a");
    m.set_value(&a, Some("v2")).await.expect("set_value");
    for _ in 0..3 {
        m.renew(&a, Duration::from_secs(30)).await.expect("renew");
    }
    assert_eq!(m.inspect("job").await.unwrap().renewals, 3);
    m.request_step_down("job", "ops").await.expect("ask");
    assert!(m.release(&a).await.expect("release"));
    // A short term that expires, then a takeover.
    let b = m
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_millis(300)).holder("b"),
        )
        .await
        .expect("acquire b");
    m.renew(&b, Duration::from_millis(300))
        .await
        .expect("renew b");
    db.wait_until(m.inspect("job").await.unwrap().expires_at.unwrap())
        .await;
    let c = m
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_secs(30)).holder("c"),
        )
        .await
        .expect("acquire c");
    assert_eq!(m.inspect("job").await.unwrap().renewals, 0);

    let (ta, tb, tc) = (a.token().get(), b.token().get(), c.token().get());
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(
        events(&db, "job").await,
        vec![
            (Event::Acquired, ta, s("a"), None),
            (Event::ValueChanged, ta, s("a"), s("v1")),
            (Event::ValueChanged, ta, s("a"), s("v2")),
            (Event::StepDownRequested, ta, s("a"), s("ops")),
            (Event::Released, ta, s("a"), None),
            (Event::Acquired, tb, s("b"), None),
            (Event::Expired, tb, s("b"), None),
            (Event::Acquired, tc, s("c"), None),
        ]
    );
    let history = m.history("job", None).await.expect("history");
    // Each term's end carries its renewals; times are the database's.
    assert_eq!(history[4].renewals, Some(3));
    assert_eq!(history[6].renewals, Some(1));
    assert_eq!(history[0].at, a.acquired_at());
    assert!(history[6].at < history[7].at, "expired before the takeover");
    assert!(history.windows(2).all(|w| w[0].id < w[1].id));
    // `since` keeps the later ones.
    let since = m.history("job", Some(history[5].at)).await.expect("since");
    assert_eq!(since.len(), 3);
    // Another name has its own history.
    assert!(m.history("other", None).await.expect("other").is_empty());
}

async fn a_takeover_that_ends_a_frozen_holders_transaction_records_the_eviction() {
    let db = TestDb::new().await;
    crate::common::create_data_table(&db).await;
    let m = db.manager();
    let old = m
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_millis(500)).holder("frozen"),
        )
        .await
        .expect("acquire");
    // The holder writes inside a fenced transaction and then freezes in it.
    let mut open = m.begin_fenced(&old).await.expect("begin fenced");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .persistent(false)
        .fetch_one(&mut *open)
        .await
        .expect("pid");
    sqlx::query("UPDATE data SET value = 'from the frozen holder' WHERE id = 1")
        .persistent(false)
        .execute(&mut *open)
        .await
        .expect("write while valid");
    db.wait_until(old.expires_at()).await;
    let started = std::time::Instant::now();
    let next = db
        .manager()
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_secs(30)).holder("next"),
        )
        .await
        .expect("the takeover");
    // Liveness: the frozen transaction did not keep the lease.
    assert!(started.elapsed() < BOUND, "took {:?}", started.elapsed());
    // Safety: its write never commits.
    assert!(open.commit().await.is_err(), "the evicted holder's commit");
    assert_eq!(crate::common::data_value(&db).await, "initial");
    let s = |v: &str| Some(v.to_owned());
    let (to, tn) = (old.token().get(), next.token().get());
    assert_eq!(
        events(&db, "job").await,
        vec![
            (Event::Acquired, to, s("frozen"), None),
            // The term expired (recorded at that time, as the takeover
            // moves the fence), then the takeover ended its sessions
            // (recorded first, at that later time): listed by time.
            (Event::Expired, to, s("frozen"), None),
            (
                Event::Evicted,
                to,
                s("frozen"),
                Some(format!("ended sessions {pid}"))
            ),
            (Event::Acquired, tn, s("next"), None),
        ]
    );
    // A takeover with nobody inside a fenced transaction evicts nobody.
    let short = db
        .manager()
        .acquire(
            "quiet",
            AcquireOptions::ttl(Duration::from_millis(200)).holder("q"),
        )
        .await
        .expect("acquire quiet");
    db.wait_until(short.expires_at()).await;
    m.acquire("quiet", AcquireOptions::ttl(Duration::from_secs(30)))
        .await
        .expect("take quiet over");
    assert!(
        !events(&db, "quiet")
            .await
            .iter()
            .any(|(e, ..)| *e == Event::Evicted)
    );
}

async fn old_rows_are_pruned_by_the_transitions_themselves() {
    let db = TestDb::new().await;
    let m = db.manager();
    db.execute(&[
        "INSERT INTO pglease._history (name, token, event, holder, at) \
         SELECT 'old', g, 'acquired', 'x', now() - interval '40 days' \
           FROM generate_series(1, 300) g"
            .to_owned(),
        "INSERT INTO pglease._history (name, token, event, holder, at) \
         VALUES ('recent', 1, 'acquired', 'x', now() - interval '10 days')"
            .to_owned(),
    ])
    .await;
    // 128 transitions (64 cycles of acquire + release) pass at least one
    // multiple of 128 in the history's ids.
    for _ in 0..64 {
        let lease = m
            .acquire("cycle", AcquireOptions::ttl(Duration::from_secs(30)))
            .await
            .expect("acquire");
        m.release(&lease).await.expect("release");
    }
    let count = |name: &'static str| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pglease.history WHERE name = $1")
                .bind(name)
                .fetch_one(&pool)
                .await
                .expect("count")
        }
    };
    assert_eq!(
        count("old").await,
        0,
        "rows past the 30-day default are gone"
    );
    assert_eq!(count("recent").await, 1, "younger rows are kept");
    assert_eq!(count("cycle").await, 128);
}

async fn force_release_fences_a_running_holder_at_once() {
    let db = TestDb::new().await;
    crate::common::create_data_table(&db).await;
    let holder = db
        .manager_with("holder", pglease::ManagerOptions::default())
        .await;
    let held = holder
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_secs(3)).holder("worker"),
        )
        .await
        .expect("hold");
    let old = held.token();
    // The holder is inside a fenced transaction when the lease is forced.
    let mut open = held.begin_fenced().await.expect("begin fenced");
    sqlx::query("UPDATE data SET value = 'from the forced holder' WHERE id = 1")
        .persistent(false)
        .execute(&mut *open)
        .await
        .expect("write inside the fenced transaction");

    // A waiter on another manager, listening for releases.
    let waiter = db
        .manager_with("waiter", pglease::ManagerOptions::default())
        .await;
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .acquire(
                    "job",
                    AcquireOptions::ttl(Duration::from_secs(30))
                        .holder("next")
                        .wait(BOUND),
                )
                .await
        })
    };
    crate::common::poll_until("the waiter listens", BOUND, || async {
        let stats = waiter.stats();
        stats.waiting == 1 && stats.listening
    })
    .await;

    let admin = db.manager();
    let forced = admin
        .admin()
        .force_release("job", "INC-42: worker stuck")
        .await
        .expect("force release");
    assert_eq!(forced, Some(old));
    // The waiter is woken by the force, long before the old term's expiry.
    let next = waiting
        .await
        .expect("waiter task")
        .expect("the waiter acquires");
    assert!(next.acquired_at() < held.expires_at(), "woken, not expired");
    // Its open fenced transaction was ended: nothing it wrote commits.
    assert!(open.commit().await.is_err(), "the forced holder's commit");
    assert_eq!(crate::common::data_value(&db).await, "initial");
    // Its token fences nothing, its renewal fails at the next tick, its
    // release is ignored.
    assert!(matches!(
        held.begin_fenced().await,
        Err(Error::NotHeld { .. })
    ));
    let reason = tokio::time::timeout(BOUND, held.lost())
        .await
        .expect("the holder learns of it at its next renewal");
    assert!(
        matches!(reason, LossReason::Stale { current_token: Some(t), .. } if t > old),
        "{reason:?}"
    );
    assert!(
        !admin
            .release(&crate::common::fence("job", old.get()))
            .await
            .unwrap()
    );
    // The fence moved past the old token, and the waiter's is larger still.
    let status = admin.inspect("job").await.expect("inspect");
    assert_eq!(status.holder.as_deref(), Some("next"));
    assert!(next.token() > old);
    let history = admin.history("job", None).await.expect("history");
    let forced_row = history
        .iter()
        .find(|t| t.event == Event::ForceReleased)
        .expect("a force_released row");
    assert_eq!(forced_row.token, old);
    assert_eq!(forced_row.holder.as_deref(), Some("worker"));
    assert_eq!(forced_row.detail.as_deref(), Some("INC-42: worker stuck"));
    // Ending its open fenced transaction is recorded too.
    let evicted = history
        .iter()
        .find(|t| t.event == Event::Evicted)
        .expect("an evicted row");
    assert_eq!(
        (evicted.token, evicted.holder.as_deref()),
        (old, Some("worker"))
    );
    // The sessions are ended before the fence moves.
    assert!(evicted.id < forced_row.id);
    // Nobody holds it after a release: nothing to force.
    admin.release(&next).await.expect("release");
    assert_eq!(
        admin.admin().force_release("job", "again").await.unwrap(),
        None
    );
}

async fn force_release_is_for_administrators_and_checks_its_reason() {
    let db = &TestDb::new().await;
    let roles = db.login_roles(&["app", "ops"], &[]).await;
    let (app, ops) = (&roles[0], &roles[1]);
    let m = db.manager();
    m.acquire("job", AcquireOptions::ttl(Duration::from_secs(30)))
        .await
        .expect("acquire");
    let as_role = async |role: &str, sql: &str| {
        crate::common::sqlstate_of(&mut db.connect_as(role).await, sql).await
    };
    let call = "SELECT pglease.force_release('job', 'test')";
    // Not granted to PUBLIC; granted EXECUTE, still not an administrator.
    assert_eq!(as_role(app, call).await.as_deref(), Some("42501"));
    db.execute(&[format!(
        "GRANT EXECUTE ON FUNCTION pglease.force_release(text, text) TO {app}"
    )])
    .await;
    assert_eq!(as_role(app, call).await.as_deref(), Some("42501"));
    assert!(m.inspect("job").await.unwrap().held, "refused: still held");
    // A member of pglease_admin.
    db.execute(&[format!("GRANT pglease_admin TO {ops}")]).await;
    assert_eq!(as_role(ops, call).await, None);
    assert!(
        !m.inspect("job").await.unwrap().held,
        "an administrator: forced"
    );

    // Bad reasons, before anything is sent, and in SQL.
    let before = db.state().await;
    for (reason, why) in [("", "empty"), (&*"r".repeat(1001), "too long")] {
        match m.admin().force_release("job", reason).await {
            Err(Error::InvalidInput { argument, .. }) => assert_eq!(argument, "reason", "{why}"),
            other => panic!("{why}: {other:?}"),
        }
    }
    for sql in [
        "SELECT pglease.force_release('job', NULL)",
        "SELECT pglease.force_release('job', '')",
        "SELECT pglease.force_release('job', repeat('r', 1001))",
        "SELECT pglease.force_release(NULL, 'why')",
    ] {
        let err = sqlx::query(sql).execute(db.pool()).await.expect_err(sql);
        assert_eq!(
            err.as_database_error().and_then(|d| d.code()).as_deref(),
            Some("22023"),
            "{sql}"
        );
    }
    assert_eq!(db.state().await, before);
}

async fn a_zero_retention_records_nothing() {
    let db = TestDb::new().await;
    let m = db.manager();
    let settings: (String, i64) =
        sqlx::query_as("SELECT retention::text, max_rows FROM pglease.history_settings")
            .fetch_one(db.pool())
            .await
            .expect("the defaults");
    assert_eq!(settings, ("30 days".to_owned(), 1_000_000));
    sqlx::query("SELECT pglease.set_history('0')")
        .execute(db.pool())
        .await
        .expect("an administrator turns the history off");
    let cycle =
        "SELECT pglease.release('off', (SELECT token FROM pglease.acquire('off', 'h', '1 min')))";
    sqlx::query(cycle).execute(db.pool()).await.expect("cycle");
    assert!(m.history("off", None).await.expect("history").is_empty());
    // Bad settings are refused, and change nothing.
    for sql in [
        "SELECT pglease.set_history('-1 day')",
        "SELECT pglease.set_history(NULL)",
        "SELECT pglease.set_history('1 day', 999)",
    ] {
        let err = sqlx::query(sql).execute(db.pool()).await.expect_err(sql);
        assert_eq!(
            err.as_database_error().and_then(|d| d.code()).as_deref(),
            Some("22023"),
            "{sql}"
        );
    }
    sqlx::query("SELECT pglease.set_history('7 days', 5000)")
        .execute(db.pool())
        .await
        .expect("on again");
    sqlx::query(AssertSqlSafe(cycle.replace("'off'", "'on'")))
        .execute(db.pool())
        .await
        .expect("a cycle");
    let events: Vec<Event> = m
        .history("on", None)
        .await
        .expect("history")
        .into_iter()
        .map(|t| t.event)
        .collect();
    assert_eq!(events, vec![Event::Acquired, Event::Released]);
}

pglease_formations::tests![
    every_transition_is_recorded_in_order(2),
    a_takeover_that_ends_a_frozen_holders_transaction_records_the_eviction(2),
    old_rows_are_pruned_by_the_transitions_themselves(2),
    force_release_fences_a_running_holder_at_once(2),
    force_release_is_for_administrators_and_checks_its_reason,
    a_zero_retention_records_nothing,
];
