//! P6 (the full run only): a failed attempt writes no WAL and draws no
//! token. 1,000 acquisitions of a held lease, and the WAL written and the
//! tokens drawn meanwhile.

use pglease::{AcquireOptions, Error};

use crate::shared::Bench;
use crate::shared::ops::LONG;

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let (pool, m) = (&bench.pool, &bench.m);
    let wal_before: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
        .fetch_one(pool)
        .await?;
    let seq_before: i64 = sqlx::query_scalar("SELECT last_value FROM pglease.fence_seq")
        .fetch_one(pool)
        .await?;
    let attempts = 1000;
    for i in 0..attempts {
        let _ = m
            .acquire(
                "held-0",
                AcquireOptions::ttl(LONG).holder(format!("other-{i}")),
            )
            .await;
    }
    let wal_bytes: i64 =
        sqlx::query_scalar("SELECT (pg_current_wal_insert_lsn() - $1::text::pg_lsn)::bigint")
            .bind(&wal_before)
            .fetch_one(pool)
            .await?;
    let seq_after: i64 = sqlx::query_scalar("SELECT last_value FROM pglease.fence_seq")
        .fetch_one(pool)
        .await?;
    println!(
        "\n{attempts} failed attempts on a held lease: {wal_bytes} bytes of WAL in the whole \
         cluster meanwhile, {} tokens drawn",
        seq_after - seq_before
    );
    Ok(())
}
