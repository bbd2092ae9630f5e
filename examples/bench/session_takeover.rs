//! `BENCH_ONLY=p4c`, P4c: a session-bound holder's server session is
//! terminated while a waiter waits; from the `pg_terminate_backend` call
//! to the waiter holding the lease, beside an advisory-lock waiter blocked
//! on a session lock whose holder's session is terminated the same way
//! (alternated, round by round). The lease's TTL is an hour: only the
//! session's end can free it.

use std::time::{Duration, Instant};

use pglease::{AcquireOptions, Error, LeaseManager};
use sqlx::{Connection, PgPool};

use crate::shared::Bench;
use crate::shared::ops::LONG;
use crate::shared::timing::{median, ms};
use crate::shared::waiters::{advisory_waiter, waiting_acquirer};

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    const ROUNDS: usize = 15;
    let pool = &bench.pool;
    let holder = LeaseManager::new(pool.clone());
    let waiter = LeaseManager::new(pool.clone());
    let (mut leases, mut advisory) = (Vec::new(), Vec::new());
    // Attempts the waiter made after its first, round by round.
    let mut attempts_after = Vec::new();
    for round in 0..ROUNDS {
        let (took, attempts) = lease_round(pool, &holder, &waiter, round).await?;
        leases.push(took);
        attempts_after.push(attempts);
        advisory.push(advisory_round(pool, round).await?);
    }
    let worst = |v: &[Duration]| v.iter().max().copied().unwrap_or_default();
    println!(
        "\nP4c: the holder's server session terminated while a waiter waits, until the \
         waiter holds ({ROUNDS} rounds each, alternated; the lease's TTL is 1 h)\n\n\
         | waiter | median | worst |\n|---|---:|---:|\n\
         | pglease, session-bound lease | {:.1} ms | {:.1} ms |\n\
         | advisory lock (pg_advisory_lock, no token) | {:.1} ms | {:.1} ms |\n\
         ratio of medians (pglease / advisory): {:.2}; the waiter's attempts after its \
         first, by round: {attempts_after:?}",
        ms(median(&leases)),
        ms(worst(&leases)),
        ms(median(&advisory)),
        ms(worst(&advisory)),
        median(&leases).as_secs_f64() / median(&advisory).as_secs_f64(),
    );
    Ok(())
}

/// pglease: the holder's manager opens a new session for each round (the
/// last one was terminated). From the termination to the waiter holding
/// the lease, and the attempts the waiter made after its first.
async fn lease_round(
    pool: &PgPool,
    holder: &LeaseManager,
    waiter: &LeaseManager,
    round: usize,
) -> Result<(Duration, u64), Error> {
    let name = format!("p4c-{round}");
    let held = holder
        .acquire(
            &name,
            AcquireOptions::ttl(LONG)
                .holder("holder")
                .session_bound(true),
        )
        .await?;
    let pid = holder
        .inspect(&name)
        .await?
        .holder_session
        .expect("a session-bound lease");
    let (task, attempts) = waiting_acquirer(waiter, &name).await;
    let ended = Instant::now();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(pool)
        .await?;
    let (got, at) = task.await.expect("waiter task");
    let got = got?;
    assert!(got.token() > held.token());
    let attempts_after = waiter.stats().acquire_attempts - attempts - 1;
    waiter.release(&got).await?;
    Ok((at - ended, attempts_after))
}

/// The advisory lock: one session holds it, another blocks on it; from
/// the holder's termination to the other's lock.
async fn advisory_round(pool: &PgPool, round: usize) -> Result<Duration, Error> {
    let key = 0x7034_6300_i64 + round as i64;
    let (holding, pid, task) = advisory_waiter(pool, key).await?;
    let ended = Instant::now();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(pool)
        .await?;
    let (at, blocked) = task.await.expect("advisory waiter")?;
    drop(holding);
    blocked.close().await?;
    Ok(at - ended)
}
