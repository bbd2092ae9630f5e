//! Failover: a primary with a streaming standby (`pglease_formations::Replicated`),
//! the primary killed hard (every process SIGKILLed) under a load of
//! acquisitions from six clients, the standby promoted.
//!
//! With a synchronous standby no acknowledged acquisition may be lost and
//! no token issued again, also when `synchronous_commit` is weakened by
//! the server or by the session (acquisitions raise it for themselves).
//! With an asynchronous standby that has fallen behind, acknowledged
//! acquisitions are lost (the same checks count them) but no token is
//! issued again (tests/it/timeline.rs has the holder's side).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{
    handed_over_on_release, held_write, migrate_with_data_table, renewed_without_loss,
    token_and_value,
};
use pglease::doctor::Verdict;
use pglease::{AcquireOptions, Error, LeaseManager, LossReason, ManagerOptions, sqlx};
use pglease_formations::{Forwarder, Replicated, SetupError, Standby, Target};
use sqlx::postgres::PgPoolOptions;

const CLIENTS: usize = 6;
const NAMES: usize = 5;
/// Acknowledged acquisitions to wait for before the crash.
const BEFORE_CRASH: usize = 150;

/// How commits are weakened during the load.
#[derive(Debug, Clone, Copy)]
enum Weakened {
    Not,
    /// `ALTER SYSTEM SET synchronous_commit` on the primary.
    ByServer(&'static str),
    /// `SET synchronous_commit` on every connection of the clients.
    BySession(&'static str),
}

/// What the promoted server kept of the acquisitions acknowledged before
/// the crash.
#[derive(Debug, Default)]
struct Report {
    acknowledged: usize,
    highest: i64,
    /// (name, acknowledged token, the promoted server's token).
    lost: Vec<(String, i64, Option<i64>)>,
    /// (name, token) acquired after the failover with a token not above
    /// every acknowledged one.
    reissued: Vec<(String, i64)>,
}

/// Runs the load, crashes the primary in the middle of it, promotes the
/// standby, and checks the promoted server against every acquisition the
/// clients were told succeeded. `behind`: the (asynchronous) standby is
/// stopped during the load and started again after the crash. `SetupError::Unavailable`
/// when no server binaries are installed.
async fn crash_under_load(
    standby: Standby,
    weakened: Weakened,
    behind: bool,
) -> Result<Report, SetupError> {
    let cluster = Replicated::start(standby).await?;
    let admin = cluster.primary().pool().await?;
    LeaseManager::new(admin.clone())
        .migrate()
        .await
        .expect("migrate on the primary");
    if let Weakened::ByServer(level) = weakened {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER SYSTEM SET synchronous_commit = '{level}'"
        )))
        .execute(&admin)
        .await
        .expect("weaken synchronous_commit on the server");
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&admin)
            .await
            .expect("reload");
    }
    admin.close().await;
    if behind {
        // Down after it has the schema, so that what it lacks once
        // promoted is the acquisitions alone.
        cluster.wait_for_replay().await?;
        cluster.stop_standby(true)?;
    }

    let session_level = match weakened {
        Weakened::BySession(level) => Some(level),
        _ => None,
    };
    let pool = PgPoolOptions::new()
        .max_connections(CLIENTS as u32)
        .acquire_timeout(Duration::from_secs(5))
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if let Some(level) = session_level {
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "SET synchronous_commit = '{level}'"
                    )))
                    .execute(conn)
                    .await?;
                }
                Ok(())
            })
        })
        .connect_with(cluster.primary().options())
        .await
        .expect("the clients' pool");
    let leases = LeaseManager::new(pool);

    // Each client acquires and releases leases on a few shared names and
    // records every acquisition the database acknowledged.
    let acknowledged: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let count = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let (leases, acknowledged, count, stop) = (
            leases.clone(),
            acknowledged.clone(),
            count.clone(),
            stop.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut round = client;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let name = format!("job-{}", round % NAMES);
                match leases
                    .acquire(
                        &name,
                        AcquireOptions::ttl(Duration::from_secs(60)).holder(format!("c{client}")),
                    )
                    .await
                {
                    Ok(lease) => {
                        acknowledged
                            .lock()
                            .expect("record")
                            .push((name, lease.token().get()));
                        count.fetch_add(1, Ordering::Relaxed);
                        let _ = leases.release(&lease).await;
                    }
                    Err(Error::Held { .. }) => {}
                    // The primary is gone: stop.
                    Err(_) => break,
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while count.load(Ordering::Relaxed) < BEFORE_CRASH {
        assert!(
            Instant::now() < deadline,
            "only {} acquisitions acknowledged in 60 s",
            count.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.crash_primary()?;
    if behind {
        cluster.stop_standby(false)?;
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.expect("a client task");
    }
    leases.pool().close().await;
    cluster.promote().await?;

    let acknowledged = std::mem::take(&mut *acknowledged.lock().expect("records"));
    let distinct: HashSet<i64> = acknowledged.iter().map(|(_, token)| *token).collect();
    assert_eq!(
        distinct.len(),
        acknowledged.len(),
        "{weakened:?}: one token was acknowledged to two acquisitions"
    );
    let mut latest: BTreeMap<String, i64> = BTreeMap::new();
    for (name, token) in &acknowledged {
        let entry = latest.entry(name.clone()).or_default();
        *entry = (*entry).max(*token);
    }
    let mut report = Report {
        acknowledged: acknowledged.len(),
        highest: *latest.values().max().expect("acquisitions"),
        ..Report::default()
    };

    let promoted = cluster.standby().pool().await?;
    for (name, token) in &latest {
        let found: Option<i64> =
            sqlx::query_scalar("SELECT token FROM pglease.leases WHERE name = $1")
                .bind(name)
                .fetch_optional(&promoted)
                .await
                .expect("read the promoted server");
        if found.is_none_or(|found| found < *token) {
            report.lost.push((name.clone(), *token, found));
        }
    }
    // Tokens come from one sequence for all names: the next acquisitions
    // on the promoted server (of new names; the old ones may still be
    // held) must get tokens above every acknowledged one.
    let after = LeaseManager::new(promoted);
    for name in latest.keys() {
        let name = format!("after-{name}");
        let lease = tokio::time::timeout(
            Duration::from_secs(30),
            after.acquire(
                &name,
                AcquireOptions::ttl(Duration::from_secs(60)).holder("after"),
            ),
        )
        .await
        .expect("the promoted server answers within 30 s")
        .expect("acquire on the promoted server");
        if lease.token().get() <= report.highest {
            report.reissued.push((name, lease.token().get()));
        }
    }
    eprintln!("{standby:?}, {weakened:?}, behind: {behind}: {report:?}");
    Ok(report)
}

/// Nothing lost, nothing issued again.
async fn nothing_lost(weakened: Weakened) -> Result<(), SetupError> {
    let report = crash_under_load(Standby::Synchronous, weakened, false).await?;
    assert!(report.acknowledged >= BEFORE_CRASH);
    assert!(
        report.lost.is_empty() && report.reissued.is_empty(),
        "{weakened:?}: acknowledged acquisitions lost in the failover: {report:?}"
    );
    Ok(())
}

async fn a_synchronous_standby_keeps_every_acknowledged_acquisition() -> Result<(), SetupError> {
    nothing_lost(Weakened::Not).await
}

async fn also_when_the_server_commits_locally_only() -> Result<(), SetupError> {
    nothing_lost(Weakened::ByServer("local")).await
}

async fn also_when_the_session_turns_synchronous_commit_off() -> Result<(), SetupError> {
    nothing_lost(Weakened::BySession("off")).await
}

/// The same checks see what an asynchronous standby that has fallen
/// behind loses: the acquisitions made while it was down (the price of
/// asynchronous replication, counted). None of their tokens is issued
/// again: the promoted server moves the fence past them.
async fn an_asynchronous_standby_behind_loses_acquisitions_but_never_reissues_a_token()
-> Result<(), SetupError> {
    let report = crash_under_load(Standby::Asynchronous, Weakened::Not, true).await?;
    assert!(!report.lost.is_empty(), "the loss went unseen: {report:?}");
    assert!(
        report.reissued.is_empty(),
        "tokens issued again: {report:?}"
    );
    eprintln!(
        "{} of {} names' latest acknowledged acquisitions lost; none reissued",
        report.lost.len(),
        NAMES
    );
    Ok(())
}

/// A manager that reaches the pair through `endpoint`, with the schema
/// and a one-row data table in place on the primary (and so on the
/// standby), and pglease's pool settings with a short connect timeout.
async fn through(
    endpoint: &Forwarder,
    cluster: &Replicated,
    options: ManagerOptions,
) -> Result<LeaseManager, SetupError> {
    let admin = cluster.primary().pool().await?;
    migrate_with_data_table(&admin).await;
    admin.close().await;
    let pool = pglease::connect::pool_options()
        .acquire_timeout(Duration::from_secs(1))
        .connect_lazy_with(endpoint.options());
    Ok(LeaseManager::with_options(pool, options).expect("valid options"))
}

/// Behind a stable endpoint, a held lease rides out a failover that
/// completes within its TTL: its renewals fail while there is no primary,
/// resume on the promoted standby before the local deadline, and the lease
/// is never reported lost; its token is unchanged and fenced writes under
/// it commit on the new primary.
async fn a_held_lease_survives_a_failover_behind_a_stable_endpoint() -> Result<(), SetupError> {
    let cluster = Replicated::start(Standby::Synchronous).await?;
    let endpoint = Forwarder::start(Target::port(cluster.primary().port())).await?;
    let leases = through(&endpoint, &cluster, ManagerOptions::default()).await?;
    let held = leases
        // Renewed every 3.3 s: the failover below (a failed renewal, the
        // promotion, a retry) fits before the local deadline with seconds
        // to spare on a loaded machine.
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_secs(10)).holder("A"),
        )
        .await
        .expect("hold");
    held_write(&held, "before")
        .await
        .expect("write before the failover");

    let crashed = Instant::now();
    let renewed_before = leases.stats().leases_renewed;
    let failures_before = leases.stats().renewal_failures;
    cluster.crash_primary()?;
    // Wait until a renewal has failed, then fail over.
    let deadline = Instant::now() + Duration::from_secs(10);
    while leases.stats().renewal_failures == failures_before {
        assert!(
            Instant::now() < deadline,
            "no renewal failed without a primary"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cluster.promote().await?;
    endpoint.repoint(Target::port(cluster.standby().port()));
    let promoted = crashed.elapsed();
    renewed_without_loss(&leases, &held, renewed_before, Duration::from_secs(10)).await;
    let resumed = crashed.elapsed();
    assert!(!held.is_lost(), "{:?}", held.loss_reason());
    held_write(&held, "after")
        .await
        .expect("write on the promoted standby");
    let (token, value) = token_and_value(&cluster.standby().pool().await?, "job").await;
    assert_eq!(token, held.token().get());
    assert_eq!(value, "after");
    eprintln!(
        "primary killed; standby promoted and endpoint re-pointed after {promoted:?}; \
         first renewal confirmed there after {resumed:?}; lease never lost"
    );
    // Nobody else got it meanwhile; once released, the next holder gets it
    // at once, with a larger token.
    let other = LeaseManager::new(cluster.standby().pool().await?);
    handed_over_on_release(&other, held).await;
    Ok(())
}

/// When no primary comes back in time, the holder is told the lease is
/// unreachable by its local deadline, before the database's expiry.
async fn a_failover_too_late_ends_the_lease_as_unreachable_before_its_expiry()
-> Result<(), SetupError> {
    let cluster = Replicated::start(Standby::Synchronous).await?;
    let endpoint = Forwarder::start(Target::port(cluster.primary().port())).await?;
    // A margin of 300 ms: the loss fires that much before the database's
    // expiry, which a busy machine's timer delays cannot eat up.
    let options = ManagerOptions::default().safety_margin(Duration::from_millis(300));
    let leases = through(&endpoint, &cluster, options).await?;
    let held = leases
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_secs(2)).holder("A"),
        )
        .await
        .expect("hold");
    cluster.crash_primary()?;
    let reason = tokio::time::timeout(Duration::from_secs(5), held.lost())
        .await
        .expect("the loss is signalled within a TTL");
    let lost_at = chrono::Utc::now();
    assert!(
        matches!(reason, LossReason::Unreachable { .. }),
        "{reason:?}"
    );
    // The database's expiry (same machine, same clock) is still ahead:
    // the holder stopped before anyone else could take over.
    assert!(
        lost_at < held.expires_at(),
        "lost at {lost_at}, after the database expiry {}",
        held.expires_at()
    );
    eprintln!(
        "lost as unreachable {} ms before the database expiry",
        (held.expires_at() - lost_at).num_milliseconds()
    );
    // The standby, promoted now, holds the lease until that expiry and
    // then lets another holder in.
    cluster.promote().await?;
    endpoint.repoint(Target::port(cluster.standby().port()));
    let other = LeaseManager::new(cluster.standby().pool().await?);
    let taken = tokio::time::timeout(
        Duration::from_secs(10),
        other.acquire(
            "job",
            AcquireOptions::ttl(Duration::from_secs(60))
                .holder("B")
                .wait(Duration::from_secs(8)),
        ),
    )
    .await
    .expect("B acquires within 10 s")
    .expect("B acquires");
    assert!(taken.token() > held.token());
    // A's writes are refused: locally, and by the database.
    assert!(matches!(held.begin_fenced().await, Err(Error::Lost { .. })));
    assert!(matches!(
        other.begin_fenced(&held).await,
        Err(Error::NotHeld { .. })
    ));
    Ok(())
}

/// `doctor` warns of an asynchronous standby and explains the grant
/// delay (and, on these test clusters, flags `fsync = off`), and passes the
/// replication check of a synchronous one.
async fn doctor_flags_an_asynchronous_standby_and_passes_a_synchronous_one()
-> Result<(), SetupError> {
    for (standby, expected) in [
        (Standby::Asynchronous, Verdict::Warning),
        (Standby::Synchronous, Verdict::Ok),
    ] {
        let cluster = Replicated::start(standby).await?;
        let leases = LeaseManager::new(cluster.primary().pool().await?);
        leases.migrate().await.expect("migrate");
        let diagnosis = leases
            .admin()
            .doctor(&pglease::doctor::DoctorOptions::default())
            .await
            .expect("doctor");
        let verdict = |name: &str| {
            diagnosis
                .checks
                .iter()
                .find(|c| c.name == name)
                .map(|c| (c.verdict, c.detail.clone()))
                .unwrap_or_else(|| panic!("no {name} check"))
        };
        let (replication, detail) = verdict("replication");
        assert_eq!(replication, expected, "{standby:?}: {detail}");
        if standby == Standby::Asynchronous {
            assert!(
                detail.contains("no token is ever issued twice")
                    && detail.contains("grant delay")
                    && detail.contains("none is set now"),
                "{detail}"
            );
        }
        assert_eq!(
            verdict("durability").0,
            Verdict::Problem,
            "fsync is off here"
        );
        assert_eq!(diagnosis.verdict(), Verdict::Problem);
        eprintln!("{standby:?}: {detail}");
    }
    Ok(())
}

pglease_formations::tests![
    a_synchronous_standby_keeps_every_acknowledged_acquisition(2),
    also_when_the_server_commits_locally_only(2),
    also_when_the_session_turns_synchronous_commit_off(2),
    an_asynchronous_standby_behind_loses_acquisitions_but_never_reissues_a_token(2),
    a_held_lease_survives_a_failover_behind_a_stable_endpoint(2),
    a_failover_too_late_ends_the_lease_as_unreachable_before_its_expiry(2),
    doctor_flags_an_asynchronous_standby_and_passes_a_synchronous_one(2),
];
