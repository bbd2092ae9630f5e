//! `BENCH_ONLY=thin`, the library's own cost: each `LeaseManager`
//! operation beside the same pglease function call sent bare through
//! sqlx, one prepared statement per operation, alternated (bare first), at
//! 1 and 8 clients on 1 and 1,000 names. Prints library / bare per pair
//! and the median.

use std::sync::Arc;

use pglease::{AcquireOptions, Error, Lease, LeaseManager};
use sqlx::PgPool;

use crate::shared::Bench;
use crate::shared::ops::LONG;
use crate::shared::pairs::ROWS;
use crate::shared::timing::{Op, bench_rounds, op, pair_row, pick};

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
        let mut held = Vec::new();
        for n in 1..=1000 {
            held.push(
                m.acquire(
                    &format!("thin-held-{n}"),
                    AcquireOptions::ttl(LONG).holder("bench"),
                )
                .await?,
            );
        }
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
            held: Arc::new(held),
        })
    }

    /// The bare operation and the library's for one row.
    fn ops(&self, label: &str, names: usize) -> (Op, Op) {
        match label {
            "cycle" => (self.bare_cycle(names), self.lib_cycle(names)),
            "failed" => (self.bare_failed(names), self.lib_failed(names)),
            "renew" => (self.bare_renew(names), self.lib_renew(names)),
            _ => (self.bare_fenced(names), self.lib_fenced(names)),
        }
    }

    fn bare_cycle(&self, names: usize) -> Op {
        let pool = self.pool.clone();
        op(move |_| {
            let pool = pool.clone();
            async move {
                let name = format!("thin-cycle-{}", pick(names));
                let token: Option<i64> =
                    sqlx::query_scalar("SELECT token FROM pglease.acquire($1, $2, $3)")
                        .bind(&name)
                        .bind("bench")
                        .bind(LONG)
                        .fetch_one(&pool)
                        .await?;
                if let Some(token) = token {
                    sqlx::query("SELECT pglease.release($1, $2)")
                        .bind(&name)
                        .bind(token)
                        .execute(&pool)
                        .await?;
                }
                Ok(())
            }
        })
    }

    fn lib_cycle(&self, names: usize) -> Op {
        let m = self.m.clone();
        op(move |_| {
            let m = m.clone();
            async move {
                let name = format!("thin-cycle-{}", pick(names));
                match m
                    .acquire(&name, AcquireOptions::ttl(LONG).holder("bench"))
                    .await
                {
                    Ok(lease) => m.release(&lease).await.map(drop),
                    Err(Error::Held { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
    }

    fn bare_failed(&self, names: usize) -> Op {
        let pool = self.pool.clone();
        op(move |_| {
            let pool = pool.clone();
            async move {
                let token: Option<i64> =
                    sqlx::query_scalar("SELECT token FROM pglease.acquire($1, $2, $3)")
                        .bind(format!("thin-held-{}", pick(names)))
                        .bind("other")
                        .bind(LONG)
                        .fetch_one(&pool)
                        .await?;
                assert!(token.is_none(), "acquired a held lease");
                Ok(())
            }
        })
    }

    fn lib_failed(&self, names: usize) -> Op {
        let m = self.m.clone();
        op(move |_| {
            let m = m.clone();
            async move {
                let name = format!("thin-held-{}", pick(names));
                match m
                    .acquire(&name, AcquireOptions::ttl(LONG).holder("other"))
                    .await
                {
                    Err(Error::Held { .. }) => Ok(()),
                    Err(e) => Err(e),
                    Ok(_) => panic!("acquired a held lease"),
                }
            }
        })
    }

    fn bare_renew(&self, names: usize) -> Op {
        let (pool, held) = (self.pool.clone(), self.held.clone());
        op(move |_| {
            let (pool, held) = (pool.clone(), held.clone());
            async move {
                let lease = &held[pick(names) - 1];
                sqlx::query("SELECT pglease.renew($1, $2, $3)")
                    .bind(lease.name())
                    .bind(lease.token())
                    .bind(LONG)
                    .execute(&pool)
                    .await?;
                Ok(())
            }
        })
    }

    fn lib_renew(&self, names: usize) -> Op {
        let (m, held) = (self.m.clone(), self.held.clone());
        op(move |_| {
            let (m, held) = (m.clone(), held.clone());
            async move { m.renew(&held[pick(names) - 1], LONG).await.map(drop) }
        })
    }

    fn bare_fenced(&self, names: usize) -> Op {
        let (pool, held) = (self.pool.clone(), self.held.clone());
        op(move |_| {
            let (pool, held) = (pool.clone(), held.clone());
            async move {
                let n = pick(names);
                let mut tx = pool.begin().await?;
                sqlx::query("SELECT pglease.assert_held($1, $2)")
                    .bind(held[n - 1].name())
                    .bind(held[n - 1].token())
                    .execute(&mut *tx)
                    .await?;
                write(&mut tx, n).await?;
                tx.commit().await?;
                Ok(())
            }
        })
    }

    fn lib_fenced(&self, names: usize) -> Op {
        let (m, held) = (self.m.clone(), self.held.clone());
        op(move |_| {
            let (m, held) = (m.clone(), held.clone());
            async move {
                let n = pick(names);
                let mut tx = m.begin_fenced(&held[n - 1]).await?;
                write(&mut tx, n).await?;
                tx.commit().await?;
                Ok(())
            }
        })
    }
}

/// The fenced row's write.
async fn write(tx: &mut sqlx::PgConnection, n: usize) -> Result<(), Error> {
    sqlx::query("UPDATE thin_data SET value = value + 1 WHERE id = $1")
        .bind(n as i32)
        .execute(tx)
        .await?;
    Ok(())
}
