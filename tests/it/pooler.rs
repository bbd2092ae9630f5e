//! Through PgBouncer in transaction mode (the version the distribution
//! ships; 1.18 on Debian 12 has no prepared-statement support): lease
//! operations from many tasks sharing a few server sessions, background
//! renewal, waits that poll, handover and takeover, fenced writes and their
//! rejection under a stale token, concurrent migrations, the doctor's
//! finding, and an observer that polls instead of listening. Each fault case checks safety (no write under a stale token
//! commits) and liveness (the next holder gets the lease within a bound).

use std::time::{Duration, Instant};

use crate::common::{TestDb, create_data_table, data_value, fenced_write, poll_until};
use pglease::observe::Change;
use pglease::schema::MIGRATIONS_TABLE;
use pglease::{AcquireOptions, Error, LeaseManager, ManagerOptions};
use pglease_formations::{PgBouncer, SetupError};
use sqlx::postgres::{PgPool, PgPoolOptions};

/// A pool of `size` client connections through the pooler.
async fn pool(bouncer: &PgBouncer, db: &TestDb, size: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(bouncer.options(&db.options()))
        .await
        .unwrap_or_else(|e| panic!("connect through pgbouncer: {e}\n{}", bouncer.log()))
}

async fn lease_operations_from_many_tasks_share_a_few_server_sessions() -> Result<(), SetupError> {
    let db = TestDb::new().await;
    let bouncer = PgBouncer::builder().start(&db.options())?;
    create_data_table(&db).await;
    let m = LeaseManager::new(pool(&bouncer, &db, 8).await);
    let ttl = Duration::from_secs(30);
    let mut tasks = Vec::new();
    for task in 0..8 {
        let m = m.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("it's task {task} \\ \"quoted\"");
            for round in 0..20 {
                let lease = m
                    .acquire(
                        &name,
                        AcquireOptions::ttl(ttl).holder(format!("holder'{task}")),
                    )
                    .await?;
                m.renew(&lease, ttl).await?;
                let status = m.inspect(&name).await?;
                assert_eq!(status.token, Some(lease.token()));
                assert_eq!(status.holder.as_deref(), Some(lease.holder()));
                let marker = format!("{task}/{round}");
                m.fenced(&lease, async |conn| {
                    sqlx::query("UPDATE data SET value = $1 WHERE id = 1")
                        .persistent(false)
                        .bind(&marker)
                        .execute(&mut *conn)
                        .await?;
                    Ok::<_, Error>(())
                })
                .await?;
                assert!(m.release(&lease).await?);
                // Safety: the released token no longer fences a write.
                match m.begin_fenced(&lease).await {
                    Err(Error::NotHeld { .. }) => {}
                    other => panic!("a released token opened a fenced transaction: {other:?}"),
                }
            }
            Ok::<_, Error>(())
        }));
    }
    for task in tasks {
        task.await
            .expect("task")
            .expect("lease operations through pgbouncer");
    }
    assert_eq!(
        m.list(&pglease::ListFilter::default())
            .await
            .expect("list")
            .len(),
        8
    );
    assert!(data_value(&db).await.ends_with("/19"));
    assert!(
        m.admit("resource", crate::common::token(5))
            .await
            .expect("admit")
    );
    assert!(
        !m.admit("resource", crate::common::token(4))
            .await
            .expect("admit")
    );
    Ok(())
}

async fn a_held_lease_is_renewed_released_and_taken_over_through_the_pooler()
-> Result<(), SetupError> {
    let db = TestDb::new().await;
    let bouncer = PgBouncer::builder().start(&db.options())?;
    create_data_table(&db).await;
    // Each manager alone has more client connections than PgBouncer has
    // server sessions.
    let holder = LeaseManager::new(pool(&bouncer, &db, PgBouncer::DEFAULT_SERVER_POOL + 2).await);
    let waiter = LeaseManager::new(pool(&bouncer, &db, PgBouncer::DEFAULT_SERVER_POOL + 2).await);
    let ttl = Duration::from_millis(900);

    // Renewal: held across several renewal periods, never lost.
    let held = holder
        .hold("job", AcquireOptions::ttl(ttl).holder("A"))
        .await
        .expect("hold through pgbouncer");
    poll_until("three renewals", Duration::from_secs(10), || async {
        holder.stats().leases_renewed >= 3
    })
    .await;
    assert!(!held.is_lost(), "{:?}", held.loss_reason());

    // Handover on release: a waiter (polling: a LISTEN is not made
    // through a transaction pooler) gets the lease soon after.
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            waiter
                .acquire(
                    "job",
                    AcquireOptions::ttl(ttl * 2)
                        .holder("B")
                        .wait(Duration::from_secs(20)),
                )
                .await
        }
    });
    poll_until("B waits", Duration::from_secs(10), || async {
        waiter.stats().waiting == 1
    })
    .await;
    let old = held.token();
    let released = Instant::now();
    drop(held);
    let b = waiting
        .await
        .expect("waiter")
        .expect("B acquires after the release");
    let handover = released.elapsed();
    assert!(b.token() > old);
    // Liveness: the poll interval is at most 1 s.
    assert!(
        handover < Duration::from_secs(5),
        "handover took {handover:?}"
    );
    assert!(!waiter.stats().listening);
    // Safety: A's token fences nothing any more.
    assert!(matches!(
        fenced_write(&holder, "job", old, "late A").await,
        Err(Error::NotHeld { .. })
    ));
    fenced_write(&waiter, "job", b.token(), "B")
        .await
        .expect("B writes");

    // Takeover on expiry: B stops renewing (a lease acquired by hand), and
    // A, waiting, takes over within a bound after the expiry.
    let expired_at = b.expires_at();
    let a = holder
        .acquire(
            "job",
            AcquireOptions::ttl(ttl)
                .holder("A")
                .wait(Duration::from_secs(30)),
        )
        .await
        .expect("A takes over after B's lease expires");
    assert!(a.token() > b.token());
    let late = (a.acquired_at() - expired_at).to_std().unwrap_or_default();
    assert!(
        late < Duration::from_secs(5),
        "takeover {late:?} after expiry"
    );
    assert!(matches!(
        fenced_write(&waiter, "job", b.token(), "late B").await,
        Err(Error::NotHeld { .. })
    ));
    assert_eq!(data_value(&db).await, "B");
    holder.shutdown().await.expect("shutdown");
    Ok(())
}

async fn many_processes_migrate_at_once_through_the_pooler() -> Result<(), SetupError> {
    let db = TestDb::empty().await;
    let bouncer = PgBouncer::builder().start(&db.options())?;
    // Separate pools stand for separate processes starting at once.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let pool = pool(&bouncer, &db, 1).await;
        tasks.push(tokio::spawn(async move {
            LeaseManager::new(pool).migrate().await
        }));
    }
    for task in tasks {
        task.await
            .expect("task")
            .expect("migrate through pgbouncer");
    }
    let applied: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {MIGRATIONS_TABLE}"
    )))
    .fetch_one(db.pool())
    .await
    .expect("count");
    let files = std::fs::read_dir("migrations").expect("migrations").count() as i64;
    assert_eq!(applied, files);
    Ok(())
}

async fn the_doctor_reports_the_pooler() -> Result<(), SetupError> {
    let db = TestDb::new().await;
    let bouncer = PgBouncer::builder().start(&db.options())?;
    let options = ManagerOptions::default().notify(false);
    let m = LeaseManager::with_options(pool(&bouncer, &db, 4).await, options).expect("options");
    let diagnosis = m
        .admin()
        .doctor(&pglease::doctor::DoctorOptions::default())
        .await
        .expect("doctor through pgbouncer");
    let pooler = diagnosis
        .checks
        .iter()
        .find(|c| c.name == "pooler")
        .expect("a pooler check");
    assert!(
        pooler.detail.contains("share server sessions"),
        "{pooler:?}"
    );
    assert_eq!(
        diagnosis.verdict(),
        pglease::doctor::Verdict::Ok,
        "{diagnosis:#?}"
    );
    Ok(())
}

async fn an_observer_behind_the_pooler_polls_and_sees_the_changes() -> Result<(), SetupError> {
    let db = TestDb::new().await;
    let bouncer = PgBouncer::builder().start(&db.options())?;
    let options = ManagerOptions::default().max_poll_interval(Duration::from_millis(50));
    let m = LeaseManager::with_options(pool(&bouncer, &db, 4).await, options).expect("options");
    let mut observer = m.observe("obs").await.expect("observe through the pooler");
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(10), observer.next())
            .await
            .expect("a change within 10 s")
            .expect("the observer runs")
    };
    assert!(matches!(next().await, Change::Current(_)));
    // No LISTEN went through the pooler: nobody observes on the server
    // (an observer holds the shared lock; changes elsewhere take the
    // exclusive one for an instant).
    let observing: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1886154594 \
            AND mode = 'ShareLock' \
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(db.pool())
    .await
    .expect("read pg_locks");
    assert_eq!(observing, 0);
    let lease = m
        .acquire(
            "obs",
            AcquireOptions::ttl(Duration::from_secs(30)).holder("a"),
        )
        .await
        .expect("acquire");
    let token = lease.token();
    let acquired = next().await;
    assert!(
        matches!(&acquired, Change::Acquired { token: t, holder, .. } if *t == token && holder == "a"),
        "{acquired:?}"
    );
    assert!(m.release(&lease).await.expect("release"));
    assert_eq!(next().await, Change::Released { token });
    Ok(())
}

/// Prepared statements forced on through a pooler without support for
/// them: the first one that is not on its server session makes the
/// manager go back to text, that call is sent again, and every call
/// answers as it should (none fails, none is answered twice).
async fn forced_prepared_statements_fall_back_to_text_through_the_pooler() -> Result<(), SetupError>
{
    let db = TestDb::new().await;
    let bouncer = PgBouncer::builder().start(&db.options())?;
    let m = LeaseManager::with_options(
        pool(&bouncer, &db, 8).await,
        ManagerOptions::default().prepared_statements(true),
    )
    .expect("options");
    let ttl = Duration::from_secs(30);
    let mut tasks = Vec::new();
    for task in 0..8 {
        let m = m.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("prepared {task}");
            let mut last = None;
            for _ in 0..20 {
                let lease = m
                    .acquire(&name, AcquireOptions::ttl(ttl).holder("first"))
                    .await?;
                assert!(last < Some(lease.token()), "tokens increase");
                last = Some(lease.token());
                match m.acquire(&name, AcquireOptions::ttl(ttl)).await {
                    Err(Error::Held { holder, .. }) => assert_eq!(holder, "first"),
                    other => panic!("a held lease was not refused: {other:?}"),
                }
                m.renew(&lease, ttl).await?;
                assert!(m.release(&lease).await?);
                assert!(!m.release(&lease).await?);
            }
            Ok::<_, Error>(())
        }));
    }
    for task in tasks {
        task.await
            .expect("task")
            .expect("prepared calls through pgbouncer");
    }
    Ok(())
}

pglease_formations::tests![
    lease_operations_from_many_tasks_share_a_few_server_sessions(4),
    a_held_lease_is_renewed_released_and_taken_over_through_the_pooler(4),
    many_processes_migrate_at_once_through_the_pooler(4),
    the_doctor_reports_the_pooler,
    an_observer_behind_the_pooler_polls_and_sees_the_changes(2),
    forced_prepared_statements_fall_back_to_text_through_the_pooler(4),
];
