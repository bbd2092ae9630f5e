//! `BENCH_ONLY=thin`, the library's own cost: each `LeaseManager`
//! operation beside the same pglease function call sent bare through
//! sqlx, one prepared statement per operation, alternated (bare first), at
//! 1 and 8 clients on 1 and 1,000 names. Prints library / bare per pair
//! and the median.

use std::sync::Arc;

use pglease::{Error, Lease, LeaseManager};
use sqlx::PgPool;

use crate::shared::ops::picked::{self, Acquire, Guard, Held};
use crate::shared::pairs::ROWS;
use crate::shared::timing::{Op, bench_rounds, pair_row};
use crate::shared::{Bench, hold};

/// The bare acquisition: a row whose token is NULL when the name is held.
const ACQUIRE: Acquire = Acquire::Call("SELECT token FROM pglease.acquire($1, $2, $3)");

/// The bare check of a fenced transaction, which raises when the lease is
/// not held.
const ASSERT_HELD: Guard = Guard::Raises("SELECT pglease.assert_held($1, $2)");

/// The fenced rows' write, $1 the row (as `n` of `thin-held-n`).
const UPDATE: &str = "UPDATE thin_data SET value = value + 1 WHERE id = $1";

/// The rows' operations, in the table's order.
const OPERATIONS: [&str; 4] = ["cycle", "failed", "renew", "fenced"];

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let (pool, m, secs) = (&bench.pool, &bench.m, bench.secs);
    let rounds = bench_rounds(3);
    let sides = Sides::set_up(pool, m).await?;
    println!(
        "\nThe library's own cost ({rounds} pairs alternated, bare first, {secs} s each): \
         LeaseManager ops/s / the same pglease call sent bare through sqlx\n"
    );
    println!(
        "| operation | clients | names | bare ops/s (median) | library ops/s (median) | ratio per pair | median |\n\
         |---|---:|---:|---:|---:|---|---:|"
    );
    for label in OPERATIONS {
        for (clients, names) in ROWS {
            let (bare, lib) = sides.ops(label, names);
            pair_row(label, clients, names, rounds, secs, bare, lib).await;
        }
    }
    for lease in sides.held.iter() {
        m.release(lease).await?;
    }
    Ok(())
}

/// Both sides of each row: the pglease call sent bare through sqlx, and
/// the `LeaseManager` operation.
struct Sides {
    pool: PgPool,
    m: LeaseManager,
    /// `thin-held-1` to `thin-held-1000`.
    held: Arc<Vec<Lease>>,
}

impl Sides {
    /// The held leases and the table the fenced rows write.
    async fn set_up(pool: &PgPool, m: &LeaseManager) -> Result<Self, Error> {
        let held = hold(m, "thin-held-", 1..=1000).await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS thin_data (id int PRIMARY KEY, value bigint NOT NULL)",
        )
        .execute(pool)
        .await?;
        sqlx::query(
            "INSERT INTO thin_data SELECT g, 0 FROM generate_series(1, 1000) g ON CONFLICT DO NOTHING",
        )
        .execute(pool)
        .await?;
        Ok(Self {
            pool: pool.clone(),
            m: m.clone(),
            held,
        })
    }

    /// The bare operation and the library's for one row.
    fn ops(&self, label: &str, names: usize) -> (Op, Op) {
        let (pool, m, held) = (&self.pool, &self.m, &self.held);
        let handles = Held::Handles(held.clone());
        match label {
            "cycle" => (
                picked::sql_cycle(
                    pool,
                    ACQUIRE,
                    "SELECT pglease.release($1, $2)",
                    "thin-cycle-",
                    names,
                ),
                picked::lib_cycle(m, "thin-cycle-", names),
            ),
            "failed" => (
                picked::sql_failed(pool, ACQUIRE, "thin-held-", names),
                picked::lib_failed(m, "thin-held-", names),
            ),
            "renew" => (
                picked::sql_renew(pool, "SELECT pglease.renew($1, $2, $3)", &handles, names),
                picked::lib_renew(m, held, names),
            ),
            _ => (
                picked::sql_fenced(pool, ASSERT_HELD, UPDATE, &handles, names),
                picked::lib_fenced(m, held, UPDATE, names),
            ),
        }
    }
}
