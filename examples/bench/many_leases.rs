//! `BENCH_ONLY=p2b`, P2b: one manager holds 100,000 leases (TTL 60 s,
//! renewed every 20 s) for two renewal periods. Reported: renewal
//! statements and leases renewed per period, the server time of one
//! renewal statement (from pg_stat_user_functions), this process's CPU per
//! period (the manager and its renewal task; nothing else runs meanwhile),
//! and 1,000 failed acquisitions of held names: transactions given an id,
//! tokens drawn (the WAL of their own is nil without an id; the server's
//! WAL meanwhile counts the renewals).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pglease::{AcquireOptions, Error, HeldLease, LeaseManager};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

use crate::shared::Bench;
use crate::shared::database::{drop_database, fresh_database, server};
use crate::shared::timing::process_cpu;

const TTL: Duration = Duration::from_secs(60);
const NAME: &str = "pglease_bench_p2b";

pub(crate) async fn run(_: &Bench) -> Result<(), Error> {
    // BENCH_LEASES: another number of leases (default 100,000).
    let leases: usize = std::env::var("BENCH_LEASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let (pool, tracked) = open().await?;
    let m = LeaseManager::new(pool.clone());
    let held = hold_all(&m, leases).await?;
    renewal_periods(&pool, &m, &held).await?;
    if tracked {
        renewal_server_time(&pool).await?;
    }
    failed_acquisitions(&pool, leases).await?;
    drop(held);
    m.shutdown().await?;
    pool.close().await;
    drop_database(NAME).await
}

/// The measure's own database, with the schema; and whether its
/// functions' server time is tracked (where this role may turn it on).
async fn open() -> Result<(PgPool, bool), Error> {
    let pool = fresh_database(NAME, 16).await?;
    let m = LeaseManager::new(pool.clone());
    m.migrate().await?;
    // Server time per function call, where this role may turn it on.
    let tracked = sqlx::query(AssertSqlSafe(format!(
        "ALTER DATABASE {NAME} SET track_functions = 'pl'"
    )))
    .execute(&pool)
    .await
    .is_ok();
    pool.close().await;
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_with(server().await?.database(NAME))
        .await?;
    Ok((pool, tracked))
}

/// `leases` leases held through `m`, acquired by 16 tasks.
async fn hold_all(m: &LeaseManager, leases: usize) -> Result<Vec<HeldLease>, Error> {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (m, next) = (m.clone(), next.clone());
            tokio::spawn(async move {
                let mut held = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= leases {
                        return Ok::<_, Error>(held);
                    }
                    held.push(
                        m.hold(
                            &format!("p2b-{i}"),
                            AcquireOptions::ttl(TTL).holder("bench"),
                        )
                        .await?,
                    );
                }
            })
        })
        .collect();
    let mut held = Vec::with_capacity(leases);
    for task in tasks {
        held.extend(task.await.expect("holder task")?);
    }
    println!(
        "\nMany leases: one manager holds {leases} (TTL 60 s, renewed every 20 s); \
         acquired in {:.1} s by 16 tasks",
        started.elapsed().as_secs_f64()
    );
    Ok(held)
}

/// Two full renewal periods from now: what the renewals did and what
/// they cost this process.
async fn renewal_periods(pool: &PgPool, m: &LeaseManager, held: &[HeldLease]) -> Result<(), Error> {
    sqlx::query("SELECT pg_stat_reset()")
        .execute(pool)
        .await
        .ok();
    let (stats, cpu, at) = (m.stats(), process_cpu(), Instant::now());
    let window = Duration::from_secs(40);
    tokio::time::sleep(window).await;
    let (after, cpu_after, took) = (m.stats(), process_cpu(), at.elapsed());
    let periods = took.as_secs_f64() / 20.0;
    let statements = after.renewal_statements - stats.renewal_statements;
    let renewed = after.leases_renewed - stats.leases_renewed;
    let lost = held.iter().filter(|h| h.is_lost()).count();
    println!(
        "| per renewal period (20 s) | value |\n|---|---:|\n\
         | renewal statements | {:.1} (at most {} leases each) |\n\
         | leases renewed | {:.0} |\n\
         | client CPU (this process) | {:.0} ms ({:.2} % of one core) |\n\
         | renewal failures, leases lost | {}, {lost} |",
        statements as f64 / periods,
        5000,
        renewed as f64 / periods,
        (cpu_after - cpu).as_secs_f64() * 1e3 / periods,
        (cpu_after - cpu).as_secs_f64() * 100.0 / took.as_secs_f64(),
        after.renewal_failures - stats.renewal_failures,
    );
    Ok(())
}

/// The mean server time of one renewal statement, from
/// pg_stat_user_functions.
async fn renewal_server_time(pool: &PgPool) -> Result<(), Error> {
    let row: Option<(i64, f64)> = sqlx::query_as(
        "SELECT calls, total_time FROM pg_stat_user_functions \
          WHERE schemaname = 'pglease' AND funcname = 'renew_many'",
    )
    .fetch_optional(pool)
    .await?;
    if let Some((calls, total)) = row.filter(|(calls, _)| *calls > 0) {
        println!(
            "| server time of one renewal statement | {:.1} ms (mean of {calls}) |",
            total / calls as f64
        );
    }
    Ok(())
}

/// 1,000 failed acquisitions of held names: how many were given a
/// transaction id, and how many tokens they drew.
async fn failed_acquisitions(pool: &PgPool, leases: usize) -> Result<(), Error> {
    let other = LeaseManager::new(pool.clone());
    let token: i64 = sqlx::query_scalar("SELECT last_value FROM pglease.fence_seq")
        .fetch_one(pool)
        .await?;
    let mut with_xid = 0;
    let mut conn = pool.acquire().await?;
    for i in 0..1000 {
        sqlx::query("BEGIN").execute(&mut *conn).await?;
        let row: (Option<i64>, bool) = sqlx::query_as(
            "SELECT token, pg_current_xact_id_if_assigned() IS NOT NULL \
               FROM pglease.acquire($1, 'other', '1 min')",
        )
        .bind(format!("p2b-{}", i * 97 % leases))
        .fetch_one(&mut *conn)
        .await?;
        sqlx::query("COMMIT").execute(&mut *conn).await?;
        assert!(row.0.is_none(), "a held lease was acquired");
        with_xid += usize::from(row.1);
    }
    drop(conn);
    let token_after: i64 = sqlx::query_scalar("SELECT last_value FROM pglease.fence_seq")
        .fetch_one(pool)
        .await?;
    let refused = other
        .acquire("p2b-1", AcquireOptions::ttl(TTL).holder("other"))
        .await;
    assert!(matches!(refused, Err(Error::Held { .. })));
    println!(
        "| 1,000 failed acquisitions of held names | {with_xid} given a transaction id \
         (none: no WAL record of their own, no commit flush), {} tokens drawn |",
        token_after - token
    );
    Ok(())
}
