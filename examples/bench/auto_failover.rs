//! The second half of `BENCH_ONLY=failover`: under pg_auto_failover
//! (`pglease_formations::AutoFailover`, its shortened timeouts). One
//! formation, the primary crashed in each round (keeper and every
//! PostgreSQL process stopped, then killed) while a manager on the
//! formation's multi-host URL holds a lease (TTL 15 s, renewed every 5 s)
//! and a client acquires and releases in a loop. Time from the crash to
//! the other node writable (the monitor's detection and promotion), to the
//! first renewal confirmed there, and to the first acquisition there; then
//! the old primary rejoins as a standby.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use pglease::{AcquireOptions, Error, LeaseManager};
use pglease_formations::AutoFailover;

use crate::shared::Bench;
use crate::shared::database::kit;
use crate::shared::timing::bench_rounds;

/// What the rounds measured, from the crash on.
#[derive(Default)]
struct Rounds {
    writable: Vec<Duration>,
    renewed: Vec<Duration>,
    acquired: Vec<Duration>,
    rejoined: Vec<Duration>,
    /// Rounds whose lease was given up before a renewal succeeded.
    lost: usize,
}

pub(crate) async fn run(_: &Bench) -> Result<(), Error> {
    let rounds = bench_rounds(6);
    let Some(formation) = kit("pg_auto_failover", AutoFailover::start().await)? else {
        return Ok(());
    };
    let url = formation.url();
    let leases = LeaseManager::connect(&url).await?;
    leases.migrate().await?;
    let mut measured = Rounds::default();
    for round in 0..rounds {
        one_round(&formation, &leases, round, &mut measured).await?;
    }
    print(&formation, rounds, measured);
    leases.shutdown().await?;
    Ok(())
}

/// One round: the primary crashed while `leases` holds a lease and a
/// client acquires in a loop, then the old primary rejoined.
async fn one_round(
    formation: &AutoFailover,
    leases: &LeaseManager,
    round: usize,
    measured: &mut Rounds,
) -> Result<(), Error> {
    let held = leases
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_secs(15)).holder("bench"),
        )
        .await?;
    let random =
        std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), round);
    tokio::time::sleep(Duration::from_millis(random % 5000)).await;
    let old = kit("pg_auto_failover", formation.primary().await)?.expect("a primary");
    let before = leases.stats().leases_renewed;
    let load = Load::start(leases.clone(), round);
    kit("pg_auto_failover", formation.crash(old))?;
    let crashed = Instant::now();
    let _ = load.crash_mark.set(crashed);
    kit("pg_auto_failover", formation.wait_for_failover(old).await)?;
    measured.writable.push(crashed.elapsed());
    loop {
        if leases.stats().leases_renewed != before {
            measured.renewed.push(crashed.elapsed());
            break;
        }
        if held.lost_at().is_some() {
            measured.lost += 1;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if let Some(at) = load.first_after_crash().await {
        measured
            .acquired
            .push(at.saturating_duration_since(crashed));
    }
    load.stop().await;
    let _ = tokio::time::timeout(Duration::from_secs(5), held.release()).await;
    let started = Instant::now();
    kit("pg_auto_failover", formation.rejoin(old).await)?;
    measured.rejoined.push(started.elapsed());
    Ok(())
}

/// A client acquiring in a loop, and the first of its acquisitions
/// attempted after the crash that succeeded.
struct Load {
    stop: Arc<AtomicBool>,
    first: Arc<Mutex<Option<Instant>>>,
    /// When the primary crashed, once it has.
    crash_mark: Arc<OnceLock<Instant>>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    /// The client's loop on a task of its own.
    fn start(client: LeaseManager, round: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let first: Arc<Mutex<Option<Instant>>> = Arc::default();
        let crash_mark: Arc<OnceLock<Instant>> = Arc::default();
        let task = {
            let (stop, first, crash_mark) = (stop.clone(), first.clone(), crash_mark.clone());
            tokio::spawn(async move {
                let mut n = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    // A name of its own each time: an acquisition whose
                    // answer was lost in the crash holds its name on the
                    // new primary until it expires.
                    n += 1;
                    let started = Instant::now();
                    let how = AcquireOptions::ttl(Duration::from_secs(5)).holder("client");
                    match client.acquire(&format!("load-{round}-{n}"), how).await {
                        Ok(lease) => {
                            let _ = client.release(&lease).await;
                            if crash_mark.get().is_some_and(|at| started > *at) {
                                first.lock().expect("first").get_or_insert(Instant::now());
                            }
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            })
        };
        Self {
            stop,
            first,
            crash_mark,
            task,
        }
    }

    /// The first acquisition attempted after the crash that succeeded,
    /// waited for up to 30 s.
    async fn first_after_crash(&self) -> Option<Instant> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(at) = *self.first.lock().expect("first") {
                return Some(at);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Ends the loop.
    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
    }
}

/// The table of the rounds, with the formation's timeouts.
fn print(formation: &AutoFailover, rounds: usize, mut measured: Rounds) {
    for v in [
        &mut measured.writable,
        &mut measured.renewed,
        &mut measured.acquired,
        &mut measured.rejoined,
    ] {
        v.sort();
    }
    let ms = |d: Duration| d.as_millis();
    let row = |v: &[Duration]| match v {
        [] => "- | - | -".to_owned(),
        v => format!(
            "{} ms | {} ms | {} ms",
            ms(v[0]),
            ms(v[v.len() / 2]),
            ms(v[v.len() - 1])
        ),
    };
    let t = formation.timeouts();
    println!(
        "\npg_auto_failover, {rounds} rounds (monitor: health_check_period {:?}, \
         health_check_timeout {:?}, max_retries {}, retry_delay {:?}, \
         node_considered_unhealthy_timeout {:?}, primary_demote_timeout {:?}; keepers: \
         network_partition_timeout {:?}): the primary crashed, a lease held on the multi-host \
         URL (TTL 15 s, renewed every 5 s), a client acquiring in a loop\n\
         | from the crash to | best | median | worst |\n|---|---:|---:|---:|\n\
         | the other node writable (detection + promotion) | {} |\n\
         | the first renewal confirmed there ({} rounds) | {} |\n\
         | the first acquisition attempted after the crash acknowledged there | {} |\n\
         | (rejoin) the old primary a secondary again, from its restart | {} |",
        t.health_check_period,
        t.health_check_timeout,
        t.health_check_max_retries,
        t.health_check_retry_delay,
        t.node_considered_unhealthy_timeout,
        t.primary_demote_timeout,
        t.network_partition_timeout,
        row(&measured.writable),
        measured.renewed.len(),
        row(&measured.renewed),
        row(&measured.acquired),
        row(&measured.rejoined),
    );
    if measured.lost > 0 {
        println!(
            "lost in {} round(s): the lease was given up before a renewal succeeded",
            measured.lost
        );
    }
}
