//! Holding leases over time against real faults: killed connections,
//! renewals the database does not answer, a paused holder, and a thousand
//! leases renewed by one statement per tick.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use crate::common::{TestDb, create_data_table, data_value, poll_until};
use pglease::{AcquireOptions, Error, LeaseManager, LossReason, ManagerOptions};

const BOUND: Duration = Duration::from_secs(30);

/// Whether a backend of `app` in this test's database waits on a lock.
async fn app_blocked_on_lock(db: &TestDb, app: &str) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = $1 \
           AND datname = current_database() AND wait_event_type = 'Lock')",
    )
    .bind(app)
    .fetch_one(db.pool())
    .await
    .expect("read pg_stat_activity")
}

/// Opens a transaction that row-locks lease `name` FOR UPDATE, so that
/// renewals of it block until the transaction ends.
async fn lock_lease_row(db: &TestDb, name: &str) -> sqlx::PgConnection {
    let mut conn = db.connect().await;
    sqlx::query("BEGIN")
        .execute(&mut conn)
        .await
        .expect("begin");
    sqlx::query("SELECT 1 FROM pglease.leases WHERE name = $1 FOR UPDATE")
        .bind(name)
        .execute(&mut conn)
        .await
        .expect("lock the lease row");
    conn
}

async fn renewal_recovers_from_a_terminated_connection() {
    let db = TestDb::new().await;
    let m = db
        .manager_with("renewer-kill", ManagerOptions::default())
        .await;
    let held = m
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_secs(3)).holder("A"),
        )
        .await
        .expect("hold");
    let renewed_before = m.stats().leases_renewed;

    // Catch the next renewal in the act: block it on a row lock, then kill
    // the backend it runs on.
    let mut blocker = lock_lease_row(&db, "job").await;
    poll_until("a renewal to block", BOUND, || {
        app_blocked_on_lock(&db, "renewer-kill")
    })
    .await;
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
          WHERE application_name = 'renewer-kill' AND datname = current_database() \
            AND wait_event_type = 'Lock'",
    )
    .fetch_one(db.pool())
    .await
    .expect("terminate the renewal's backend");
    assert_eq!(killed, 1);
    sqlx::query("COMMIT")
        .execute(&mut blocker)
        .await
        .expect("unblock");

    poll_until("a renewal after the failure", BOUND, || async {
        let s = m.stats();
        s.renewal_failures >= 1 && s.leases_renewed > renewed_before
    })
    .await;
    assert_eq!(
        held.loss_reason(),
        None,
        "a killed connection lost the lease"
    );
    let status = m.inspect("job").await.expect("inspect");
    assert!(status.held);
    assert_eq!(status.token, Some(held.token()));
    assert!(held.release().await.expect("release"));
}

async fn unanswered_renewals_signal_loss_by_the_local_deadline() {
    let db = TestDb::new().await;
    let options = ManagerOptions::default().safety_margin(Duration::from_millis(300));
    let m = db.manager_with("renewer-block", options).await;
    let held = m
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_millis(1500)).holder("A"),
        )
        .await
        .expect("hold");
    let mut blocker = lock_lease_row(&db, "job").await;
    // From here no renewal can be confirmed: the deadline must not move.
    let deadline = held.deadline();
    let token = held.loss_token();

    let reason = tokio::time::timeout(BOUND, held.lost())
        .await
        .expect("the loss signal fires although the database never answers");
    assert!(
        matches!(reason, LossReason::Unreachable { .. }),
        "unexpected reason {reason:?}"
    );
    assert!(token.is_cancelled(), "the cancellation token fired too");
    assert_eq!(held.deadline(), deadline, "the deadline moved unconfirmed");
    let lost_at = held.lost_at().expect("a loss instant");
    assert!(
        lost_at <= deadline,
        "fired {:?} after the deadline",
        lost_at - deadline
    );
    assert!(app_blocked_on_lock(&db, "renewer-block").await);
    match held.begin_fenced().await {
        Err(Error::Lost { reason, .. }) => {
            assert!(matches!(reason, LossReason::Unreachable { .. }))
        }
        other => panic!("work must not start after the loss, got {other:?}"),
    }
    sqlx::query("ROLLBACK")
        .execute(&mut blocker)
        .await
        .expect("unblock");
}

/// The whole holder process pauses (its runtime's thread stops at a
/// barrier) past its expiry while another holder takes over.
async fn paused_holder_finds_its_lease_lost_and_its_write_rejected() {
    let db = Arc::new(TestDb::new().await);
    create_data_table(&db).await;
    let pause = Arc::new(Barrier::new(2));
    let (acquired_tx, acquired_rx) = tokio::sync::oneshot::channel();

    let holder = {
        let (db, pause) = (db.clone(), pause.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let m = db.manager_with("paused", ManagerOptions::default()).await;
                let held = m
                    .hold(
                        "data",
                        AcquireOptions::ttl(Duration::from_secs(1)).holder("A"),
                    )
                    .await
                    .expect("A holds");
                let _ = acquired_tx.send((held.token(), held.expires_at()));
                // Everything on this runtime stops, renewal included.
                pause.wait();
                let reason = held.loss_reason();
                let local = held.begin_fenced().await.map(|_| ());
                let write = m
                    .fenced(&crate::common::fence("data", held.token()), async |conn| {
                        sqlx::query("UPDATE data SET value = 'from A' WHERE id = 1")
                            .execute(&mut *conn)
                            .await
                            .map_err(Error::from)?;
                        Ok::<_, Error>(())
                    })
                    .await;
                (reason, local, write)
            })
        })
    };

    let (a_token, a_expires) = acquired_rx.await.expect("A acquired");
    db.wait_until(a_expires).await;
    let b = db
        .manager()
        .acquire(
            "data",
            AcquireOptions::ttl(Duration::from_secs(60)).holder("B"),
        )
        .await
        .expect("B takes over after A's expiry");
    assert!(b.token() > a_token);
    pause.wait();
    let (reason, local, write) = tokio::task::spawn_blocking(move || holder.join())
        .await
        .expect("join")
        .expect("holder thread");

    assert_eq!(reason, Some(LossReason::Expired));
    assert!(matches!(local, Err(Error::Lost { .. })), "got {local:?}");
    assert!(matches!(write, Err(Error::NotHeld { .. })), "got {write:?}");
    assert_eq!(data_value(&db).await, "initial");
}

/// A trigger on the leases table counts UPDATE statements and the rows
/// each changed: the database's own account of how renewal is batched.
async fn log_lease_updates(db: &TestDb) {
    sqlx::raw_sql(
        "CREATE TABLE update_log (rows int NOT NULL);
         CREATE FUNCTION log_update() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO public.update_log SELECT count(*) FROM new_rows; RETURN NULL; END $$;
         CREATE TRIGGER log_update AFTER UPDATE ON pglease.leases
           REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION log_update();",
    )
    .execute(db.pool())
    .await
    .expect("install the update log");
}

async fn a_thousand_leases_are_renewed_by_one_statement_per_tick() {
    const LEASES: usize = 1000;
    let ttl = Duration::from_secs(2);
    let db = TestDb::new().await;
    let m = db
        .manager_with("renewer-1000", ManagerOptions::default())
        .await;
    let mut held = Vec::with_capacity(LEASES);
    for i in 0..LEASES {
        held.push(
            m.hold(
                &format!("lease-{i:04}"),
                AcquireOptions::ttl(ttl).holder("H"),
            )
            .await
            .expect("hold"),
        );
    }
    let stats_before_lo = m.stats();
    log_lease_updates(&db).await;
    let stats_before_hi = m.stats();
    let start = db.now().await;
    // Three TTLs: without renewal every lease would have expired twice.
    db.wait_until(start + chrono::Duration::from_std(ttl * 3).expect("ttl"))
        .await;
    let stats_lo = m.stats();
    let (statements, rows): (i64, i64) =
        sqlx::query_as("SELECT count(*), coalesce(sum(rows), 0) FROM update_log")
            .fetch_one(db.pool())
            .await
            .expect("read the update log");
    let stats = m.stats();
    eprintln!("{statements} renewal statements renewed {rows} leases");

    let lost = held.iter().filter(|h| h.is_lost()).count();
    assert_eq!(lost, 0, "leases lost locally");
    let valid: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pglease.status WHERE held AND holder = 'H'")
            .fetch_one(db.pool())
            .await
            .expect("count valid leases");
    assert_eq!(valid, LEASES as i64);
    assert_eq!(stats.renewal_failures, 0);
    // Every renewal statement is one UPDATE, and nothing else updated. A
    // statement is counted when it is sent, so one (the renewal task sends
    // one at a time) may be counted but not yet committed when the log is
    // read: bracket it.
    let sent = |a: &pglease::ManagerStats, b: &pglease::ManagerStats| {
        (a.renewal_statements - b.renewal_statements) as i64
    };
    let fewest = sent(&stats_lo, &stats_before_hi) - 1;
    let most = sent(&stats, &stats_before_lo);
    assert!(
        (fewest..=most).contains(&statements),
        "{statements} UPDATE statements, but the manager sent between {fewest} and {most}"
    );
    // Each lease was renewed several times ...
    assert!(rows >= 3 * LEASES as i64, "only {rows} renewals");
    // ... by statements that renewed the leases together, not one by one.
    assert!(
        rows >= statements * (LEASES as i64 / 2),
        "{statements} statements for {rows} renewals"
    );
    m.shutdown().await.expect("shutdown");
    let still_held: i64 = sqlx::query_scalar("SELECT count(*) FROM pglease.status WHERE held")
        .fetch_one(db.pool())
        .await
        .expect("count");
    assert_eq!(still_held, 0, "shutdown released everything");
}

/// The renewal statement carries names as array elements inside a text
/// literal: names that the array or the literal syntax would read
/// otherwise are renewed like any other.
async fn awkward_names_are_renewed_in_the_background() {
    let ttl = Duration::from_millis(1500);
    let db = TestDb::new().await;
    let m = db.manager();
    let names = [
        "plain",
        "it's",
        r"back\slash",
        r#""quoted""#,
        "comma,and{braces}",
        "NULL",
        " spaced ",
        "ünïcødé",
        r#"\",'{"#,
    ];
    let mut held = Vec::new();
    for name in names {
        held.push(
            m.hold(name, AcquireOptions::ttl(ttl).holder("H"))
                .await
                .expect("hold"),
        );
    }
    let start = db.now().await;
    db.wait_until(start + chrono::Duration::from_std(ttl * 3).expect("ttl"))
        .await;
    for (name, lease) in names.iter().zip(&held) {
        assert!(!lease.is_lost(), "{name:?}: {:?}", lease.loss_reason());
        let status = m.inspect(name).await.expect("inspect");
        assert!(status.held, "{name:?} is held");
        assert_eq!(status.token, Some(lease.token()));
        assert!(
            status.renewals >= 2,
            "{name:?} renewed {} times",
            status.renewals
        );
    }
    assert_eq!(m.stats().renewal_failures, 0);
}

async fn scoped_work_is_stopped_when_the_lease_is_lost() {
    let db = TestDb::new().await;
    let m = db.manager();
    let started = tokio::sync::Notify::new();
    let intruder = db.manager();
    let work = m.with_lease(
        "job",
        AcquireOptions::ttl(Duration::from_secs(1)).holder("A"),
        async |held| {
            started.notify_one();
            // Work that would never finish on its own.
            std::future::pending::<()>().await;
            Ok::<_, Error>(held.token())
        },
    );
    let release_behind_its_back = async {
        started.notified().await;
        let status = intruder.inspect("job").await.expect("inspect");
        let token = status.token.expect("acquired");
        assert!(
            intruder
                .release(&crate::common::fence("job", token))
                .await
                .expect("release")
        );
    };
    let (outcome, ()) = tokio::join!(tokio::time::timeout(BOUND, work), release_behind_its_back);
    match outcome.expect("the work was stopped") {
        Err(Error::Lost { name, reason, .. }) => {
            assert_eq!(name, "job");
            assert_eq!(reason, LossReason::Released);
        }
        other => panic!("expected Lost, got {other:?}"),
    }
}

async fn scoped_work_releases_the_lease_when_it_finishes() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let token = m
        .with_lease(
            "data",
            AcquireOptions::ttl(Duration::from_secs(10)).holder("A"),
            async |held| {
                let mut tx = held.begin_fenced().await.expect("fenced");
                sqlx::query("UPDATE data SET value = 'done' WHERE id = 1")
                    .execute(&mut *tx)
                    .await
                    .expect("write");
                tx.commit().await.expect("commit");
                Ok::<_, Error>(held.token())
            },
        )
        .await
        .expect("work under the lease");
    assert_eq!(data_value(&db).await, "done");
    let status = m.inspect("data").await.expect("inspect");
    assert!(!status.held);
    assert_eq!(status.token, Some(token));
    assert_eq!(m.stats().held, 0);
}

async fn scoped_work_whose_transaction_a_takeover_ended_reports_the_loss() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let inside = tokio::sync::Notify::new();
    let taken = tokio::sync::Notify::new();
    let work = m.with_lease(
        "data",
        AcquireOptions::ttl(Duration::from_secs(60)).holder("A"),
        async |held| {
            let mut tx = held.begin_fenced().await?;
            inside.notify_one();
            // Frozen here while another holder takes the lease over.
            taken.notified().await;
            sqlx::query("UPDATE data SET value = 'late' WHERE id = 1")
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok::<_, Error>(())
        },
    );
    let take_over = async {
        inside.notified().await;
        // The lease ends in the database and B takes it, ending A's open
        // fenced transaction; A's renewal task has not heard of it.
        let other = db.manager();
        pglease::testing::take_over(
            &other,
            "data",
            AcquireOptions::ttl(Duration::from_secs(30)).holder("B"),
        )
        .await
        .expect("take over");
        taken.notify_one();
    };
    let (outcome, ()) = tokio::join!(tokio::time::timeout(BOUND, work), take_over);
    // Not the symptom (57P01, a broken connection) but the loss.
    match outcome.expect("the work ends") {
        Err(Error::Lost {
            reason:
                LossReason::Stale {
                    current_holder: Some(holder),
                    ..
                },
            ..
        }) => assert_eq!(holder, "B"),
        other => panic!("expected Lost(Stale), got {other:?}"),
    }
    assert_eq!(data_value(&db).await, "initial");
    // Work that fails while its lease is held returns its own error, and
    // the lease is released.
    let own = m
        .with_lease(
            "mine",
            AcquireOptions::ttl(Duration::from_secs(60)),
            async |_| {
                Err::<(), _>(Error::Timeout {
                    operation: "the work's own step",
                    after: None,
                })
            },
        )
        .await;
    assert!(matches!(own, Err(Error::Timeout { .. })), "{own:?}");
    assert!(!m.inspect("mine").await.expect("inspect").held);
}

async fn dropping_a_held_lease_releases_it() {
    let db = TestDb::new().await;
    let m = db.manager();
    let held = m
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_secs(60)).holder("A"),
        )
        .await
        .expect("hold");
    drop(held);
    poll_until("the background release", BOUND, || async {
        !m.inspect("job").await.expect("inspect").held
    })
    .await;
}

async fn shutdown_releases_everything_and_refuses_more() {
    let db = TestDb::new().await;
    let m = db.manager();
    let a = m
        .hold(
            "a",
            AcquireOptions::ttl(Duration::from_secs(60)).holder("H"),
        )
        .await
        .expect("hold a");
    let b = m
        .hold(
            "b",
            AcquireOptions::ttl(Duration::from_secs(60)).holder("H"),
        )
        .await
        .expect("hold b");
    m.shutdown().await.expect("shutdown");
    assert_eq!(a.loss_reason(), Some(LossReason::Released));
    assert_eq!(b.loss_reason(), Some(LossReason::Released));
    for name in ["a", "b"] {
        assert!(!m.inspect(name).await.expect("inspect").held);
    }
    assert!(matches!(
        m.hold(
            "c",
            AcquireOptions::ttl(Duration::from_secs(60)).holder("H")
        )
        .await,
        Err(Error::ShutDown)
    ));
}

async fn bad_timing_is_rejected_before_anything_is_acquired() {
    let db = TestDb::new().await;
    assert!(matches!(
        LeaseManager::with_options(
            db.pool().clone(),
            ManagerOptions::default().renew_fraction(1.0)
        ),
        Err(Error::InvalidInput {
            argument: "renew_fraction",
            ..
        })
    ));
    let m = LeaseManager::with_options(
        db.pool().clone(),
        ManagerOptions::default().safety_margin(Duration::from_secs(5)),
    )
    .expect("options alone are fine");
    let before = db.state().await;
    assert!(matches!(
        m.hold(
            "job",
            AcquireOptions::ttl(Duration::from_secs(6)).holder("A")
        )
        .await,
        Err(Error::InvalidInput {
            argument: "safety_margin",
            ..
        })
    ));
    assert_eq!(db.state().await, before);
}

/// `renew_many` as other languages call it: renewed leases, then every
/// element it did not renew with the lease's current state.
async fn renew_many_reports_each_lease_it_did_not_renew() {
    let db = TestDb::new().await;
    let m = db.manager();
    let long = Duration::from_secs(600);
    let valid = m
        .acquire("valid", AcquireOptions::ttl(long).holder("A"))
        .await
        .expect("valid");
    let old = m
        .acquire("taken", AcquireOptions::ttl(long).holder("A"))
        .await
        .expect("taken");
    assert!(
        m.release(&crate::common::fence("taken", old.token()))
            .await
            .expect("release")
    );
    let new = m
        .acquire("taken", AcquireOptions::ttl(long).holder("B"))
        .await
        .expect("retaken");
    let released = m
        .acquire("released", AcquireOptions::ttl(long).holder("A"))
        .await
        .expect("rel");
    assert!(
        m.release(&crate::common::fence("released", released.token()))
            .await
            .expect("release")
    );
    let before = m.inspect("valid").await.expect("inspect");

    type Row = (String, i64, bool, Option<i64>, Option<String>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT name, token, renewed, current_token, current_holder \
           FROM pglease.renew_many($1, $2, '{10 min,10 min,10 min,10 min}') ORDER BY name",
    )
    .bind(vec!["valid", "taken", "released", "never"])
    .bind(vec![
        valid.token().get(),
        old.token().get(),
        released.token().get(),
        1,
    ])
    .fetch_all(db.pool())
    .await
    .expect("renew_many");
    assert_eq!(
        rows,
        vec![
            ("never".into(), 1, false, None, None),
            (
                "released".into(),
                released.token().get(),
                false,
                Some(released.token().get()),
                None
            ),
            (
                "taken".into(),
                old.token().get(),
                false,
                Some(new.token().get()),
                Some("B".into())
            ),
            ("valid".into(), valid.token().get(), true, None, None),
        ]
    );
    let after = m.inspect("valid").await.expect("inspect");
    assert!(
        after.expires_at > before.expires_at,
        "the valid lease was renewed"
    );
    assert_eq!(
        m.inspect("taken").await.expect("inspect").token,
        Some(new.token())
    );
}

/// A held lease is `Clone + 'static`: a clone moved into a spawned task
/// keeps answering "am I still the holder?" locally, its fenced writes go
/// through while the lease is held, and it sees the loss when another clone
/// releases the lease.
async fn a_held_lease_moved_into_a_spawned_task_sees_its_loss() {
    let db = TestDb::new().await;
    crate::common::create_data_table(&db).await;
    let m = db.manager();
    let held = m
        .hold("spawned", AcquireOptions::ttl(Duration::from_secs(10)))
        .await
        .expect("hold");
    let (wrote, write) = tokio::sync::oneshot::channel();
    let task = tokio::spawn({
        let held = held.clone();
        async move {
            let mut tx = held.begin_fenced().await.expect("fenced while held");
            sqlx::query("UPDATE data SET value = 'from the task' WHERE id = 1")
                .execute(&mut *tx)
                .await
                .expect("write");
            tx.commit().await.expect("commit");
            wrote.send(()).expect("tell");
            let reason = held.lost().await;
            (reason, held.is_lost(), held.begin_fenced().await.err())
        }
    });
    write.await.expect("the task wrote");
    assert!(held.release().await.expect("release"));
    let (reason, lost, refused) = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the task saw the loss in time")
        .expect("task");
    assert_eq!(reason, LossReason::Released);
    assert!(lost);
    assert!(matches!(refused, Some(Error::Lost { .. })), "{refused:?}");
    assert_eq!(crate::common::data_value(&db).await, "from the task");
    assert!(!m.inspect("spawned").await.expect("inspect").held);
}

pglease_formations::tests![
    awkward_names_are_renewed_in_the_background,
    renewal_recovers_from_a_terminated_connection,
    unanswered_renewals_signal_loss_by_the_local_deadline,
    paused_holder_finds_its_lease_lost_and_its_write_rejected,
    a_thousand_leases_are_renewed_by_one_statement_per_tick,
    scoped_work_is_stopped_when_the_lease_is_lost,
    scoped_work_releases_the_lease_when_it_finishes,
    scoped_work_whose_transaction_a_takeover_ended_reports_the_loss(2),
    dropping_a_held_lease_releases_it,
    shutdown_releases_everything_and_refuses_more,
    bad_timing_is_rejected_before_anything_is_acquired,
    renew_many_reports_each_lease_it_did_not_renew,
    a_held_lease_moved_into_a_spawned_task_sees_its_loss,
];
