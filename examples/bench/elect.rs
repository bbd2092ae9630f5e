//! `BENCH_ONLY=elect` (also in the full run), leader election: what
//! notifying observers costs an acquire+release cycle (nobody observing,
//! every cycled name observed), the handover on `resign()`, and the
//! failover after the leader dies, beside River's and client-go's
//! defaults.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pglease::elect::{Elector, Leadership};
use pglease::{AcquireOptions, Error, LeaseManager};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::shared::Bench;
use crate::shared::database::set_history;
use crate::shared::ops::lib_cycle;
use crate::shared::timing::{median, ms, percentile, rate};

const ROUNDS: usize = 40;
const DEATHS: usize = 15;

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let pool = &bench.pool;
    observers(pool, bench.secs).await?;
    // Two candidates on managers (pools) of their own, as two replicas.
    let options = pool.connect_options().as_ref().clone();
    let replica = async || -> Result<LeaseManager, Error> {
        let pool = PgPoolOptions::new()
            .max_connections(3)
            .connect_with(options.clone())
            .await?;
        Ok(LeaseManager::new(pool))
    };
    let (a, b) = (replica().await?, replica().await?);
    let handovers = handovers(&a, &b).await?;
    let failovers = failovers(&a, &b).await?;
    println!(
        "\nLeader election, measured: handover on resign() ({ROUNDS} rounds; the follower on \
         another manager, listening), and the new term's acquisition after the dead leader's \
         expiry (TTL 1 s, {DEATHS} rounds; database clock):\n\n\
         | | p50 | p99 |\n|---|---:|---:|\n\
         | handover on resign | {:.1} ms | {:.1} ms |\n\
         | new leader after the dead leader's expiry | {:.1} ms | {:.1} ms |",
        ms(median(&handovers)),
        ms(percentile(&handovers, 0.99)),
        ms(median(&failovers)),
        ms(percentile(&failovers, 0.99)),
    );
    println!(
        "\nBeside the defaults of other electors (derived from their settings, not measured):\n\n\
         | | pglease, TTL 15 s | River (5 s elect interval, 15 s TTL) | client-go (15 s lease, 2 s retry) |\n\
         |---|---|---|---|\n\
         | handover on a clean stop | {:.0} ms (p50, measured) | at once (a resign notification) | up to 2.4 s (next retry) |\n\
         | failover after the leader dies | 10 to 15 s + {:.0} ms (the lease's remaining TTL, renewed every 5 s) | 10 to 21 s (remaining TTL, then a 5 s ± 1 s poll) | about 15 to 17.4 s (lease duration, then a retry) |",
        ms(median(&handovers)),
        ms(median(&failovers)),
    );
    a.shutdown().await?;
    b.shutdown().await?;
    Ok(())
}

/// What notifying observers costs library acquire+release cycles: nobody
/// observing against every cycled name observed, alternated.
async fn observers(pool: &PgPool, secs: f64) -> Result<(), Error> {
    println!(
        "\nNotifying observers (with the history off) on library acquire+release cycles, \
         alternated in one run:\n\n\
         | clients | nobody observes ops/s | every name observed ops/s | ratio |\n\
         |---:|---:|---:|---:|"
    );
    // The history off (its cost is the history section's), so that this
    // is what notifying costs.
    set_history(pool, false).await?;
    let m = &LeaseManager::new(pool.clone());
    for clients in [1usize, 8] {
        let (mut quiet, mut observed) = (0.0, 0.0);
        for _ in 0..2 {
            quiet += rate(clients, secs / 2.0, lib_cycle(m)).await;
            let mut readers = Vec::new();
            for c in 0..clients {
                let mut observer = m.observe(&format!("cycle-{c}")).await?;
                readers.push(tokio::spawn(async move {
                    while observer.next().await.is_ok() {}
                }));
            }
            observed += rate(clients, secs / 2.0, lib_cycle(m)).await;
            for reader in readers {
                reader.abort();
            }
        }
        println!(
            "| {clients} | {:.0} | {:.0} | {:.2} |",
            quiet / 2.0,
            observed / 2.0,
            observed / quiet
        );
    }
    set_history(pool, true).await
}

/// Handover on resign: the follower (on `b`) campaigns (and waits for
/// the release notification) when the leader (on `a`) resigns.
async fn handovers(a: &LeaseManager, b: &LeaseManager) -> Result<Vec<Duration>, Error> {
    let mut handovers = Vec::new();
    for round in 0..ROUNDS {
        let name = format!("elect-{round}");
        let how = AcquireOptions::ttl(Duration::from_secs(15));
        let leader = Arc::new(a.elector(&name, how.clone().holder("a"))?);
        let led = campaign(&leader);
        leader
            .watch_leadership()
            .wait_for(|l| matches!(l, Leadership::Leading { .. }))
            .await
            .expect("the leader leads");
        let follower = Arc::new(b.elector(&name, how.holder("b"))?);
        let follows = campaign(&follower);
        while follower.leader().is_none() || b.stats().waiting == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut leading = follower.watch_leadership();
        let resigned = Instant::now();
        leader.resign();
        leading
            .wait_for(|l| matches!(l, Leadership::Leading { .. }))
            .await
            .expect("the follower leads");
        handovers.push(resigned.elapsed());
        follower.resign();
        led.await.expect("leader task")?;
        follows.await.expect("follower task")?;
    }
    Ok(handovers)
}

/// Failover after the leader dies: its lease is acquired (on `a`) and
/// never renewed nor released (a leader that died right after a renewal,
/// the worst case); the candidate (on `b`) leads once it has expired.
async fn failovers(a: &LeaseManager, b: &LeaseManager) -> Result<Vec<Duration>, Error> {
    const TTL: Duration = Duration::from_secs(1);
    let mut failovers = Vec::new();
    for round in 0..DEATHS {
        let name = format!("death-{round}");
        let dead = a
            .acquire(&name, AcquireOptions::ttl(TTL).holder("dead"))
            .await?;
        let candidate = Arc::new(b.elector(&name, AcquireOptions::ttl(TTL).holder("b"))?);
        let runs = campaign(&candidate);
        candidate
            .watch_leadership()
            .wait_for(|l| matches!(l, Leadership::Leading { .. }))
            .await
            .expect("the candidate leads");
        let term = candidate.term().expect("a term");
        failovers.push(
            (term.lease().acquired_at() - dead.expires_at())
                .to_std()
                .unwrap_or_default(),
        );
        candidate.resign();
        runs.await.expect("candidate task")?;
    }
    Ok(failovers)
}

/// Runs `elector` on a task of its own, with work that does nothing.
fn campaign(elector: &Arc<Elector>) -> tokio::task::JoinHandle<Result<(), Error>> {
    let elector = Arc::clone(elector);
    tokio::spawn(async move { elector.run(async |_term| {}).await })
}
