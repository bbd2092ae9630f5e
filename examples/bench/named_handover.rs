//! `BENCH_ONLY=p3h`, P3-style rows for a named handover. (1) From the holder's
//! call to a successor waiting in line holding the lease: `hand_over` to
//! it, against the minimal hand-made way with the same guarantee,
//! `release` followed by the same fair waiter's acquisition (the line
//! makes it the next holder); rounds alternated, 40 each. (2) Acquire +
//! release cycles, shared against exclusive, one client on one name, and
//! eight clients on one name (shared: all hold it together) against eight
//! clients on eight names (exclusive: the most exclusive leases can
//! share); pairs alternated, `BENCH_ROUNDS` of them.

use std::time::{Duration, Instant};

use pglease::{AcquireOptions, Error, LeaseManager};
use sqlx::PgPool;

use crate::shared::Bench;
use crate::shared::ops::LONG;
use crate::shared::timing::{Op, alternate, bench_rounds, median, ms, op, percentile};

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    named_handover(&bench.pool).await?;
    shared_beside_exclusive(&bench.pool, bench.secs).await
}

/// (1): the handover to a named successor, beside a release.
async fn named_handover(pool: &PgPool) -> Result<(), Error> {
    const ROUNDS: usize = 40;
    println!(
        "\nHandover to a named successor waiting in line, from the holder's call to the \
         successor holding the lease ({ROUNDS} rounds each, alternated)"
    );
    println!("| way | p50 ms | p99 ms | call p50 ms |\n|---|---:|---:|---:|");
    let holder = LeaseManager::new(pool.clone());
    let waiter = LeaseManager::new(pool.clone());
    let (mut handed, mut released) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for round in 0..ROUNDS * 2 {
        let by_handover = round % 2 == 0;
        let (latency, call) = one_handover(&holder, &waiter, round, by_handover).await?;
        let into = if by_handover {
            &mut handed
        } else {
            &mut released
        };
        into.0.push(latency);
        into.1.push(call);
    }
    for (label, (latencies, calls)) in [
        ("hand_over to the waiting successor", &handed),
        (
            "release, then the same fair waiter's acquisition (baseline)",
            &released,
        ),
    ] {
        println!(
            "| {label} | {:.2} | {:.2} | {:.2} |",
            ms(median(latencies)),
            ms(percentile(latencies, 0.99)),
            ms(median(calls))
        );
    }
    println!(
        "handover / baseline, p50: {:.2}",
        median(&handed.0).as_secs_f64() / median(&released.0).as_secs_f64()
    );
    Ok(())
}

/// One round: `holder` holds a name, a successor on `waiter` waits for
/// it in line; from the holder's call (`hand_over`, else `release`) to the
/// successor holding it, and how long the call took.
async fn one_handover(
    holder: &LeaseManager,
    waiter: &LeaseManager,
    round: usize,
    by_handover: bool,
) -> Result<(Duration, Duration), Error> {
    let name = format!("named-{round}");
    let held = holder
        .acquire(&name, AcquireOptions::ttl(LONG).holder("holder"))
        .await?;
    let task = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let how = AcquireOptions::ttl(LONG)
                .holder("successor")
                .fair(true)
                .wait(LONG);
            let got = waiter.acquire(&name, how).await;
            (got, Instant::now())
        })
    };
    while !waiter
        .line(&name)
        .await?
        .iter()
        .any(|p| p.holder == "successor")
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let called = Instant::now();
    if by_handover {
        holder
            .hand_over(&held, "successor", LONG, pglease::WithoutSuccessor::Release)
            .await?;
    } else {
        holder.release(&held).await?;
    }
    let call = called.elapsed();
    let (got, at) = task.await.expect("successor task");
    let lease = got?;
    waiter.release(&lease).await?;
    Ok((at - called, call))
}

/// (2): shared acquire + release cycles beside exclusive ones.
async fn shared_beside_exclusive(pool: &PgPool, secs: f64) -> Result<(), Error> {
    let rounds = bench_rounds(3) as u32;
    println!(
        "\nShared beside exclusive: acquire + release cycles through the library \
         ({rounds} pairs alternated, {secs} s each)"
    );
    println!(
        "| cycle | clients | exclusive ops/s | shared ops/s | shared / exclusive |\n|---|---:|---:|---:|---:|"
    );
    let m = LeaseManager::new(pool.clone());
    for (clients, names) in [
        (1_usize, "one name"),
        (8, "exclusive: 8 names; shared: 1 name"),
    ] {
        let (exclusive, shared) = alternate(
            clients,
            secs * 2.0,
            rounds,
            cycle(&m, false),
            cycle(&m, true),
        )
        .await;
        println!(
            "| acquire + release ({names}) | {clients} | {exclusive:.0} | {shared:.0} | {:.2} |",
            shared / exclusive
        );
    }
    Ok(())
}

/// Acquire + release, shared (every client on one name) or exclusive
/// (a name per client).
fn cycle(m: &LeaseManager, shared: bool) -> Op {
    let m = m.clone();
    op(move |c| {
        let m = m.clone();
        async move {
            let name = if shared {
                "shared-bench".to_owned()
            } else {
                format!("exclusive-bench-{c}")
            };
            let how = AcquireOptions::ttl(LONG).holder("bench").shared(shared);
            let lease = m.acquire(&name, how).await?;
            m.release(&lease).await?;
            Ok(())
        }
    })
}
