//! `BENCH_ONLY=declared`, P8: what a declared session's write to a
//! protected table costs against the same write in a transaction that
//! declares its token itself with `assert_held`. pgbench, prepared
//! statements, table `data` protected by lease `held-1`; each client
//! writes a row of its own. The declared side connects with
//! `PGOPTIONS='-c pglease.name=held-1 -c pglease.token=T'`, as `pglease run
//! --declare` gives its command. Two forms: a transaction (BEGIN, [the
//! check,] the write, COMMIT) and one statement. Alternated rounds;
//! printed as declared tps / explicit tps per round and their median (at
//! least 1 / 1.1 = 0.91 meets P8: at most 1.1 x the cost).

use pglease::Error;

use crate::shared::Bench;
use crate::shared::database::{drop_database, found, held_token_offset, pgbench_database};
use crate::shared::pgbench::{self, Pgbench};
use crate::shared::timing::{bench_rounds, median_f64};

const DB: &str = "pglease_bench_declared";

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let secs = bench.secs;
    let binary = pgbench::find()?;
    let rounds = bench_rounds(3);
    let pool = pgbench_database(DB, 2).await?;
    let offset = held_token_offset(&pool, "pglease.leases").await?;
    let raw_offset = held_token_offset(&pool, "raw_leases").await?;
    sqlx::query("SELECT pglease.protect('data', 'held-1')")
        .execute(&pool)
        .await?;
    pool.close().await;
    let pgbench = Pgbench::new(binary, found().await?.url(DB), offset, raw_offset);
    let declared = [(
        "PGOPTIONS",
        format!("-c pglease.name=held-1 -c pglease.token={}", 1 + offset),
    )];
    println!(
        "\nP8, declared sessions (pgbench, prepared, {secs} s per run, {rounds} rounds \
         alternated): a write to a protected table, declared by the session vs by \
         assert_held in the transaction\n"
    );
    println!(
        "| form | clients | explicit tps | declared tps | declared / explicit per round | \
         declared / explicit |\n|---|---:|---:|---:|---|---:|"
    );
    for (form, explicit, session) in [
        ("transaction", "declared_explicit", "declared_session"),
        (
            "one statement",
            "declared_explicit_one",
            "declared_session_one",
        ),
    ] {
        for clients in [1, 8] {
            let mut pairs = Vec::new();
            for _ in 0..rounds {
                let e = pgbench.tps(explicit, clients, 1, secs)?;
                let d = pgbench.tps_with(session, clients, 1, secs, &declared)?;
                pairs.push((e, d));
            }
            let mut each: Vec<f64> = pairs.iter().map(|(e, d)| d / e).collect();
            let shown: Vec<String> = each.iter().map(|r| format!("{r:.2}")).collect();
            println!(
                "| {form} | {clients} | {:.0} | {:.0} | {} | {:.2} |",
                median_f64(&mut pairs.iter().map(|p| p.0).collect::<Vec<f64>>()),
                median_f64(&mut pairs.iter().map(|p| p.1).collect::<Vec<f64>>()),
                shown.join(", "),
                median_f64(&mut each)
            );
        }
    }
    drop_database(DB).await
}
