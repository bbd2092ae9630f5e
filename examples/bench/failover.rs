//! `BENCH_ONLY=failover` (also in the full run), P4 across a failover: a
//! lease held (TTL 6 s, renewed every 2 s) through a stable endpoint; the
//! primary is killed at a random point of the renewal period, the
//! synchronous standby promoted at once and the endpoint re-pointed. Time
//! from the crash to the promotion, and to the first renewal the promoted
//! standby confirmed; a round whose promotion took too long for the TTL
//! ends with the lease lost, and is counted (with how long the promotion
//! took and how soon the holder was told) instead of timed. Then the same
//! under pg_auto_failover ([`crate::auto_failover`]).

use std::time::{Duration, Instant};

use pglease::{AcquireOptions, Error, HeldLease, LeaseManager};
use pglease_formations::{Forwarder, Replicated, Standby, Target};

use crate::shared::Bench;
use crate::shared::database::kit;

const ROUNDS: usize = 5;

/// What the rounds measured, from the crash on.
#[derive(Default)]
struct Rounds {
    promoted: Vec<Duration>,
    renewed: Vec<Duration>,
    /// The promotion's time and when the holder was told, in each round
    /// the lease was lost.
    lost: Vec<(Duration, Duration)>,
    direct_renewed: Vec<Duration>,
    direct_lost: Vec<Duration>,
}

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let mut rounds = Rounds::default();
    for round in 0..ROUNDS {
        if !one_round(round, &mut rounds).await? {
            return Ok(());
        }
    }
    print(rounds);
    crate::auto_failover::run(bench).await
}

/// One round on a replicated pair of its own; false if this machine
/// cannot start one.
async fn one_round(round: usize, rounds: &mut Rounds) -> Result<bool, Error> {
    let Some(pair) = kit("Failover", Replicated::start(Standby::Synchronous).await)? else {
        return Ok(false);
    };
    let endpoint = kit(
        "Failover",
        Forwarder::start(Target::port(pair.primary().port())).await,
    )?
    .expect("an endpoint needs nothing from the machine");
    let admin = kit("Failover", pair.primary().pool().await)?.expect("a pool");
    LeaseManager::new(admin.clone()).migrate().await?;
    admin.close().await;
    let leases = LeaseManager::new(
        pglease::connect::pool_options()
            .acquire_timeout(Duration::from_secs(1))
            .connect_lazy_with(endpoint.options()),
    );
    let held = leases
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_secs(6)).holder("bench"),
        )
        .await?;
    // Beside it, no endpoint: the URL names both servers.
    let direct = LeaseManager::connect(&format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres",
        pair.primary().port(),
        pair.standby().port()
    ))
    .await?;
    let direct_held = direct
        .hold(
            "direct",
            AcquireOptions::ttl(Duration::from_secs(6)).holder("bench"),
        )
        .await?;
    // A random point of the 2 s renewal period.
    let random =
        std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), round);
    let phase = Duration::from_millis(random % 2000);
    tokio::time::sleep(phase).await;
    let before = leases.stats().leases_renewed;
    let direct_before = direct.stats().leases_renewed;
    let crashed = Instant::now();
    kit("Failover", pair.crash_primary())?;
    kit("Failover", pair.promote().await)?;
    endpoint.repoint(Target::port(pair.standby().port()));
    let promotion = crashed.elapsed();
    rounds.promoted.push(promotion);
    match renewed_or_lost(&leases, &held, before).await {
        // Told before the database's expiry: safe, but not kept.
        Kept::Lost(at) => rounds
            .lost
            .push((promotion, at.saturating_duration_since(crashed))),
        Kept::Renewed(at) => rounds.renewed.push(at - crashed),
    }
    match renewed_or_lost(&direct, &direct_held, direct_before).await {
        Kept::Lost(at) => rounds
            .direct_lost
            .push(at.saturating_duration_since(crashed)),
        Kept::Renewed(at) => rounds.direct_renewed.push(at - crashed),
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), held.release()).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), direct_held.release()).await;
    direct.shutdown().await?;
    Ok(true)
}

/// How a held lease came through the crash.
enum Kept {
    /// Renewed since the crash: when that was seen.
    Renewed(Instant),
    /// Lost: when the holder was told.
    Lost(Instant),
}

/// Waits until `m` renewed a lease since it had renewed `before`, or
/// until `held` is lost.
async fn renewed_or_lost(m: &LeaseManager, held: &HeldLease, before: u64) -> Kept {
    loop {
        if m.stats().leases_renewed != before {
            return Kept::Renewed(Instant::now());
        }
        if let Some(at) = held.lost_at() {
            return Kept::Lost(at);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The table of the rounds, and each lost round.
fn print(mut rounds: Rounds) {
    rounds.promoted.sort();
    rounds.renewed.sort();
    rounds.direct_renewed.sort();
    let ms = |d: Duration| d.as_millis();
    let median_worst = |v: &[Duration]| match v {
        [] => "- | -".to_owned(),
        v => format!("{} ms | {} ms", ms(v[v.len() / 2]), ms(v[v.len() - 1])),
    };
    println!(
        "\nFailover, {ROUNDS} rounds: a lease held through a stable endpoint (TTL 6 s, renewed \
         every 2 s), the primary killed, the synchronous standby promoted at once\n\
         | from the crash to | median | worst |\n|---|---:|---:|\n\
         | the standby promoted, endpoint re-pointed | {} |\n\
         | the first renewal confirmed by the promoted standby ({} rounds) | {} |\n\
         | the same, no endpoint: a multi-host URL ({} rounds) | {} |",
        median_worst(&rounds.promoted),
        rounds.renewed.len(),
        median_worst(&rounds.renewed),
        rounds.direct_renewed.len(),
        median_worst(&rounds.direct_renewed),
    );
    for told in rounds.direct_lost {
        println!(
            "lost in one round (multi-host URL): the holder was told (Unreachable) {} ms after \
             the crash",
            ms(told)
        );
    }
    for (promotion, told) in rounds.lost {
        println!(
            "lost in one round: the promotion took {} ms; the holder was told (Unreachable) \
             {} ms after the crash",
            ms(promotion),
            ms(told)
        );
    }
}
