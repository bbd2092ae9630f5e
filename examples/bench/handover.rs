//! `BENCH_ONLY=p3` (also in the full run), P3: from an explicit release
//! to the waiting acquirer holding the lease, with NOTIFY (the waiter in
//! line: the release grants it the lease) and with polling only; beside an
//! advisory-lock waiter blocked in the server, from `pg_advisory_unlock`
//! to its lock. The release comes 100 ms after the waiter went to sleep,
//! so that a poller's backoff has started. Also how long the release call
//! itself took (its commit included): the handover after the release's
//! commit is at most the difference.

use std::time::Instant;

use pglease::{AcquireOptions, Error, LeaseManager, ManagerOptions};
use sqlx::{Connection, PgPool};

use crate::shared::Bench;
use crate::shared::ops::LONG;
use crate::shared::timing::{median, ms, percentile};
use crate::shared::waiters::{advisory_waiter, waiting_acquirer};

const ROUNDS: usize = 40;

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let pool = &bench.pool;
    println!(
        "\nHandover from the release call to the waiter holding the lease ({ROUNDS} rounds each)"
    );
    println!("| waiter | p50 ms | p99 ms | release call p50 ms |\n|---|---:|---:|---:|");
    let holder = LeaseManager::new(pool.clone());
    for (label, options) in [
        ("LISTEN/NOTIFY", ManagerOptions::default()),
        (
            "polling only (10 ms .. 1 s backoff)",
            ManagerOptions::default().notify(false),
        ),
    ] {
        let waiter = LeaseManager::with_options(pool.clone(), options)?;
        let (mut latencies, mut calls) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let name = format!("handover-{label}-{round}");
            let held = holder
                .acquire(&name, AcquireOptions::ttl(LONG).holder("holder"))
                .await?;
            let (task, _) = waiting_acquirer(&waiter, &name).await;
            let released = Instant::now();
            holder.release(&held).await?;
            calls.push(released.elapsed());
            let (got, at) = task.await.expect("waiter task");
            let lease = got?;
            latencies.push(at - released);
            waiter.release(&lease).await?;
        }
        println!(
            "| {label} | {:.2} | {:.2} | {:.2} |",
            ms(median(&latencies)),
            ms(percentile(&latencies, 0.99)),
            ms(median(&calls))
        );
    }
    advisory(pool).await
}

/// The baseline: a session lock, and a waiter blocked on it.
async fn advisory(pool: &PgPool) -> Result<(), Error> {
    let mut latencies = Vec::new();
    for round in 0..ROUNDS {
        let key = 0x7033_0000_i64 + round as i64;
        let (mut holding, _, task) = advisory_waiter(pool, key).await?;
        let released = Instant::now();
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut holding)
            .await?;
        let (at, blocked) = task.await.expect("advisory waiter")?;
        latencies.push(at - released);
        holding.close().await?;
        blocked.close().await?;
    }
    println!(
        "| advisory lock, blocked in pg_advisory_lock (no token, nothing written) | {:.2} | {:.2} | |",
        ms(median(&latencies)),
        ms(percentile(&latencies, 0.99))
    );
    Ok(())
}
