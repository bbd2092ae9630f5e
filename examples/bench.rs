//! Throughput of each pglease operation beside the same work sent as raw
//! SQL through sqlx, measured in the same run, at 1 and 8 clients.
//!
//! Commits here are bound by fsync, which is slow and noisy, so the ratio
//! (library / raw) is the figure that counts, not the absolute rate. Each
//! pair is measured alternately (raw, library, raw, library) to spread
//! drift evenly over both sides.
//!
//! Run: `cargo run --release --example bench` (uses DATABASE_URL or the
//! libpq defaults; creates and drops the database `pglease_bench`).
//! `BENCH_SECS` sets the seconds per measurement (default 2).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pglease::{Error, LeaseManager};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

type BoxFut = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;
type Op = Arc<dyn Fn(usize) -> BoxFut + Send + Sync>;

const LONG: Duration = Duration::from_secs(3600);

/// Operations per second of `op` run by `clients` concurrent loops.
async fn rate(clients: usize, secs: f64, op: Op) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let op = op.clone();
            let done = done.clone();
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    if let Err(e) = op(client).await {
                        panic!("benchmark operation failed: {e}");
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("benchmark task");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// (raw ops/s, library ops/s), alternating the two twice.
async fn pair(clients: usize, secs: f64, raw: Op, lib: Op) -> (f64, f64) {
    let mut r = 0.0;
    let mut l = 0.0;
    for _ in 0..2 {
        r += rate(clients, secs / 2.0, raw.clone()).await;
        l += rate(clients, secs / 2.0, lib.clone()).await;
    }
    (r / 2.0, l / 2.0)
}

fn op<F, Fut>(f: F) -> Op
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Error>> + Send + 'static,
{
    Arc::new(move |c| Box::pin(f(c)) as BoxFut)
}

/// The unguarded write every guarded write is compared with.
fn raw_update(pool: &PgPool) -> Op {
    let pool = pool.clone();
    op(move |c| {
        let pool = pool.clone();
        async move {
            sqlx::query(RAW_UPDATE)
                .bind(c as i32)
                .execute(&pool)
                .await?;
            Ok(())
        }
    })
}

async fn setup() -> Result<PgPool, Error> {
    let server = match std::env::var("DATABASE_URL") {
        Ok(url) => url.parse::<PgConnectOptions>()?,
        Err(_) => pglease::libpq_defaults(),
    };
    let mut admin = server.connect().await?;
    sqlx::query("DROP DATABASE IF EXISTS pglease_bench WITH (FORCE)")
        .execute(&mut admin)
        .await?;
    sqlx::query("CREATE DATABASE pglease_bench")
        .execute(&mut admin)
        .await?;
    admin.close().await?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(server.database("pglease_bench"))
        .await?;
    LeaseManager::new(pool.clone()).migrate().await?;
    sqlx::query("CREATE TABLE data (id int PRIMARY KEY, value bigint NOT NULL)")
        .execute(&pool)
        .await?;
    sqlx::query("INSERT INTO data SELECT g, 0 FROM generate_series(0, 15) g")
        .execute(&pool)
        .await?;
    // The home-made alternative: a lease table driven by bare statements.
    sqlx::raw_sql(
        "CREATE SEQUENCE raw_seq; \
         CREATE TABLE raw_leases (name text PRIMARY KEY, holder text, token bigint NOT NULL, \
                                  expires_at timestamptz NOT NULL) WITH (fillfactor = 80); \
         INSERT INTO raw_leases SELECT 'cycle-' || g, NULL, 0, '-infinity' FROM generate_series(0, 7) g; \
         INSERT INTO raw_leases SELECT 'held-' || g, 'bench', nextval('raw_seq'), now() + interval '1 hour' \
           FROM generate_series(0, 7) g;",
    )
    .execute(&pool)
    .await?;
    Ok(pool)
}

const RAW_UPDATE: &str = "UPDATE data SET value = value + 1 WHERE id = $1";
const RAW_ACQUIRE: &str = "UPDATE raw_leases SET holder = $2, token = nextval('raw_seq'), \
     expires_at = clock_timestamp() + $3 \
     WHERE name = $1 AND (holder IS NULL OR expires_at <= clock_timestamp()) RETURNING token";
const RAW_RENEW: &str = "UPDATE raw_leases SET expires_at = clock_timestamp() + $3 \
     WHERE name = $1 AND token = $2 AND holder IS NOT NULL AND clock_timestamp() < expires_at \
     RETURNING expires_at";
const RAW_RELEASE: &str = "UPDATE raw_leases SET holder = NULL \
     WHERE name = $1 AND token = $2 AND holder IS NOT NULL AND clock_timestamp() < expires_at";
const GUARDED_UPDATE: &str = "WITH fence AS (SELECT pglease.assert_held($1, $2)) \
     UPDATE data SET value = value + 1 FROM fence WHERE id = $3";

#[tokio::main]
async fn main() -> Result<(), Error> {
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let pool = setup().await?;
    let m = LeaseManager::new(pool.clone());

    // One held lease per client for renew and guarded writes.
    let mut tokens = Vec::new();
    for c in 0..8 {
        tokens.push(
            m.try_acquire(&format!("held-{c}"), "bench", LONG)
                .await?
                .token(),
        );
    }
    let tokens = Arc::new(tokens);

    println!("pglease benchmark: {secs} s per measurement, raw and library alternated");
    println!("raw SQL: the same statement on a bare lease table (raw_leases) or data table\n");
    let select1 = rate(1, secs / 2.0, {
        let pool = pool.clone();
        op(move |_| {
            let pool = pool.clone();
            async move {
                sqlx::query("SELECT 1").execute(&pool).await?;
                Ok(())
            }
        })
    })
    .await;
    println!("round-trip baseline: SELECT 1 at 1 client: {select1:.0}/s\n");
    println!(
        "| operation | clients | raw SQL ops/s | pglease ops/s | ratio |\n|---|---:|---:|---:|---:|"
    );
    for clients in [1usize, 8] {
        let rows: Vec<(&str, Op, Op)> = vec![
            (
                "try_acquire + release",
                {
                    let pool = pool.clone();
                    op(move |c| {
                        let pool = pool.clone();
                        async move {
                            let name = format!("cycle-{c}");
                            let token: i64 = sqlx::query_scalar(RAW_ACQUIRE)
                                .bind(&name)
                                .bind("bench")
                                .bind(LONG)
                                .fetch_one(&pool)
                                .await?;
                            sqlx::query(RAW_RELEASE)
                                .bind(&name)
                                .bind(token)
                                .execute(&pool)
                                .await?;
                            Ok(())
                        }
                    })
                },
                {
                    let m = m.clone();
                    op(move |c| {
                        let m = m.clone();
                        async move {
                            let name = format!("cycle-{c}");
                            let lease = m.try_acquire(&name, "bench", LONG).await?;
                            m.release(&name, lease.token()).await?;
                            Ok(())
                        }
                    })
                },
            ),
            (
                "renew",
                {
                    let pool = pool.clone();
                    op(move |c| {
                        let pool = pool.clone();
                        async move {
                            let name = format!("held-{c}");
                            let token = c as i64 + 1;
                            sqlx::query(RAW_RENEW)
                                .bind(&name)
                                .bind(token)
                                .bind(LONG)
                                .fetch_one(&pool)
                                .await?;
                            Ok(())
                        }
                    })
                },
                {
                    let m = m.clone();
                    let tokens = tokens.clone();
                    op(move |c| {
                        let m = m.clone();
                        let token = tokens[c];
                        async move {
                            m.renew(&format!("held-{c}"), token, LONG).await?;
                            Ok(())
                        }
                    })
                },
            ),
            (
                "guarded write, one statement (vs unguarded UPDATE)",
                raw_update(&pool),
                {
                    let pool = pool.clone();
                    let tokens = tokens.clone();
                    op(move |c| {
                        let pool = pool.clone();
                        let token = tokens[c];
                        async move {
                            sqlx::query(GUARDED_UPDATE)
                                .bind(format!("held-{c}"))
                                .bind(token)
                                .bind(c as i32)
                                .execute(&pool)
                                .await?;
                            Ok(())
                        }
                    })
                },
            ),
            (
                "fenced transaction (vs BEGIN; UPDATE; COMMIT)",
                {
                    let pool = pool.clone();
                    op(move |c| {
                        let pool = pool.clone();
                        async move {
                            let mut tx = pool.begin().await?;
                            sqlx::query(RAW_UPDATE)
                                .bind(c as i32)
                                .execute(&mut *tx)
                                .await?;
                            tx.commit().await?;
                            Ok(())
                        }
                    })
                },
                {
                    let m = m.clone();
                    let tokens = tokens.clone();
                    op(move |c| {
                        let m = m.clone();
                        let token = tokens[c];
                        async move {
                            let mut tx = m.begin_fenced(&format!("held-{c}"), token).await?;
                            sqlx::query(RAW_UPDATE)
                                .bind(c as i32)
                                .execute(&mut *tx)
                                .await?;
                            tx.commit().await?;
                            Ok(())
                        }
                    })
                },
            ),
            (
                "failed try_acquire on a held lease",
                {
                    let pool = pool.clone();
                    op(move |c| {
                        let pool = pool.clone();
                        async move {
                            let got: Option<i64> = sqlx::query_scalar(RAW_ACQUIRE)
                                .bind("held-0")
                                .bind(format!("other-{c}"))
                                .bind(LONG)
                                .fetch_optional(&pool)
                                .await?;
                            assert!(got.is_none(), "raw acquire of a held lease");
                            Ok(())
                        }
                    })
                },
                {
                    let m = m.clone();
                    op(move |c| {
                        let m = m.clone();
                        async move {
                            match m.try_acquire("held-0", &format!("other-{c}"), LONG).await {
                                Err(Error::Held { .. }) => Ok(()),
                                Err(e) => Err(e),
                                Ok(_) => panic!("acquired a held lease"),
                            }
                        }
                    })
                },
            ),
        ];
        for (label, raw, lib) in rows {
            let (r, l) = pair(clients, secs, raw, lib).await;
            println!("| {label} | {clients} | {r:.0} | {l:.0} | {:.2} |", l / r);
        }
    }

    // P6: a failed attempt writes no WAL and draws no token.
    let wal_before: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
        .fetch_one(&pool)
        .await?;
    let seq_before: i64 = sqlx::query_scalar("SELECT last_value FROM pglease.fence_seq")
        .fetch_one(&pool)
        .await?;
    let attempts = 1000;
    for i in 0..attempts {
        let _ = m.try_acquire("held-0", &format!("other-{i}"), LONG).await;
    }
    let wal_bytes: i64 =
        sqlx::query_scalar("SELECT (pg_current_wal_insert_lsn() - $1::text::pg_lsn)::bigint")
            .bind(&wal_before)
            .fetch_one(&pool)
            .await?;
    let seq_after: i64 = sqlx::query_scalar("SELECT last_value FROM pglease.fence_seq")
        .fetch_one(&pool)
        .await?;
    println!(
        "\n{attempts} failed attempts on a held lease: {wal_bytes} bytes of WAL in the whole \
         cluster meanwhile, {} tokens drawn",
        seq_after - seq_before
    );

    pool.close().await;
    let server = match std::env::var("DATABASE_URL") {
        Ok(url) => url.parse::<PgConnectOptions>()?,
        Err(_) => pglease::libpq_defaults(),
    };
    let mut admin = server.connect().await?;
    sqlx::query("DROP DATABASE IF EXISTS pglease_bench WITH (FORCE)")
        .execute(&mut admin)
        .await?;
    Ok(())
}
