//! `BENCH_ONLY=declared`, P8: what a declared session's write to a
//! protected table costs against the same write in a transaction that
//! declares its token itself with `assert_held`. pgbench, prepared
//! statements, table `data` protected by lease `held-1`; each client
//! writes a row of its own. The declared side connects with
//! `PGOPTIONS='-c pglease.name=held-1 -c pglease.token=T'`, as `pglease run
//! --declare` gives its command. Two rows: the same transaction (BEGIN,
//! [the check,] the write, COMMIT) on each side, and the declared write
//! alone in autocommit (a migration tool's statement outside a
//! transaction; a statement-level guard fires before a CTE's
//! `assert_held` could run, so the explicit side has no one-statement
//! form on a protected table). Alternated rounds;
//! printed as declared tps / explicit tps per round and their median (at
//! least 1 / 1.1 = 0.91 meets P8: at most 1.1 x the cost).
//!
//! With `BENCH_BASELINE_SCHEMA=FILE` (an earlier `migrations/0001_schema.sql`,
//! say `git show REV:migrations/0001_schema.sql > FILE`), it then runs
//! P1's pglease scripts (acquire + release, failed acquire, renew, guarded
//! write, fenced transaction; 1,000 names; 1 and 8 clients) on a database
//! with that schema and one with this one, alternated: this schema's tps /
//! the baseline's per round, and their median. Undeclared sessions run
//! these, so the rows say what the declared sessions cost everyone else.

use pglease::Error;

use crate::shared::Bench;
use sqlx::AssertSqlSafe;

use crate::shared::database::{drop_database, fresh_database, pgbench_database, scripts};
use crate::shared::pgbench::{self, Pgbench};
use crate::shared::timing::{bench_rounds, median_f64};

const DB: &str = "pglease_bench_declared";

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let secs = bench.secs;
    let binary = pgbench::find()?;
    let rounds = bench_rounds(3);
    let pool = pgbench_database(DB, 2).await?;
    let token: i64 = sqlx::query_scalar(
        "SELECT l.token FROM pglease.leases AS l, pglease.protect('data', 'held-1') \
          WHERE l.name = 'held-1'",
    )
    .fetch_one(&pool)
    .await?;
    let pgbench = Pgbench::on(binary, &pool, DB).await?;
    pool.close().await;
    let declared = [(
        "PGOPTIONS",
        format!("-c pglease.name=held-1 -c pglease.token={token}"),
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
            "transaction vs the declared write alone (autocommit)",
            "declared_explicit",
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
            println!("| {form} | {clients} | {} |", ratio_cells(&pairs));
        }
    }
    drop_database(DB).await?;
    if let Ok(file) = std::env::var("BENCH_BASELINE_SCHEMA") {
        before_and_after(&file, secs, rounds).await?;
    }
    Ok(())
}

const BEFORE: &str = "pglease_bench_before";

/// P1's pglease scripts on the schema of `file` and on this one,
/// alternated.
async fn before_and_after(file: &str, secs: f64, rounds: usize) -> Result<(), Error> {
    let schema = std::fs::read_to_string(file).map_err(|e| Error::Database(sqlx::Error::Io(e)))?;
    let setup = std::fs::read_to_string(scripts().join("setup.sql"))
        .map_err(|e| Error::Database(sqlx::Error::Io(e)))?;
    let before = fresh_database(BEFORE, 2).await?;
    sqlx::raw_sql(AssertSqlSafe(schema))
        .execute(&before)
        .await?;
    sqlx::raw_sql(AssertSqlSafe(setup)).execute(&before).await?;
    let after = pgbench_database(DB, 2).await?;
    let before_bench = Pgbench::on(pgbench::find()?, &before, BEFORE).await?;
    let after_bench = Pgbench::on(pgbench::find()?, &after, DB).await?;
    before.close().await;
    after.close().await;
    println!(
        "\nP1's pglease scripts, this schema against {file} (pgbench, prepared, 1,000 names, \
         {secs} s per run, {rounds} rounds alternated): this / baseline tps\n"
    );
    println!(
        "| script | clients | baseline tps | this tps | this / baseline per round | this / baseline |\n\
         |---|---:|---:|---:|---|---:|"
    );
    for script in [
        "lease_cycle",
        "lease_failed",
        "lease_renew",
        "lease_write",
        "lease_fenced",
    ] {
        for clients in [1, 8] {
            let mut pairs = Vec::new();
            for _ in 0..rounds {
                let b = before_bench.tps(script, clients, 1000, secs)?;
                let a = after_bench.tps(script, clients, 1000, secs)?;
                pairs.push((b, a));
            }
            println!("| {script} | {clients} | {} |", ratio_cells(&pairs));
        }
    }
    drop_database(BEFORE).await?;
    drop_database(DB).await
}

/// `first tps | second tps | second / first per round | their median`,
/// from rounds of (first, second) tps.
fn ratio_cells(pairs: &[(f64, f64)]) -> String {
    let mut each: Vec<f64> = pairs.iter().map(|(a, b)| b / a).collect();
    let shown: Vec<String> = each.iter().map(|r| format!("{r:.2}")).collect();
    format!(
        "{:.0} | {:.0} | {} | {:.2}",
        median_f64(&mut pairs.iter().map(|p| p.0).collect::<Vec<f64>>()),
        median_f64(&mut pairs.iter().map(|p| p.1).collect::<Vec<f64>>()),
        shown.join(", "),
        median_f64(&mut each)
    )
}
