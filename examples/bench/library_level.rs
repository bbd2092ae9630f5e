//! `BENCH_ONLY=p1` (first in the full run), P1 through the library: the
//! pairs `BENCH_ONLY=sql` runs with pgbench (`bench/pgbench/`: the same
//! set-up, the same baselines, sent through sqlx), each library operation
//! beside its minimal hand-made statements, alternated, at 1 and 8 clients
//! on 1 and 1,000 names, in a database of its own (`pglease_bench_p1`).
//! Prints each pair's ratio (library / raw) and their median.

use std::sync::Arc;

use pglease::{AcquireOptions, Error, Lease, LeaseManager};
use sqlx::PgPool;

use crate::shared::Bench;
use crate::shared::database::{drop_database, found, held_token_offset, pgbench_database};
use crate::shared::ops::{LONG, RAW_UPDATE};
use crate::shared::pairs::{PAIRS, ROWS};
use crate::shared::timing::{Op, bench_rounds, op, pair_row, pick};

const DB: &str = "pglease_bench_p1";

// The baselines of `bench/pgbench/` (`raw_*.sql`), with the scripts'
// variables as parameters: $1 the name, $2 the holder or the token.
const RAW_ACQUIRE: &str = "UPDATE raw_leases SET holder = $2, token = nextval('raw_seq'), \
     expires_at = clock_timestamp() + $3 \
     WHERE name = $1 AND (holder IS NULL OR expires_at <= clock_timestamp()) RETURNING token";
const RAW_RENEW: &str = "UPDATE raw_leases SET expires_at = clock_timestamp() + $3 \
     WHERE name = $1 AND token = $2 AND holder IS NOT NULL AND clock_timestamp() < expires_at \
     RETURNING expires_at";
const RAW_RELEASE: &str = "UPDATE raw_leases SET holder = NULL \
     WHERE name = $1 AND token = $2 AND holder IS NOT NULL AND clock_timestamp() < expires_at";
/// `raw_cycle_history.sql`'s acquisition: the history row in the same statement.
const RAW_ACQUIRE_HISTORY: &str = "WITH a AS (UPDATE raw_leases SET holder = $2, \
     token = nextval('raw_seq'), expires_at = clock_timestamp() + $3 \
     WHERE name = $1 AND (holder IS NULL OR expires_at <= clock_timestamp()) \
     RETURNING name, token, holder), \
     h AS (INSERT INTO raw_history (name, token, event, holder, at, role) \
     SELECT name, token, 'acquired', holder, clock_timestamp(), session_user FROM a) \
     SELECT token FROM a";
/// `raw_cycle_history.sql`'s release: the history row in the same statement.
const RAW_RELEASE_HISTORY: &str = "WITH r AS (UPDATE raw_leases SET holder = NULL \
     WHERE name = $1 AND token = $2 AND holder IS NOT NULL AND clock_timestamp() < expires_at \
     RETURNING name, token), \
     h AS (INSERT INTO raw_history (name, token, event, holder, at, role) \
     SELECT name, token, 'released', 'bench', clock_timestamp(), session_user FROM r) \
     SELECT count(*) FROM r";
/// `raw_cycle_notify.sql`'s release: the history row and the notification.
const RAW_RELEASE_HISTORY_NOTIFY: &str = "WITH r AS (UPDATE raw_leases SET holder = NULL \
     WHERE name = $1 AND token = $2 AND holder IS NOT NULL AND clock_timestamp() < expires_at \
     RETURNING name, token), \
     h AS (INSERT INTO raw_history (name, token, event, holder, at, role) \
     SELECT name, token, 'released', 'bench', clock_timestamp(), session_user FROM r) \
     SELECT pg_notify('raw_release', hashtext(name)::text) FROM r";
/// The minimal guard (`raw_fenced.sql`): the seed's check on the lease
/// row, locked `FOR KEY SHARE` until commit.
const RAW_GUARD: &str = "SELECT 1 FROM raw_leases \
     WHERE name = $1 AND token = $2 AND clock_timestamp() < expires_at FOR KEY SHARE";
/// The minimal guarded write in one statement (`raw_write.sql`).
const RAW_GUARDED_UPDATE: &str = "WITH fence AS (SELECT 1 FROM raw_leases \
     WHERE name = $1 AND token = $2 AND clock_timestamp() < expires_at FOR KEY SHARE) \
     UPDATE data SET value = value + 1 FROM fence WHERE id = $3";
const GUARDED_UPDATE: &str = "WITH fence AS (SELECT pglease.assert_held($1, $2)) \
     UPDATE data SET value = value + 1 FROM fence WHERE id = $3";

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let secs = bench.secs;
    println!("pglease benchmark: {secs} s per measurement, raw and library alternated\n");
    let rounds = bench_rounds(3);
    let pool = pgbench_database(DB, 8).await?;
    let sides = Sides::set_up(&pool).await?;
    let url = found().await?.url(DB);
    println!(
        "P1 through the library (sqlx; the baselines of bench/pgbench, {rounds} pairs \
         alternated, raw first, {secs} s each): library ops/s / raw ops/s\n"
    );
    println!(
        "| operation | clients | names | raw ops/s (median) | pglease ops/s (median) | ratio per pair | median |\n\
         |---|---:|---:|---:|---:|---|---:|"
    );
    for pair in &PAIRS {
        let watcher = pair.prepare(&pool, &url).await?;
        for (clients, names) in ROWS {
            let (raw_op, lib_op) = sides.ops(pair.raw, names);
            pair_row(pair.label, clients, names, rounds, secs, raw_op, lib_op).await;
        }
        watcher.stop();
    }
    pool.close().await;
    drop_database(DB).await
}

/// Both sides of every pair, through sqlx: the raw statements on
/// `raw_leases`, and the library's operations on pglease's leases.
struct Sides {
    pool: PgPool,
    m: LeaseManager,
    /// The library's handles of `held-1` to `held-1000`.
    held: Arc<Vec<Lease>>,
    /// `token - N` of `raw_leases`' `held-N`.
    raw_offset: i64,
}

impl Sides {
    /// The library's handles of the held leases, and the raw side's
    /// tokens.
    async fn set_up(pool: &PgPool) -> Result<Self, Error> {
        let m = LeaseManager::new(pool.clone());
        // The set-up acquired held-N in SQL; the library's operations need
        // its own handles, so it takes them again.
        sqlx::query(
            "SELECT count(pglease.release(name, token)) FROM pglease.leases WHERE name LIKE 'held-%'",
        )
        .execute(pool)
        .await?;
        let mut held = Vec::new();
        for n in 1..=1000 {
            held.push(
                m.acquire(
                    &format!("held-{n}"),
                    AcquireOptions::ttl(LONG).holder("bench"),
                )
                .await?,
            );
        }
        Ok(Self {
            pool: pool.clone(),
            m,
            held: Arc::new(held),
            raw_offset: held_token_offset(pool, "raw_leases").await?,
        })
    }

    /// The raw and the library operation of the pair whose baseline is
    /// `raw`, on `names` names.
    fn ops(&self, raw: &str, names: usize) -> (Op, Op) {
        match raw {
            "raw_cycle" => (
                self.raw_cycle(RAW_ACQUIRE, RAW_RELEASE, names),
                self.lib_cycle(names),
            ),
            "raw_cycle_history" => (
                self.raw_cycle(RAW_ACQUIRE_HISTORY, RAW_RELEASE_HISTORY, names),
                self.lib_cycle(names),
            ),
            "raw_cycle_notify" => (
                self.raw_cycle(RAW_ACQUIRE_HISTORY, RAW_RELEASE_HISTORY_NOTIFY, names),
                self.lib_cycle(names),
            ),
            "raw_renew" => (self.raw_renew(names), self.lib_renew(names)),
            "raw_failed" => (self.raw_failed(names), self.lib_failed(names)),
            "raw_write" => (self.raw_write(names), self.lib_write(names)),
            "raw_fenced" => (self.raw_fenced(names), self.lib_fenced(names)),
            other => panic!("no library operations for the pair of {other}"),
        }
    }

    /// The raw cycle: take the name if free, release it if taken.
    fn raw_cycle(&self, acquire: &'static str, release: &'static str, names: usize) -> Op {
        let pool = self.pool.clone();
        op(move |_| {
            let pool = pool.clone();
            async move {
                let name = format!("cycle-{}", pick(names));
                let token: Option<i64> = sqlx::query_scalar(acquire)
                    .bind(&name)
                    .bind("bench")
                    .bind(LONG)
                    .fetch_optional(&pool)
                    .await?;
                if let Some(token) = token {
                    sqlx::query(release)
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
                let name = format!("cycle-{}", pick(names));
                match m
                    .acquire(&name, AcquireOptions::ttl(LONG).holder("bench"))
                    .await
                {
                    Ok(lease) => {
                        m.release(&lease).await?;
                        Ok(())
                    }
                    Err(Error::Held { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
    }

    fn raw_renew(&self, names: usize) -> Op {
        let (pool, raw_offset) = (self.pool.clone(), self.raw_offset);
        op(move |_| {
            let pool = pool.clone();
            async move {
                let n = pick(names);
                sqlx::query(RAW_RENEW)
                    .bind(format!("held-{n}"))
                    .bind(n as i64 + raw_offset)
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
            async move {
                m.renew(&held[pick(names) - 1], LONG).await?;
                Ok(())
            }
        })
    }

    fn raw_failed(&self, names: usize) -> Op {
        let pool = self.pool.clone();
        op(move |_| {
            let pool = pool.clone();
            async move {
                let got: Option<i64> = sqlx::query_scalar(RAW_ACQUIRE)
                    .bind(format!("held-{}", pick(names)))
                    .bind("other")
                    .bind(LONG)
                    .fetch_optional(&pool)
                    .await?;
                assert!(got.is_none(), "raw acquire of a held lease");
                Ok(())
            }
        })
    }

    fn lib_failed(&self, names: usize) -> Op {
        let m = self.m.clone();
        op(move |_| {
            let m = m.clone();
            async move {
                let name = format!("held-{}", pick(names));
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

    fn raw_write(&self, names: usize) -> Op {
        let (pool, raw_offset) = (self.pool.clone(), self.raw_offset);
        op(move |_| {
            let pool = pool.clone();
            async move {
                let n = pick(names);
                sqlx::query(RAW_GUARDED_UPDATE)
                    .bind(format!("held-{n}"))
                    .bind(n as i64 + raw_offset)
                    .bind(n as i32)
                    .execute(&pool)
                    .await?;
                Ok(())
            }
        })
    }

    fn lib_write(&self, names: usize) -> Op {
        let (pool, held) = (self.pool.clone(), self.held.clone());
        op(move |_| {
            let (pool, held) = (pool.clone(), held.clone());
            async move {
                let n = pick(names);
                sqlx::query(GUARDED_UPDATE)
                    .bind(format!("held-{n}"))
                    .bind(held[n - 1].token())
                    .bind(n as i32)
                    .execute(&pool)
                    .await?;
                Ok(())
            }
        })
    }

    fn raw_fenced(&self, names: usize) -> Op {
        let (pool, raw_offset) = (self.pool.clone(), self.raw_offset);
        op(move |_| {
            let pool = pool.clone();
            async move {
                let n = pick(names);
                let mut tx = pool.begin().await?;
                sqlx::query(RAW_GUARD)
                    .bind(format!("held-{n}"))
                    .bind(n as i64 + raw_offset)
                    .fetch_one(&mut *tx)
                    .await?;
                sqlx::query(RAW_UPDATE)
                    .bind(n as i32)
                    .execute(&mut *tx)
                    .await?;
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
                sqlx::query(RAW_UPDATE)
                    .bind(n as i32)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }
        })
    }
}
