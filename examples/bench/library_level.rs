//! `BENCH_ONLY=p1` (first in the full run), P1 through the library: the
//! pairs `BENCH_ONLY=sql` runs with pgbench (`bench/pgbench/`: the same
//! set-up, the same baselines, sent through sqlx), each library operation
//! beside its minimal hand-made statements, alternated, at 1 and 8 clients
//! on 1 and 1,000 names, in a database of its own (`pglease_bench_p1`).
//! Prints each pair's ratio (library / raw) and their median.

use std::sync::Arc;

use pglease::{Error, Lease, LeaseManager};
use sqlx::PgPool;

use crate::shared::database::{drop_database, found, held_token_offset, pgbench_database};
use crate::shared::ops::RAW_UPDATE;
use crate::shared::ops::picked::{self, Acquire, Guard, Held};
use crate::shared::pairs::{PAIRS, ROWS};
use crate::shared::timing::{Op, bench_rounds, pair_row};
use crate::shared::{Bench, hold};

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
/// The minimal guard (`raw_fenced.sql`): token and expiry checked on the lease
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
    /// `raw_leases`' `held-1` to `held-1000`.
    raw_held: Held,
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
        let held = hold(&m, "held-", 1..=1000).await?;
        let offset = held_token_offset(pool, "raw_leases").await?;
        Ok(Self {
            pool: pool.clone(),
            m,
            held,
            raw_held: Held::Raw { offset },
        })
    }

    /// The raw and the library operation of the pair whose baseline is
    /// `raw`, on `names` names.
    fn ops(&self, raw: &str, names: usize) -> (Op, Op) {
        let (pool, m, held) = (&self.pool, &self.m, &self.held);
        let raw_cycle = |acquire, release| {
            picked::sql_cycle(pool, Acquire::Returning(acquire), release, "cycle-", names)
        };
        let lib_cycle = || picked::lib_cycle(m, "cycle-", names);
        match raw {
            "raw_cycle" => (raw_cycle(RAW_ACQUIRE, RAW_RELEASE), lib_cycle()),
            "raw_cycle_history" => (
                raw_cycle(RAW_ACQUIRE_HISTORY, RAW_RELEASE_HISTORY),
                lib_cycle(),
            ),
            "raw_cycle_notify" => (
                raw_cycle(RAW_ACQUIRE_HISTORY, RAW_RELEASE_HISTORY_NOTIFY),
                lib_cycle(),
            ),
            "raw_renew" => (
                picked::sql_renew(pool, RAW_RENEW, &self.raw_held, names),
                picked::lib_renew(m, held, names),
            ),
            "raw_failed" => (
                picked::sql_failed(pool, Acquire::Returning(RAW_ACQUIRE), "held-", names),
                picked::lib_failed(m, "held-", names),
            ),
            "raw_write" => (
                picked::sql_write(pool, RAW_GUARDED_UPDATE, &self.raw_held, names),
                picked::sql_write(pool, GUARDED_UPDATE, &Held::Handles(held.clone()), names),
            ),
            "raw_fenced" => (
                picked::sql_fenced(
                    pool,
                    Guard::Select(RAW_GUARD),
                    RAW_UPDATE,
                    &self.raw_held,
                    names,
                ),
                picked::lib_fenced(m, held, RAW_UPDATE, names),
            ),
            other => panic!("no library operations for the pair of {other}"),
        }
    }
}
