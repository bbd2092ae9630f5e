//! `BENCH_ONLY=fenced` (also in the full run), P1: a fenced transaction as
//! `begin_fenced` opens it (`BEGIN` and the check in one round trip)
//! against the same transaction opened in two (`BEGIN`, then
//! `assert_held`), each writing one row and committing.

use std::sync::Arc;

use pglease::{Error, Lease, LeaseManager};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::shared::Bench;
use crate::shared::ops::{RAW_UPDATE, lib_fenced};
use crate::shared::timing::{Op, alternate, op};

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    // The same, with commits that do not wait for their WAL flush: what
    // is left is the round trips and the server's work.
    let lazy_pool = PgPoolOptions::new()
        .max_connections(8)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SET synchronous_commit = off")
                    .execute(conn)
                    .await
                    .map(|_| ())
            })
        })
        .connect_with((*bench.pool.connect_options()).clone())
        .await?;
    let lazy = LeaseManager::new(lazy_pool.clone());
    println!(
        "\nOpening a fenced transaction (one UPDATE, COMMIT): BEGIN and the check in one \
         round trip vs two (BEGIN, then assert_held)\n\
         | commit | clients | two round trips ops/s | one round trip ops/s | ratio |\n\
         |---|---:|---:|---:|---:|"
    );
    for (commit, pool, m) in [
        ("flushed", &bench.pool, &bench.m),
        ("synchronous_commit = off", &lazy_pool, &lazy),
    ] {
        for clients in [1usize, 8] {
            let two = two_round_trips(pool, &bench.held);
            let one = lib_fenced(m, &bench.held, true);
            let (t, o) = alternate(clients, bench.secs, 3, two, one).await;
            println!("| {commit} | {clients} | {t:.0} | {o:.0} | {:.2} |", o / t);
        }
    }
    lazy_pool.close().await;
    Ok(())
}

/// The fenced transaction opened in two round trips: `BEGIN`, then
/// `assert_held`.
fn two_round_trips(pool: &PgPool, leases: &Arc<Vec<Lease>>) -> Op {
    let pool = pool.clone();
    let leases = leases.clone();
    op(move |c| {
        let pool = pool.clone();
        let leases = leases.clone();
        async move {
            let mut tx = pool.begin().await?;
            pglease::assert_held(&mut tx, &leases[c]).await?;
            sqlx::query(RAW_UPDATE)
                .bind(c as i32)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        }
    })
}
