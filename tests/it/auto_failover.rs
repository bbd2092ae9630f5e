//! Under a real failover manager: pg_auto_failover (`pglease_formations::AutoFailover`,
//! a monitor and two nodes with its default synchronous replication and
//! shortened timeouts), clients on the formation's multi-host URL exactly
//! as `pg_autoctl show uri` gives it, no proxy. The primary is crashed
//! (its keeper and every PostgreSQL process stopped, then killed), and the
//! monitor promotes the other node by itself.
//!
//! Safety: no acknowledged acquisition lost, no token issued twice, fenced
//! writes under the held lease commit on the new primary under the same
//! token. Liveness: the held lease is renewed on the new primary and new
//! acquisitions succeed there. The old primary, once back as a standby,
//! gets no session of pglease's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{
    checks_named, held_write, migrated_on_formation, renewed_without_loss, token_and_value,
};
use pglease::connect::Target;
use pglease::doctor::{DoctorOptions, Verdict};
use pglease::{AcquireOptions, LeaseManager, sqlx};
use pglease_formations::{AutoFailover, SetupError};

const CLIENTS: usize = 4;
const NAMES: usize = 4;
/// Marks pglease's sessions, so that the old primary can be searched for them.
const APP: &str = "pglease-under-test";

/// A held lease (TTL 30 s) and acquisitions from four clients, across an
/// automatic failover: the lease is never reported lost, keeps its token
/// and takes fenced writes on the new primary; every acquisition
/// acknowledged before the crash is on the new primary, and no token is
/// acknowledged twice. Then the old primary rejoins as a standby and no
/// session of the manager's is on it while work goes on.
async fn a_held_lease_and_acquisitions_survive_an_automatic_failover() -> Result<(), SetupError> {
    let formation = AutoFailover::start().await?;
    let url = format!("{}&application_name={APP}", formation.url());
    let old = formation.primary().await?;
    let leases = migrated_on_formation(&url, formation.node(old).port()).await;
    // Doctor looks at both hosts, knows pg_auto_failover's timing from its
    // monitor, and checks it against the TTL.
    let monitor = Target::from(formation.monitor_options());
    for (ttl, fits) in [
        (Duration::from_secs(30), Verdict::Ok),
        (Duration::from_secs(4), Verdict::Warning),
    ] {
        let diagnosis = leases
            .admin()
            .doctor(&DoctorOptions::new().ttl(ttl).monitor(monitor.clone()))
            .await
            .expect("doctor");
        let of = |name: &str| checks_named(&diagnosis, name);
        let hosts = of("host");
        assert_eq!(hosts.len(), 2, "{hosts:?}");
        assert!(hosts.iter().all(|(v, _)| *v == Verdict::Ok), "{hosts:?}");
        assert!(
            hosts.iter().any(|(_, d)| d.contains("the primary")),
            "{hosts:?}"
        );
        assert!(
            hosts.iter().any(|(_, d)| d.contains("synchronous standby")),
            "{hosts:?}"
        );
        let promotion = of("promotion");
        assert!(
            promotion.len() == 1 && promotion[0].0 == Verdict::Ok,
            "{promotion:?}"
        );
        let failover = of("failover");
        assert!(
            failover.len() == 1 && failover[0].0 == fits,
            "{ttl:?}: {failover:?}"
        );
        assert!(failover[0].1.contains("monitor"), "{failover:?}");
    }
    let held = leases
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_secs(30)).holder("A"),
        )
        .await
        .expect("hold");
    held_write(&held, "before").await.expect("write before");

    // Acquisitions and releases on a few names, each acknowledged one
    // recorded with when its attempt started.
    type Acquired = (String, i64, Instant, Instant);
    let acknowledged: Arc<Mutex<Vec<Acquired>>> = Arc::default();
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let (leases, acknowledged, errors, stop) = (
            leases.clone(),
            acknowledged.clone(),
            errors.clone(),
            stop.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut round = client;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let name = format!("load-{}", round % NAMES);
                let how = AcquireOptions::ttl(Duration::from_secs(60)).holder(format!("c{client}"));
                let started = Instant::now();
                match leases.acquire(&name, how).await {
                    Ok(lease) => {
                        acknowledged.lock().expect("record").push((
                            name,
                            lease.token().get(),
                            started,
                            Instant::now(),
                        ));
                        let _ = leases.release(&lease).await;
                    }
                    Err(pglease::Error::Held { .. }) => {}
                    Err(e) => {
                        errors.lock().expect("record").push(e.to_string());
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    let count = || acknowledged.lock().expect("count").len();
    let deadline = Instant::now() + Duration::from_secs(30);
    while count() < 100 {
        assert!(Instant::now() < deadline, "only {} acquisitions", count());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let renewed_before = leases.stats().leases_renewed;
    formation.crash(old)?;
    // From when every process of the old primary is dead.
    let crashed = Instant::now();
    let new = formation.wait_for_failover(old).await?;
    let promoted = crashed.elapsed();
    // The lease renews on the new primary (within the TTL, before the
    // local deadline), never lost meanwhile.
    renewed_without_loss(&leases, &held, renewed_before, Duration::from_secs(25)).await;
    let renewed = crashed.elapsed();
    held_write(&held, "after")
        .await
        .expect("fenced write on the new primary");
    assert_eq!(
        leases.admin().current_host(),
        Some(format!("127.0.0.1:{}", formation.node(new).port()))
    );

    // Doctor sees the old primary gone.
    let diagnosis = leases
        .admin()
        .doctor(&pglease::doctor::DoctorOptions::default())
        .await
        .expect("doctor");
    let unreachable = diagnosis
        .checks
        .iter()
        .filter(|c| c.name == "host" && c.detail.contains("unreachable"))
        .count();
    assert_eq!(unreachable, 1, "{:?}", diagnosis.checks);

    // The old primary comes back as a standby; work goes on, none of it
    // there.
    let rejoin_started = Instant::now();
    formation.rejoin(old).await?;
    let rejoined = rejoin_started.elapsed();
    let before = count();
    let deadline = Instant::now() + Duration::from_secs(20);
    while count() < before + 50 {
        assert!(
            Instant::now() < deadline,
            "acquisitions stalled after the rejoin"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let old_pool = sqlx::PgPool::connect_with(formation.node(old).options())
        .await
        .expect("connect to the old primary");
    let ours: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pglease%'",
    )
    .fetch_one(&old_pool)
    .await
    .expect("sessions on the old primary");
    let recovering: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(&old_pool)
        .await
        .expect("read the old primary");
    old_pool.close().await;
    assert!(recovering, "the old primary came back as a standby");
    assert_eq!(
        ours, 0,
        "pglease sessions on the old primary (now a standby)"
    );
    // A manager connecting afresh with the same URL, old primary listed
    // first, lands on the new one.
    let fresh = LeaseManager::connect(&url).await.expect("connect afresh");
    assert_eq!(
        fresh.admin().current_host(),
        Some(format!("127.0.0.1:{}", formation.node(new).port()))
    );
    fresh.shutdown().await.expect("shutdown");

    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.expect("client");
    }
    assert!(!held.is_lost(), "{:?}", held.loss_reason());

    // Safety, checked on the new primary.
    let new_pool = sqlx::PgPool::connect_with(formation.node(new).options())
        .await
        .expect("connect to the new primary");
    let (token, value) = token_and_value(&new_pool, "job").await;
    assert_eq!(token, held.token().get(), "the held lease kept its token");
    assert_eq!(value, "after");
    let acknowledged = acknowledged.lock().expect("read").clone();
    // The first acquisition attempted after the crash that succeeded (on
    // the new primary: the old one was dead by then).
    let first_after = acknowledged
        .iter()
        .filter(|(_, _, started, _)| *started > crashed)
        .map(|(_, _, _, acked)| *acked - crashed)
        .min()
        .expect("acquisitions after the crash");
    let mut seen = HashSet::new();
    for (name, token, _, _) in &acknowledged {
        assert!(
            seen.insert(*token),
            "token {token} acknowledged twice ({name})"
        );
    }
    // Every acknowledged acquisition is in the history the new primary has.
    let recorded: Vec<(String, i64)> = sqlx::query_as(
        "SELECT name, token FROM pglease.history WHERE event = 'acquired' AND name LIKE 'load-%'",
    )
    .fetch_all(&new_pool)
    .await
    .expect("history");
    let recorded: HashSet<(String, i64)> = recorded.into_iter().collect();
    let lost: Vec<&Acquired> = acknowledged
        .iter()
        .filter(|(name, token, _, _)| !recorded.contains(&(name.clone(), *token)))
        .collect();
    assert!(lost.is_empty(), "acknowledged but lost: {lost:?}");
    let mut highest: BTreeMap<&str, i64> = BTreeMap::new();
    for (name, token, _, _) in &acknowledged {
        let entry = highest.entry(name.as_str()).or_default();
        *entry = (*entry).max(*token);
    }
    let current: HashMap<String, i64> =
        sqlx::query_as("SELECT name, token FROM pglease.leases WHERE name LIKE 'load-%'")
            .fetch_all(&new_pool)
            .await
            .expect("leases")
            .into_iter()
            .collect();
    for (name, token) in &highest {
        assert!(
            current.get(*name).is_some_and(|c| c >= token),
            "{name}: acknowledged token {token}, the new primary has {:?}",
            current.get(*name)
        );
    }
    new_pool.close().await;
    let errors = errors.lock().expect("read").len();
    eprintln!(
        "crash -> promoted and writable {promoted:?}; first renewal confirmed {renewed:?}; \
         first acquisition there {first_after:?}; old primary rejoined in {rejoined:?}; \
         {} acquisitions acknowledged, none lost or repeated; {errors} failed attempts \
         during the failover",
        acknowledged.len()
    );
    held.release().await.expect("release");
    leases.shutdown().await.expect("shutdown");
    Ok(())
}

pglease_formations::tests![a_held_lease_and_acquisitions_survive_an_automatic_failover(
    2
),];
