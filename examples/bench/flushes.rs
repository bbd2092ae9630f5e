//! `BENCH_ONLY=flushes`: what durable renewals cost. A manager holding
//! 1,000 leases (TTL 3 s, so renewed every second) for 10 s on a database
//! whose sessions run with `synchronous_commit = off`, as services set it
//! for throughput. Renewals raise it to `on` for their own transaction (an
//! acknowledged renewal must survive a crash), so each renewal statement
//! is one commit that waits for its WAL flush: counted per renewal period,
//! beside the server's WAL flushes (`pg_stat_wal.wal_sync`, PostgreSQL 14
//! to 17) with and without the leases held.

use std::time::{Duration, Instant};

use pglease::{AcquireOptions, Error, LeaseManager};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

use crate::shared::Bench;
use crate::shared::database::{drop_database, fresh_database, server};

const NAME: &str = "pglease_bench_flushes";
const LEASES: usize = 1_000;
const TTL: Duration = Duration::from_secs(3);
const WINDOW: Duration = Duration::from_secs(10);

pub(crate) async fn run(_: &Bench) -> Result<(), Error> {
    let pool = open().await?;
    let m = LeaseManager::new(pool.clone());
    let syncs = || async {
        sqlx::query_scalar::<_, i64>("SELECT wal_sync FROM pg_stat_wal")
            .fetch_one(&pool)
            .await
    };
    // The server's own flushes, nothing held: the baseline.
    sqlx::raw_sql("VACUUM ANALYZE").execute(&pool).await?;
    sqlx::raw_sql("CHECKPOINT").execute(&pool).await?;
    let idle = syncs().await?;
    tokio::time::sleep(WINDOW).await;
    let idle = syncs().await? - idle;
    let mut held = Vec::with_capacity(LEASES);
    for i in 0..LEASES {
        held.push(
            m.hold(
                &format!("flush-{i}"),
                AcquireOptions::ttl(TTL).holder("bench"),
            )
            .await?,
        );
    }
    // The acquisitions' dead rows vacuumed now rather than by autovacuum
    // in the window; from the next renewal on.
    sqlx::raw_sql("VACUUM ANALYZE").execute(&pool).await?;
    next_renewal(&m).await?;
    let (statements, renewed, synced) = (
        m.stats().renewal_statements,
        m.stats().leases_renewed,
        syncs().await?,
    );
    tokio::time::sleep(WINDOW).await;
    let statements = m.stats().renewal_statements - statements;
    let renewed = m.stats().leases_renewed - renewed;
    let synced = syncs().await? - synced;
    let periods = WINDOW.as_secs_f64() / (TTL.as_secs_f64() / 3.0);
    println!(
        "durable renewals: {LEASES} leases held (TTL {TTL:?}, renewed every {:?}) for \
         {WINDOW:?} at synchronous_commit = off: {statements} renewal statements ({:.1} per \
         renewal period), each one commit that waits for its WAL flush, renewed {renewed} \
         leases; one statement per lease would be {LEASES} such commits per period. The server \
         made {synced} WAL flushes in all (pg_stat_wal.wal_sync, the WAL writer's included, \
         which flushes asynchronous commits too), {idle} in the same time with nothing held",
        TTL / 3,
        statements as f64 / periods
    );
    drop(held);
    m.shutdown().await?;
    pool.close().await;
    drop_database(NAME).await
}

/// The measure's own database, with the schema, its sessions at
/// `synchronous_commit = off`.
async fn open() -> Result<PgPool, Error> {
    let pool = fresh_database(NAME, 4).await?;
    LeaseManager::new(pool.clone()).migrate().await?;
    sqlx::query(AssertSqlSafe(format!(
        "ALTER DATABASE {NAME} SET synchronous_commit = off"
    )))
    .execute(&pool)
    .await?;
    pool.close().await;
    Ok(PgPoolOptions::new()
        .max_connections(4)
        .connect_with(server().await?.database(NAME))
        .await?)
}

/// Returns once `m` sent its next renewal statement (within ten TTLs).
async fn next_renewal(m: &LeaseManager) -> Result<(), Error> {
    let first = m.stats().renewal_statements;
    let deadline = Instant::now() + TTL * 10;
    while m.stats().renewal_statements == first {
        if Instant::now() > deadline {
            return Err(Error::Database(sqlx::Error::Configuration(
                "no renewal within ten TTLs".into(),
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}
