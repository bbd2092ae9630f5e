//! `BENCH_ONLY=sql`, the SQL-level benchmark (P1 at the SQL level): each
//! script pair of `bench/pgbench/` (`raw_*.sql`, `lease_*.sql`, and the
//! raw script's floor twin) run by pgbench, alternated, at 1 and 8
//! clients on 1 and 1,000 names, with prepared statements on both sides
//! and the session's default durability. Prints each round's ratio
//! (pglease tps / floor tps) and their median, and the medians of pglease
//! / raw and floor / raw; then the uncommon paths
//! ([`crate::uncommon_paths`]). `BENCH_SQL_PAIRS=raw_cycle,raw_write`
//! runs only the rows with those raw scripts (`uncommon`: the uncommon
//! paths).

use pglease::Error;
use sqlx::postgres::PgPoolOptions;

use crate::shared::Bench;
use crate::shared::database::{drop_database, found, pgbench_database};
use crate::shared::pairs::{PAIRS, Pair, ROWS};
use crate::shared::pgbench::{self, Pgbench, three_way};
use crate::shared::timing::bench_rounds;

const DB: &str = "pglease_bench_sql";

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let secs = bench.secs;
    let binary = pgbench::find()?;
    let rounds = bench_rounds(3);
    let pool = pgbench_database(DB, 2).await?;
    let pgbench = Pgbench::on(binary, &pool, DB).await?;
    pool.close().await;
    let url = found().await?.url(DB);
    println!(
        "SQL level (pgbench, prepared statements, {secs} s per run, {rounds} rounds alternated, \
         each raw, floor, pglease): pglease tps / floor tps and pglease tps / raw tps, the \
         median of the rounds' ratios\n"
    );
    println!(
        "| operation | clients | names | raw tps | floor tps | pglease tps | pglease / floor per round | pglease / floor | pglease / raw | floor / raw |\n\
         |---|---:|---:|---:|---:|---:|---|---:|---:|---:|"
    );
    // BENCH_SQL_PAIRS=raw_cycle,raw_write: only the rows with those raw
    // scripts.
    let wanted = std::env::var("BENCH_SQL_PAIRS").unwrap_or_default();
    let wants = |what: &str| wanted.is_empty() || wanted.split(',').any(|w| w == what);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await?;
    for pair in PAIRS.iter().filter(|pair| wants(pair.raw)) {
        let watcher = pair.prepare(&pool, &url).await?;
        for (clients, names) in ROWS {
            three_way_row(&pgbench, pair, clients, names as u32, secs, rounds)?;
        }
        watcher.stop();
    }
    if wants("uncommon") {
        crate::uncommon_paths::run(&pool, &pgbench, secs, rounds).await?;
    }
    pool.close().await;
    drop_database(DB).await
}

/// One row of the table: `rounds` rounds of the raw script, its floor
/// twin and pglease's, in this order.
fn three_way_row(
    pgbench: &Pgbench,
    pair: &Pair,
    clients: usize,
    names: u32,
    secs: f64,
    rounds: usize,
) -> Result<(), Error> {
    let run = |script: &str| pgbench.tps(script, clients, names, secs);
    let mut rounds_tps = Vec::new();
    for _ in 0..rounds {
        rounds_tps.push([run(pair.raw)?, run(pair.floor)?, run(pair.lease)?]);
    }
    println!(
        "| {} | {clients} | {names} | {} |",
        pair.label,
        three_way(&rounds_tps)
    );
    Ok(())
}
