//! The full run only: the cost of a protected table per written row. The
//! same fenced transaction (declaration included) inserting into an
//! unprotected table, a table protected by pglease.protect
//! (statement-level trigger) and one guarded by the same check as a
//! row-level trigger.

use std::time::{Duration, Instant};

use pglease::{AcquireOptions, Error};

use crate::shared::Bench;
use crate::shared::ops::LONG;
use crate::shared::timing::median;

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let (pool, m, secs) = (&bench.pool, &bench.m, bench.secs);
    sqlx::raw_sql(
        "CREATE TABLE prot_none (id bigserial PRIMARY KEY, v int NOT NULL); \
         CREATE TABLE prot_stmt (LIKE prot_none INCLUDING ALL); \
         CREATE TABLE prot_row (LIKE prot_none INCLUDING ALL); \
         SELECT pglease.protect('prot_stmt', 'prot'); \
         CREATE TRIGGER guard_rows BEFORE INSERT OR UPDATE OR DELETE ON prot_row \
           FOR EACH ROW EXECUTE FUNCTION pglease._guard(); \
         SELECT pglease._bind('prot_row', 'prot');",
    )
    .execute(pool)
    .await?;
    let lease = m
        .acquire("prot", AcquireOptions::ttl(LONG).holder("bench"))
        .await?;
    println!("\nProtected tables: a fenced transaction inserting N rows in one statement");
    println!(
        "| rows per statement | unprotected µs/row | protect (statement trigger) µs/row | \
         row-level trigger µs/row | statement overhead µs/row | row-level overhead µs/row |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for rows in [1i32, 100] {
        let mut times = [Vec::new(), Vec::new(), Vec::new()];
        let until = Instant::now() + Duration::from_secs_f64(secs * 1.5);
        while Instant::now() < until || times[0].len() < 3 {
            for (i, table) in ["prot_none", "prot_stmt", "prot_row"].iter().enumerate() {
                let start = Instant::now();
                let mut tx = m.begin_fenced(&lease).await?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO {table} (v) SELECT generate_series(1, $1)"
                )))
                .bind(rows)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                times[i].push(start.elapsed());
            }
        }
        let per_row = |v: &[Duration]| median(v).as_secs_f64() * 1e6 / f64::from(rows);
        let [none, stmt, row] = [per_row(&times[0]), per_row(&times[1]), per_row(&times[2])];
        println!(
            "| {rows} | {none:.1} | {stmt:.1} | {row:.1} | {:.1} | {:.1} |",
            stmt - none,
            row - none
        );
    }
    Ok(())
}
