//! Throughput of each pglease operation beside the same work sent as raw
//! SQL through sqlx, measured in the same run, at 1 and 8 clients.
//!
//! Commits here are bound by fsync, which is slow and noisy, so the ratio
//! (library / raw) is the figure that counts, not the absolute rate. Each
//! pair is measured alternately (raw, library, raw, library) to spread
//! drift evenly over both sides.
//!
//! Run: `cargo run --release --example bench` (on the server
//! `pglease::provision` finds: DATABASE_URL, the libpq defaults, else a
//! throwaway cluster; creates and drops the databases `pglease_bench` and
//! `pglease_bench_1m`).
//! `BENCH_SECS` sets the seconds per measurement (default 2);
//! `BENCH_ONLY=fenced` runs only the comparison of the fenced
//! transaction's opening in one round trip or two; `BENCH_ONLY=failover`
//! only the failover timing; `BENCH_ONLY=pooler` only the operations
//! through PgBouncer (started from the installed `pgbouncer`);
//! `BENCH_ONLY=elect` only leader election and the change trigger;
//! `BENCH_ONLY=history` only the history's cost; `BENCH_ONLY=status` only
//! the status of 100,000 leases with and without filters; `BENCH_ONLY=p1`
//! only the main table (each operation beside the baselines of
//! `bench/pgbench/`, through sqlx, in `pglease_bench_p1`); `BENCH_ONLY=sql`
//! only the SQL level: pgbench runs the scripts in `bench/pgbench/`
//! (pglease's functions beside the minimal hand-made statements that give
//! the same guarantee and beside the floor, those statements inside
//! `SECURITY DEFINER` functions, alternated, `BENCH_ROUNDS` rounds,
//! default 3; `BENCH_SQL_PAIRS=raw_cycle,raw_write` only the rows with
//! those baselines, `uncommon` the uncommon paths beside the common one)
//! and prints pglease / floor and pglease / raw;
//! `BENCH_ONLY=flushes` only the WAL flushes of durable renewals (1,000
//! leases held at `synchronous_commit = off`);
//! `BENCH_ONLY=p2b` only one manager holding 100,000 leases (in a
//! database of its own, `pglease_bench_p2b`); `BENCH_ONLY=p3` only the handover from a release to a waiter;
//! `BENCH_ONLY=p3h` only the handover to a named successor against a release
//! and the successor's acquisition, and shared acquisition beside exclusive;
//! `BENCH_ONLY=p4` only the takeover after a holder dies or freezes;
//! `BENCH_ONLY=p4c` only the takeover of a session-bound lease whose
//! holder's session ended, beside an advisory lock's; `BENCH_ONLY=tls`
//! only what TLS costs per operation, on the TLS formation;
//! `BENCH_ONLY=thin` only the library's own cost: each `LeaseManager`
//! operation beside the same pglease call sent bare through sqlx.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pglease::elect::{Elector, Leadership};
use pglease::{AcquireOptions, Error, Lease, LeaseManager, ListFilter, ManagerOptions};
use pglease_formations::{AutoFailover, Endpoint, PgBouncer, Replicated, SetupError, Standby};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgPool};

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

/// Mean ops/s of `a` and of `b`, each run `rounds` times for `secs` / 2,
/// alternately.
async fn alternate(clients: usize, secs: f64, rounds: u32, a: Op, b: Op) -> (f64, f64) {
    let mut x = 0.0;
    let mut y = 0.0;
    for _ in 0..rounds {
        x += rate(clients, secs / 2.0, a.clone()).await;
        y += rate(clients, secs / 2.0, b.clone()).await;
    }
    (x / f64::from(rounds), y / f64::from(rounds))
}

fn op<F, Fut>(f: F) -> Op
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Error>> + Send + 'static,
{
    Arc::new(move |c| Box::pin(f(c)) as BoxFut)
}

/// The server to benchmark, found as the tests find theirs
/// (`pglease::provision`: DATABASE_URL, the libpq defaults, a throwaway
/// cluster, a container).
async fn server() -> Result<PgConnectOptions, Error> {
    Ok(found().await?.options.clone())
}

async fn found() -> Result<&'static pglease::provision::Server, Error> {
    pglease::provision::server()
        .await
        .map_err(|e| Error::Database(sqlx::Error::Configuration(Box::new(e))))
}

/// A throwaway server of the test kit (PgBouncer, a replicated pair):
/// `None`, said on stdout, when this machine lacks what it needs.
fn kit<T>(what: &str, started: Result<T, SetupError>) -> Result<Option<T>, Error> {
    match started {
        Ok(server) => Ok(Some(server)),
        Err(SetupError::Unavailable(why)) => {
            println!("\n{what}: skipped ({why})");
            Ok(None)
        }
        Err(e) => Err(Error::Database(sqlx::Error::Configuration(Box::new(e)))),
    }
}

/// Acquire and release a lease through the library.
fn lib_cycle(m: &LeaseManager) -> Op {
    let m = m.clone();
    op(move |c| {
        let m = m.clone();
        async move {
            let name = format!("cycle-{c}");
            let lease = m
                .acquire(&name, AcquireOptions::ttl(LONG).holder("bench"))
                .await?;
            m.release(&lease).await?;
            Ok(())
        }
    })
}

/// A fenced transaction as `begin_fenced` opens it, writing one row with
/// a prepared statement (`persistent`) or an unnamed one.
fn lib_fenced(m: &LeaseManager, leases: &Arc<Vec<Lease>>, persistent: bool) -> Op {
    let m = m.clone();
    let leases = leases.clone();
    op(move |c| {
        let m = m.clone();
        let leases = leases.clone();
        async move {
            let mut tx = m.begin_fenced(&leases[c]).await?;
            sqlx::query(RAW_UPDATE)
                .persistent(persistent)
                .bind(c as i32)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        }
    })
}

/// Renew, through the library, the lease `leases[client]`.
fn lib_renew(m: &LeaseManager, leases: &Arc<Vec<Lease>>) -> Op {
    let (m, leases) = (m.clone(), leases.clone());
    op(move |c| {
        let (m, leases) = (m.clone(), leases.clone());
        async move {
            m.renew(&leases[c], LONG).await?;
            Ok(())
        }
    })
}

/// A new, empty database `name` (dropped first if a run left it behind),
/// and a pool of `connections` on it.
async fn fresh_database(name: &str, connections: u32) -> Result<PgPool, Error> {
    let server = server().await?;
    let mut admin = server.connect().await?;
    for statement in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        sqlx::query(AssertSqlSafe(statement))
            .execute(&mut admin)
            .await?;
    }
    admin.close().await?;
    Ok(PgPoolOptions::new()
        .max_connections(connections)
        .connect_with(server.database(name))
        .await?)
}

/// Drops database `name` (its pool's connections with it).
async fn drop_database(name: &str) -> Result<(), Error> {
    let mut admin = server().await?.connect().await?;
    sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await?;
    Ok(())
}

async fn setup() -> Result<PgPool, Error> {
    let pool = fresh_database("pglease_bench", 8).await?;
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
const RAW_UPDATE: &str = "UPDATE data SET value = value + 1 WHERE id = $1";
const GUARDED_UPDATE: &str = "WITH fence AS (SELECT pglease.assert_held($1, $2)) \
     UPDATE data SET value = value + 1 FROM fence WHERE id = $3";

#[tokio::main]
async fn main() -> Result<(), Error> {
    println!("benchmark on {}", found().await?);
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
            m.acquire(
                &format!("held-{c}"),
                AcquireOptions::ttl(LONG).holder("bench"),
            )
            .await?,
        );
    }
    let tokens = Arc::new(tokens);

    // One part only: run it, then drop the database as a full run does.
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let part = match only.as_str() {
        "sql" => Some(sql_level(secs).await),
        "failover" => Some(failover().await),
        "pooler" => Some(through_pooler(&pool, &m, &tokens, secs).await),
        "status" => Some(status_scale(&pool, &m).await),
        "history" => Some(history_cost(&pool, &m, secs).await),
        "elect" => Some(election(&pool, secs).await),
        "fenced" => Some(fenced_round_trips(&pool, &m, &tokens, secs).await.map(drop)),
        "p2b" => Some(many_leases().await),
        "p3" => Some(handover(&pool).await),
        "p3h" => Some(named_handover_and_shared(&pool, secs).await),
        "p4" => Some(takeover(&pool).await),
        "p4c" => Some(session_bound_takeover(&pool).await),
        "flushes" => Some(renewal_flushes().await),
        "tls" => Some(tls_cost(secs).await),
        "thin" => Some(thin_library(&pool, &m, secs).await),
        _ => None,
    };
    if let Some(outcome) = part {
        pool.close().await;
        drop_database("pglease_bench").await?;
        return outcome;
    }

    println!("pglease benchmark: {secs} s per measurement, raw and library alternated\n");
    library_level(secs).await?;
    if only == "p1" {
        pool.close().await;
        return drop_database("pglease_bench").await;
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
        let _ = m
            .acquire(
                "held-0",
                AcquireOptions::ttl(LONG).holder(format!("other-{i}")),
            )
            .await;
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

    fenced_round_trips(&pool, &m, &tokens, secs).await?;
    scale(&pool, secs).await?;
    protect_overhead(&pool, &m, secs).await?;
    renewal_batches(&m, secs).await?;
    handover(&pool).await?;
    takeover(&pool).await?;
    election(&pool, secs).await?;
    history_cost(&pool, &m, secs).await?;
    status_scale(&pool, &m).await?;
    through_pooler(&pool, &m, &tokens, secs).await?;
    failover().await?;

    pool.close().await;
    drop_database("pglease_bench").await
}

/// P1: a fenced transaction as `begin_fenced` opens it (`BEGIN` and the
/// check in one round trip) against the same transaction opened in two
/// (`BEGIN`, then `assert_held`), each writing one row and committing.
async fn fenced_round_trips(
    pool: &PgPool,
    m: &LeaseManager,
    leases: &Arc<Vec<pglease::Lease>>,
    secs: f64,
) -> Result<(), Error> {
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
        .connect_with((*pool.connect_options()).clone())
        .await?;
    let lazy = LeaseManager::new(lazy_pool.clone());
    println!(
        "\nOpening a fenced transaction (one UPDATE, COMMIT): BEGIN and the check in one \
         round trip vs two (BEGIN, then assert_held)\n\
         | commit | clients | two round trips ops/s | one round trip ops/s | ratio |\n\
         |---|---:|---:|---:|---:|"
    );
    for (commit, pool, m) in [
        ("flushed", pool, m),
        ("synchronous_commit = off", &lazy_pool, &lazy),
    ] {
        for clients in [1usize, 8] {
            let two = {
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
            };
            let one = lib_fenced(m, leases, true);
            let (t, o) = alternate(clients, secs, 3, two, one).await;
            println!("| {commit} | {clients} | {t:.0} | {o:.0} | {:.2} |", o / t);
        }
    }
    lazy_pool.close().await;
    Ok(())
}

/// The statement the background renewal task sends once per tick.
const RENEW_MANY: &str = "SELECT name, token, expires_at, renewed, current_token, current_holder \
     FROM pglease.renew_many($1, $2, $3)";

/// P2: renewing N held leases in one statement vs one statement per lease.
async fn renewal_batches(m: &LeaseManager, secs: f64) -> Result<(), Error> {
    println!("\nRenewal of N held leases: one renew_many statement vs N renew statements");
    println!("| N | batched µs/lease | one by one µs/lease | batched / one by one |");
    println!("|---:|---:|---:|---:|");
    let mut held: Vec<Lease> = Vec::new();
    for n in [1usize, 100, 1000] {
        while held.len() < n {
            let name = format!("renew-{:04}", held.len());
            held.push(
                m.acquire(&name, AcquireOptions::ttl(LONG).holder("bench"))
                    .await?,
            );
        }
        let names: Vec<&str> = held.iter().map(Lease::name).collect();
        let tokens: Vec<i64> = held.iter().map(|h| h.token().get()).collect();
        let ttls = vec![LONG; n];
        let (mut batched, mut single) = (Vec::new(), Vec::new());
        // Alternate rounds until each side had its share of the time.
        let until = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < until || batched.len() < 3 {
            let start = Instant::now();
            let rows = sqlx::query(RENEW_MANY)
                .bind(&names)
                .bind(&tokens)
                .bind(&ttls)
                .fetch_all(m.pool())
                .await?;
            assert_eq!(rows.len(), n);
            batched.push(start.elapsed());
            let start = Instant::now();
            for lease in &held {
                m.renew(lease, LONG).await?;
            }
            single.push(start.elapsed());
        }
        let per_lease = |v: &[Duration]| median(v).as_secs_f64() * 1e6 / n as f64;
        let (b, o) = (per_lease(&batched), per_lease(&single));
        println!("| {n} | {b:.1} | {o:.1} | {:.3} |", b / o);
    }
    Ok(())
}

fn median(v: &[Duration]) -> Duration {
    percentile(v, 0.5)
}

fn percentile(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// P3: from an explicit release to the waiting acquirer holding the lease,
/// with NOTIFY (the waiter in line: the release grants it the lease) and
/// with polling only; beside an advisory-lock waiter blocked in the server,
/// from `pg_advisory_unlock` to its lock. The release comes 100 ms after
/// the waiter went to sleep, so that a poller's backoff has started. Also
/// how long the release call itself took (its commit included): the
/// handover after the release's commit is at most the difference.
async fn handover(pool: &PgPool) -> Result<(), Error> {
    const ROUNDS: usize = 40;
    println!(
        "\nHandover from the release call to the waiter holding the lease ({ROUNDS} rounds each)"
    );
    println!("| waiter | p50 ms | p99 ms | release call p50 ms |\n|---|---:|---:|---:|");
    let holder = LeaseManager::new(pool.clone());
    for (label, options) in [
        ("LISTEN/NOTIFY", ManagerOptions::default()),
        (
            "polling only (10 ms .. 1 s backoff)",
            ManagerOptions::default().notify(false),
        ),
    ] {
        let waiter = LeaseManager::with_options(pool.clone(), options)?;
        let (mut latencies, mut calls) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let name = format!("handover-{label}-{round}");
            let held = holder
                .acquire(&name, AcquireOptions::ttl(LONG).holder("holder"))
                .await?;
            let (task, _) = waiting_acquirer(&waiter, &name).await;
            let released = Instant::now();
            holder.release(&held).await?;
            calls.push(released.elapsed());
            let (got, at) = task.await.expect("waiter task");
            let lease = got?;
            latencies.push(at - released);
            waiter.release(&lease).await?;
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {label} | {:.2} | {:.2} | {:.2} |",
            ms(median(&latencies)),
            ms(percentile(&latencies, 0.99)),
            ms(median(&calls))
        );
    }
    // The baseline: a session lock, and a waiter blocked on it.
    let mut latencies = Vec::new();
    for round in 0..ROUNDS {
        let key = 0x7033_0000_i64 + round as i64;
        let (mut holding, _, task) = advisory_waiter(pool, key).await?;
        let released = Instant::now();
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut holding)
            .await?;
        let (at, blocked) = task.await.expect("advisory waiter")?;
        latencies.push(at - released);
        holding.close().await?;
        blocked.close().await?;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "| advisory lock, blocked in pg_advisory_lock (no token, nothing written) | {:.2} | {:.2} | |",
        ms(median(&latencies)),
        ms(percentile(&latencies, 0.99))
    );
    Ok(())
}

/// P3-style rows of issue 36. (1) From the holder's call to a successor
/// waiting in line holding the lease: `hand_over` to it, against the
/// minimal hand-made way with the same guarantee, `release` followed by
/// the same fair waiter's acquisition (the line makes it the next
/// holder); rounds alternated, 40 each. (2) Acquire + release cycles,
/// shared against exclusive, one client on one name, and eight clients
/// on one name (shared: all hold it together) against eight clients on
/// eight names (exclusive: the most exclusive leases can share); pairs
/// alternated, `BENCH_ROUNDS` of them.
async fn named_handover_and_shared(pool: &PgPool, secs: f64) -> Result<(), Error> {
    const ROUNDS: usize = 40;
    println!(
        "\nHandover to a named successor waiting in line, from the holder's call to the \
         successor holding the lease ({ROUNDS} rounds each, alternated)"
    );
    println!("| way | p50 ms | p99 ms | call p50 ms |\n|---|---:|---:|---:|");
    let holder = LeaseManager::new(pool.clone());
    let waiter = LeaseManager::new(pool.clone());
    let (mut handed, mut released) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for round in 0..ROUNDS * 2 {
        let by_handover = round % 2 == 0;
        let name = format!("named-{round}");
        let held = holder
            .acquire(&name, AcquireOptions::ttl(LONG).holder("holder"))
            .await?;
        let task = {
            let (waiter, name) = (waiter.clone(), name.clone());
            tokio::spawn(async move {
                let how = AcquireOptions::ttl(LONG)
                    .holder("successor")
                    .fair(true)
                    .wait(LONG);
                let got = waiter.acquire(&name, how).await;
                (got, Instant::now())
            })
        };
        while !waiter
            .line(&name)
            .await?
            .iter()
            .any(|p| p.holder == "successor")
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let called = Instant::now();
        if by_handover {
            holder.hand_over(&held, "successor", LONG).await?;
        } else {
            holder.release(&held).await?;
        }
        let call = called.elapsed();
        let (got, at) = task.await.expect("successor task");
        let lease = got?;
        let into = if by_handover {
            &mut handed
        } else {
            &mut released
        };
        into.0.push(at - called);
        into.1.push(call);
        waiter.release(&lease).await?;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (label, (latencies, calls)) in [
        ("hand_over to the waiting successor", &handed),
        (
            "release, then the same fair waiter's acquisition (baseline)",
            &released,
        ),
    ] {
        println!(
            "| {label} | {:.2} | {:.2} | {:.2} |",
            ms(median(latencies)),
            ms(percentile(latencies, 0.99)),
            ms(median(calls))
        );
    }
    println!(
        "handover / baseline, p50: {:.2}",
        median(&handed.0).as_secs_f64() / median(&released.0).as_secs_f64()
    );

    let rounds = bench_rounds(3) as u32;
    println!(
        "\nShared beside exclusive: acquire + release cycles through the library \
         ({rounds} pairs alternated, {secs} s each)"
    );
    println!(
        "| cycle | clients | exclusive ops/s | shared ops/s | shared / exclusive |\n|---|---:|---:|---:|---:|"
    );
    let m = LeaseManager::new(pool.clone());
    for (clients, names) in [
        (1_usize, "one name"),
        (8, "exclusive: 8 names; shared: 1 name"),
    ] {
        let cycle = |shared: bool| {
            let m = m.clone();
            op(move |c| {
                let m = m.clone();
                async move {
                    let name = if shared {
                        "shared-bench".to_owned()
                    } else {
                        format!("exclusive-bench-{c}")
                    };
                    let how = AcquireOptions::ttl(LONG).holder("bench").shared(shared);
                    let lease = m.acquire(&name, how).await?;
                    m.release(&lease).await?;
                    Ok(())
                }
            })
        };
        let (exclusive, shared) =
            alternate(clients, secs * 2.0, rounds, cycle(false), cycle(true)).await;
        println!(
            "| acquire + release ({names}) | {clients} | {exclusive:.0} | {shared:.0} | {:.2} |",
            shared / exclusive
        );
    }
    Ok(())
}

/// A session waiting for an advisory lock: when it got it, and its
/// connection.
type AdvisoryWaiter = tokio::task::JoinHandle<Result<(Instant, sqlx::PgConnection), sqlx::Error>>;

/// The advisory-lock baseline: a session (returned, with its process id)
/// holds lock `key`; another waits for it in the server (the task returns
/// when it got it, and its connection); 100 ms after the wait began.
async fn advisory_waiter(
    pool: &PgPool,
    key: i64,
) -> Result<(sqlx::PgConnection, i32, AdvisoryWaiter), Error> {
    let mut holding = pool.acquire().await?.detach();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid() FROM pg_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut holding)
        .await?;
    let mut blocked = pool.acquire().await?.detach();
    let task = tokio::spawn(async move {
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(key)
            .execute(&mut blocked)
            .await
            .map(|_| (Instant::now(), blocked))
    });
    wait_for_advisory_waiter(pool, key).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok((holding, pid, task))
}

/// Returns once a session waits in the server for advisory lock `key`.
async fn wait_for_advisory_waiter(pool: &PgPool, key: i64) -> Result<(), Error> {
    loop {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
               AND NOT granted AND objid = ($1::bigint & 4294967295)::oid)",
        )
        .bind(key)
        .fetch_one(pool)
        .await?;
        if waiting {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A waiter's acquisition of `name` on a task of its own (with the instant
/// it returned), once the waiter has tried, gone to sleep and had 100 ms
/// to settle there (a poller's backoff begun, a server-side wait entered);
/// and the waiter's attempts counted before it started.
async fn waiting_acquirer(
    waiter: &LeaseManager,
    name: &str,
) -> (
    tokio::task::JoinHandle<(Result<Lease, Error>, Instant)>,
    u64,
) {
    let attempts = waiter.stats().acquire_attempts;
    let task = {
        let (waiter, name) = (waiter.clone(), name.to_owned());
        tokio::spawn(async move {
            let got = waiter
                .acquire(&name, AcquireOptions::ttl(LONG).holder("waiter").wait(LONG))
                .await;
            (got, Instant::now())
        })
    };
    while waiter.stats().acquire_attempts == attempts || waiter.stats().waiting == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    (task, attempts)
}

/// Tops `pglease.leases` up to `rows` rows with other leases, half of them
/// held and half released, as a busy installation would have.
async fn fill(pool: &PgPool, rows: i64) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO pglease.leases (name, holder, token, expires_at, acquired_at) \
         SELECT 'filler-' || g, CASE WHEN g % 2 = 0 THEN 'filler' END, g, \
                CASE WHEN g % 2 = 0 THEN now() + interval '1 day' ELSE now() END, now() \
           FROM generate_series((SELECT count(*) FROM pglease.leases) + 1, $1) AS g",
    )
    .bind(rows)
    .execute(pool)
    .await?;
    sqlx::query("VACUUM ANALYZE pglease.leases")
        .execute(pool)
        .await?;
    Ok(())
}

/// P5: acquire (with release) and renew on a leases table of 1,000 rows
/// and on one of 1,000,000 rows (a second database), alternated.
async fn scale(small: &PgPool, secs: f64) -> Result<(), Error> {
    const BIG: &str = "pglease_bench_1m";
    let big = fresh_database(BIG, 8).await?;
    let (small_m, big_m) = (
        LeaseManager::new(small.clone()),
        LeaseManager::new(big.clone()),
    );
    big_m.migrate().await?;
    let started = Instant::now();
    fill(&big, 1_000_000).await?;
    fill(small, 1_000).await?;
    println!(
        "\nScale: the same operations with 1,000 and with 1,000,000 lease rows \
         (filled in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    println!(
        "| operation | clients | 1,000 rows ops/s | 1,000,000 rows ops/s | ratio |\n\
         |---|---:|---:|---:|---:|"
    );
    let mut tokens = Vec::new();
    for m in [&small_m, &big_m] {
        let mut mine = Vec::new();
        for c in 0..8 {
            mine.push(
                m.acquire(
                    &format!("scale-held-{c}"),
                    AcquireOptions::ttl(LONG).holder("bench"),
                )
                .await?,
            );
        }
        tokens.push(Arc::new(mine));
    }
    for clients in [1usize, 8] {
        let rows: [(&str, Op, Op); 2] = [
            ("acquire + release", lib_cycle(&small_m), lib_cycle(&big_m)),
            (
                "renew",
                lib_renew(&small_m, &tokens[0]),
                lib_renew(&big_m, &tokens[1]),
            ),
        ];
        for (label, at_small, at_big) in rows {
            // Twice the alternations of the other tables: two runs with
            // two alternations gave 0.83 to 1.11 for the same rows, as the
            // commit rate drifts during a run.
            let (s, b) = alternate(clients, secs, 4, at_small, at_big).await;
            println!("| {label} | {clients} | {s:.0} | {b:.0} | {:.2} |", b / s);
        }
    }
    big.close().await;
    drop_database(BIG).await
}

/// P4: a holder acquires with a 1 s TTL and then either dies without
/// releasing, or freezes inside a fenced transaction (left open and idle,
/// as by a stopped process); a waiter (listening) takes over. Reported:
/// time from the holder's expiry to the waiter's acquisition (both on the
/// database clock), and from the holder's acquisition, which must stay
/// within TTL + 1 s. The two kinds alternate, round by round.
async fn takeover(pool: &PgPool) -> Result<(), Error> {
    const TTL: Duration = Duration::from_secs(1);
    const ROUNDS: usize = 7;
    let waiter = LeaseManager::new(pool.clone());
    let holder = LeaseManager::new(pool.clone());
    // [dead, frozen]: (after expiry, after acquisition)
    let mut after: [(Vec<Duration>, Vec<Duration>); 2] = Default::default();
    for round in 0..ROUNDS {
        for (kind, frozen) in [false, true].into_iter().enumerate() {
            let name = format!("takeover-{round}-{kind}");
            let start = Instant::now();
            let lease = holder
                .acquire(&name, AcquireOptions::ttl(TTL).holder("holder"))
                .await?;
            let fenced = if frozen {
                Some(holder.begin_fenced(&lease).await?)
            } else {
                None
            };
            let got = waiter
                .acquire(&name, AcquireOptions::ttl(LONG).holder("waiter").wait(LONG))
                .await?;
            after[kind].1.push(start.elapsed());
            after[kind].0.push(
                (got.acquired_at() - lease.expires_at())
                    .to_std()
                    .unwrap_or_default(),
            );
            // The frozen holder's session was ended by the takeover.
            drop(fenced);
            waiter.release(&got).await?;
        }
    }
    println!(
        "\nTakeover, TTL 1 s, {ROUNDS} rounds each (bound: TTL + 1 s = 2000 ms after the acquisition):\n\n\
         | old holder | after its expiry, median | worst | after its acquisition, median | worst |\n\
         |---|---:|---:|---:|---:|"
    );
    for (kind, label) in ["died", "frozen inside a fenced transaction"]
        .iter()
        .enumerate()
    {
        let (expiry, acquisition) = &after[kind];
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {label} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |",
            ms(median(expiry)),
            ms(expiry.iter().max().copied().unwrap_or_default()),
            ms(median(acquisition)),
            ms(acquisition.iter().max().copied().unwrap_or_default()),
        );
    }
    Ok(())
}

/// This process's CPU time (user + system) so far.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (in parentheses): utime and stime
    // are the 12th and 13th of them, in clock ticks (100 per second).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// What durable renewals cost: a manager holding 1,000 leases (TTL 3 s, so
/// renewed every second) for 10 s on a database whose sessions run with
/// `synchronous_commit = off`, as services set it for throughput. Renewals
/// raise it to `on` for their own transaction (an acknowledged renewal must
/// survive a crash), so each renewal statement is one commit that waits
/// for its WAL flush: counted per renewal period, beside the server's WAL
/// flushes (`pg_stat_wal.wal_sync`, PostgreSQL 14 to 17) with and without
/// the leases held.
async fn renewal_flushes() -> Result<(), Error> {
    const NAME: &str = "pglease_bench_flushes";
    const LEASES: usize = 1_000;
    const TTL: Duration = Duration::from_secs(3);
    const WINDOW: Duration = Duration::from_secs(10);
    let pool = fresh_database(NAME, 4).await?;
    LeaseManager::new(pool.clone()).migrate().await?;
    sqlx::query(AssertSqlSafe(format!(
        "ALTER DATABASE {NAME} SET synchronous_commit = off"
    )))
    .execute(&pool)
    .await?;
    pool.close().await;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(server().await?.database(NAME))
        .await?;
    let m = LeaseManager::new(pool.clone());
    let syncs = || async {
        sqlx::query_scalar::<_, i64>("SELECT wal_sync FROM pg_stat_wal")
            .fetch_one(&pool)
            .await
    };
    // The server's own flushes, nothing held: the baseline.
    sqlx::raw_sql("VACUUM ANALYZE").execute(&pool).await?;
    sqlx::raw_sql("CHECKPOINT").execute(&pool).await?;
    let idle = syncs().await?;
    tokio::time::sleep(WINDOW).await;
    let idle = syncs().await? - idle;
    let mut held = Vec::with_capacity(LEASES);
    for i in 0..LEASES {
        held.push(
            m.hold(
                &format!("flush-{i}"),
                AcquireOptions::ttl(TTL).holder("bench"),
            )
            .await?,
        );
    }
    // The acquisitions' dead rows vacuumed now rather than by autovacuum
    // in the window; from the next renewal on.
    sqlx::raw_sql("VACUUM ANALYZE").execute(&pool).await?;
    let first = m.stats().renewal_statements;
    let deadline = Instant::now() + TTL * 10;
    while m.stats().renewal_statements == first {
        if Instant::now() > deadline {
            return Err(Error::Database(sqlx::Error::Configuration(
                "no renewal within ten TTLs".into(),
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (statements, renewed, synced) = (
        m.stats().renewal_statements,
        m.stats().leases_renewed,
        syncs().await?,
    );
    tokio::time::sleep(WINDOW).await;
    let statements = m.stats().renewal_statements - statements;
    let renewed = m.stats().leases_renewed - renewed;
    let synced = syncs().await? - synced;
    let periods = WINDOW.as_secs_f64() / (TTL.as_secs_f64() / 3.0);
    println!(
        "durable renewals: {LEASES} leases held (TTL {TTL:?}, renewed every {:?}) for \
         {WINDOW:?} at synchronous_commit = off: {statements} renewal statements ({:.1} per \
         renewal period), each one commit that waits for its WAL flush, renewed {renewed} \
         leases; one statement per lease would be {LEASES} such commits per period. The server \
         made {synced} WAL flushes in all (pg_stat_wal.wal_sync, the WAL writer's included, \
         which flushes asynchronous commits too), {idle} in the same time with nothing held",
        TTL / 3,
        statements as f64 / periods
    );
    drop(held);
    m.shutdown().await?;
    pool.close().await;
    drop_database(NAME).await
}

/// P2b: one manager holds 100,000 leases (TTL 60 s, renewed every 20 s)
/// for two renewal periods. Reported: renewal statements and leases
/// renewed per period, the server time of one renewal statement (from
/// pg_stat_user_functions), this process's CPU per period (the manager
/// and its renewal task; nothing else runs meanwhile), and 1,000 failed
/// acquisitions of held names: transactions given an id, tokens drawn
/// (the WAL of their own is nil without an id; the server's WAL meanwhile
/// counts the renewals).
async fn many_leases() -> Result<(), Error> {
    const TTL: Duration = Duration::from_secs(60);
    const NAME: &str = "pglease_bench_p2b";
    // BENCH_LEASES: another number of leases (default 100,000).
    let leases: usize = std::env::var("BENCH_LEASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let pool = fresh_database(NAME, 16).await?;
    let m = LeaseManager::new(pool.clone());
    m.migrate().await?;
    // Server time per function call, where this role may turn it on.
    let tracked = sqlx::query(AssertSqlSafe(format!(
        "ALTER DATABASE {NAME} SET track_functions = 'pl'"
    )))
    .execute(&pool)
    .await
    .is_ok();
    pool.close().await;
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_with(server().await?.database(NAME))
        .await?;
    let m = LeaseManager::new(pool.clone());
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (m, next) = (m.clone(), next.clone());
            tokio::spawn(async move {
                let mut held = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= leases {
                        return Ok::<_, Error>(held);
                    }
                    held.push(
                        m.hold(
                            &format!("p2b-{i}"),
                            AcquireOptions::ttl(TTL).holder("bench"),
                        )
                        .await?,
                    );
                }
            })
        })
        .collect();
    let mut held = Vec::with_capacity(leases);
    for task in tasks {
        held.extend(task.await.expect("holder task")?);
    }
    println!(
        "\nMany leases: one manager holds {leases} (TTL 60 s, renewed every 20 s); \
         acquired in {:.1} s by 16 tasks",
        started.elapsed().as_secs_f64()
    );
    // Two full periods from now.
    sqlx::query("SELECT pg_stat_reset()")
        .execute(&pool)
        .await
        .ok();
    let (stats, cpu, at) = (m.stats(), process_cpu(), Instant::now());
    let window = Duration::from_secs(40);
    tokio::time::sleep(window).await;
    let (after, cpu_after, took) = (m.stats(), process_cpu(), at.elapsed());
    let periods = took.as_secs_f64() / 20.0;
    let statements = after.renewal_statements - stats.renewal_statements;
    let renewed = after.leases_renewed - stats.leases_renewed;
    let lost = held.iter().filter(|h| h.is_lost()).count();
    println!(
        "| per renewal period (20 s) | value |\n|---|---:|\n\
         | renewal statements | {:.1} (at most {} leases each) |\n\
         | leases renewed | {:.0} |\n\
         | client CPU (this process) | {:.0} ms ({:.2} % of one core) |\n\
         | renewal failures, leases lost | {}, {lost} |",
        statements as f64 / periods,
        5000,
        renewed as f64 / periods,
        (cpu_after - cpu).as_secs_f64() * 1e3 / periods,
        (cpu_after - cpu).as_secs_f64() * 100.0 / took.as_secs_f64(),
        after.renewal_failures - stats.renewal_failures,
    );
    if tracked {
        let row: Option<(i64, f64)> = sqlx::query_as(
            "SELECT calls, total_time FROM pg_stat_user_functions \
              WHERE schemaname = 'pglease' AND funcname = 'renew_many'",
        )
        .fetch_optional(&pool)
        .await?;
        if let Some((calls, total)) = row.filter(|(calls, _)| *calls > 0) {
            println!(
                "| server time of one renewal statement | {:.1} ms (mean of {calls}) |",
                total / calls as f64
            );
        }
    }
    // Failed acquisitions of held names.
    let other = LeaseManager::new(pool.clone());
    let token: i64 = sqlx::query_scalar("SELECT last_value FROM pglease.fence_seq")
        .fetch_one(&pool)
        .await?;
    let mut with_xid = 0;
    let mut conn = pool.acquire().await?;
    for i in 0..1000 {
        sqlx::query("BEGIN").execute(&mut *conn).await?;
        let row: (Option<i64>, bool) = sqlx::query_as(
            "SELECT token, pg_current_xact_id_if_assigned() IS NOT NULL \
               FROM pglease.acquire($1, 'other', '1 min')",
        )
        .bind(format!("p2b-{}", i * 97 % leases))
        .fetch_one(&mut *conn)
        .await?;
        sqlx::query("COMMIT").execute(&mut *conn).await?;
        assert!(row.0.is_none(), "a held lease was acquired");
        with_xid += usize::from(row.1);
    }
    drop(conn);
    let token_after: i64 = sqlx::query_scalar("SELECT last_value FROM pglease.fence_seq")
        .fetch_one(&pool)
        .await?;
    let refused = other
        .acquire("p2b-1", AcquireOptions::ttl(TTL).holder("other"))
        .await;
    assert!(matches!(refused, Err(Error::Held { .. })));
    println!(
        "| 1,000 failed acquisitions of held names | {with_xid} given a transaction id \
         (none: no WAL record of their own, no commit flush), {} tokens drawn |",
        token_after - token
    );
    drop(held);
    m.shutdown().await?;
    pool.close().await;
    drop_database(NAME).await
}

/// P4c: a session-bound holder's server session is terminated while a
/// waiter waits; from the `pg_terminate_backend` call to the waiter holding
/// the lease, beside an advisory-lock waiter blocked on a session lock
/// whose holder's session is terminated the same way (alternated, round by
/// round). The lease's TTL is an hour: only the session's end can free it.
async fn session_bound_takeover(pool: &PgPool) -> Result<(), Error> {
    const ROUNDS: usize = 15;
    let holder = LeaseManager::new(pool.clone());
    let waiter = LeaseManager::new(pool.clone());
    let (mut leases, mut advisory) = (Vec::new(), Vec::new());
    // Attempts the waiter made after its first, round by round.
    let mut attempts_after = Vec::new();
    for round in 0..ROUNDS {
        // pglease: the holder's manager opens a new session for each round
        // (the last one was terminated).
        let name = format!("p4c-{round}");
        let held = holder
            .acquire(
                &name,
                AcquireOptions::ttl(LONG)
                    .holder("holder")
                    .session_bound(true),
            )
            .await?;
        let pid = holder
            .inspect(&name)
            .await?
            .holder_session
            .expect("a session-bound lease");
        let (task, attempts) = waiting_acquirer(&waiter, &name).await;
        let ended = Instant::now();
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(pool)
            .await?;
        let (got, at) = task.await.expect("waiter task");
        let got = got?;
        assert!(got.token() > held.token());
        leases.push(at - ended);
        attempts_after.push(waiter.stats().acquire_attempts - attempts - 1);
        waiter.release(&got).await?;

        // The advisory lock: one session holds it, another blocks on it.
        let key = 0x7034_6300_i64 + round as i64;
        let (holding, pid, task) = advisory_waiter(pool, key).await?;
        let ended = Instant::now();
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(pool)
            .await?;
        let (at, blocked) = task.await.expect("advisory waiter")?;
        advisory.push(at - ended);
        drop(holding);
        blocked.close().await?;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let worst = |v: &[Duration]| v.iter().max().copied().unwrap_or_default();
    println!(
        "\nP4c: the holder's server session terminated while a waiter waits, until the \
         waiter holds ({ROUNDS} rounds each, alternated; the lease's TTL is 1 h)\n\n\
         | waiter | median | worst |\n|---|---:|---:|\n\
         | pglease, session-bound lease | {:.1} ms | {:.1} ms |\n\
         | advisory lock (pg_advisory_lock, no token) | {:.1} ms | {:.1} ms |\n\
         ratio of medians (pglease / advisory): {:.2}; the waiter's attempts after its \
         first, by round: {attempts_after:?}",
        ms(median(&leases)),
        ms(worst(&leases)),
        ms(median(&advisory)),
        ms(worst(&advisory)),
        median(&leases).as_secs_f64() / median(&advisory).as_secs_f64(),
    );
    Ok(())
}

/// Leader election: what notifying observers costs an acquire+release
/// cycle (nobody observing, every cycled name observed), the handover on `resign()`, and the failover after the
/// leader dies, beside River's and client-go's defaults.
async fn election(pool: &PgPool, secs: f64) -> Result<(), Error> {
    println!(
        "\nNotifying observers (with the history off) on library acquire+release cycles, \
         alternated in one run:\n\n\
         | clients | nobody observes ops/s | every name observed ops/s | ratio |\n\
         |---:|---:|---:|---:|"
    );
    // The history off (its cost is the history section's), so that this
    // is what notifying costs.
    set_history(pool, false).await?;
    let m = &LeaseManager::new(pool.clone());
    for clients in [1usize, 8] {
        let (mut quiet, mut observed) = (0.0, 0.0);
        for _ in 0..2 {
            quiet += rate(clients, secs / 2.0, lib_cycle(m)).await;
            let mut readers = Vec::new();
            for c in 0..clients {
                let mut observer = m.observe(&format!("cycle-{c}")).await?;
                readers.push(tokio::spawn(async move {
                    while observer.next().await.is_ok() {}
                }));
            }
            observed += rate(clients, secs / 2.0, lib_cycle(m)).await;
            for reader in readers {
                reader.abort();
            }
        }
        println!(
            "| {clients} | {:.0} | {:.0} | {:.2} |",
            quiet / 2.0,
            observed / 2.0,
            observed / quiet
        );
    }
    set_history(pool, true).await?;

    // Two candidates on managers (pools) of their own, as two replicas.
    let options = pool.connect_options().as_ref().clone();
    let replica = async || -> Result<LeaseManager, Error> {
        let pool = PgPoolOptions::new()
            .max_connections(3)
            .connect_with(options.clone())
            .await?;
        Ok(LeaseManager::new(pool))
    };
    let (a, b) = (replica().await?, replica().await?);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;

    // Handover on resign: the follower campaigns (and waits for the
    // release notification) when the leader resigns.
    const ROUNDS: usize = 40;
    let mut handovers = Vec::new();
    for round in 0..ROUNDS {
        let name = format!("elect-{round}");
        let how = AcquireOptions::ttl(Duration::from_secs(15));
        let leader = Arc::new(a.elector(&name, how.clone().holder("a"))?);
        let led = campaign(&leader);
        leader
            .watch_leadership()
            .wait_for(|l| matches!(l, Leadership::Leading { .. }))
            .await
            .expect("the leader leads");
        let follower = Arc::new(b.elector(&name, how.holder("b"))?);
        let follows = campaign(&follower);
        while follower.leader().is_none() || b.stats().waiting == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut leading = follower.watch_leadership();
        let resigned = Instant::now();
        leader.resign();
        leading
            .wait_for(|l| matches!(l, Leadership::Leading { .. }))
            .await
            .expect("the follower leads");
        handovers.push(resigned.elapsed());
        follower.resign();
        led.await.expect("leader task")?;
        follows.await.expect("follower task")?;
    }

    // Failover after the leader dies: its lease is acquired and never
    // renewed nor released (a leader that died right after a renewal, the
    // worst case); the candidate leads once it has expired.
    const TTL: Duration = Duration::from_secs(1);
    const DEATHS: usize = 15;
    let mut failovers = Vec::new();
    for round in 0..DEATHS {
        let name = format!("death-{round}");
        let dead = a
            .acquire(&name, AcquireOptions::ttl(TTL).holder("dead"))
            .await?;
        let candidate = Arc::new(b.elector(&name, AcquireOptions::ttl(TTL).holder("b"))?);
        let runs = campaign(&candidate);
        candidate
            .watch_leadership()
            .wait_for(|l| matches!(l, Leadership::Leading { .. }))
            .await
            .expect("the candidate leads");
        let term = candidate.term().expect("a term");
        failovers.push(
            (term.lease().acquired_at() - dead.expires_at())
                .to_std()
                .unwrap_or_default(),
        );
        candidate.resign();
        runs.await.expect("candidate task")?;
    }
    println!(
        "\nLeader election, measured: handover on resign() ({ROUNDS} rounds; the follower on \
         another manager, listening), and the new term's acquisition after the dead leader's \
         expiry (TTL 1 s, {DEATHS} rounds; database clock):\n\n\
         | | p50 | p99 |\n|---|---:|---:|\n\
         | handover on resign | {:.1} ms | {:.1} ms |\n\
         | new leader after the dead leader's expiry | {:.1} ms | {:.1} ms |",
        ms(median(&handovers)),
        ms(percentile(&handovers, 0.99)),
        ms(median(&failovers)),
        ms(percentile(&failovers, 0.99)),
    );
    println!(
        "\nBeside the defaults of other electors (derived from their settings, not measured):\n\n\
         | | pglease, TTL 15 s | River (5 s elect interval, 15 s TTL) | client-go (15 s lease, 2 s retry) |\n\
         |---|---|---|---|\n\
         | handover on a clean stop | {:.0} ms (p50, measured) | at once (a resign notification) | up to 2.4 s (next retry) |\n\
         | failover after the leader dies | 10 to 15 s + {:.0} ms (the lease's remaining TTL, renewed every 5 s) | 10 to 21 s (remaining TTL, then a 5 s ± 1 s poll) | about 15 to 17.4 s (lease duration, then a retry) |",
        ms(median(&handovers)),
        ms(median(&failovers)),
    );
    a.shutdown().await?;
    b.shutdown().await?;
    Ok(())
}

/// Turns the history off (`pglease.set_history('0')`, the documented off
/// switch, an administrator's) or on again with the default retention.
async fn set_history(pool: &PgPool, on: bool) -> Result<(), Error> {
    let retention = if on { "30 days" } else { "0" };
    sqlx::query("SELECT pglease.set_history($1::interval)")
        .bind(retention)
        .execute(pool)
        .await?;
    Ok(())
}

/// The history's cost: library acquire+release cycles with the history off
/// (`pglease.set_history('0')`) and on, alternated in one run.
async fn history_cost(pool: &PgPool, m: &LeaseManager, secs: f64) -> Result<(), Error> {
    println!(
        "\nThe history on library acquire+release cycles, off (pglease.set_history('0')) \
         and on, alternated in one run:\n\n\
         | clients | without history ops/s | with history ops/s | ratio |\n|---:|---:|---:|---:|"
    );
    for clients in [1usize, 8] {
        let (mut off, mut on) = (0.0, 0.0);
        for _ in 0..2 {
            set_history(pool, false).await?;
            off += rate(clients, secs / 2.0, lib_cycle(m)).await;
            set_history(pool, true).await?;
            on += rate(clients, secs / 2.0, lib_cycle(m)).await;
        }
        println!(
            "| {clients} | {:.0} | {:.0} | {:.2} |",
            off / 2.0,
            on / 2.0,
            on / off
        );
    }
    Ok(())
}

/// The status of 100,000 leases (half held), as `status` reads it: all of
/// them, and filtered in the database.
async fn status_scale(pool: &PgPool, m: &LeaseManager) -> Result<(), Error> {
    const ROWS: i64 = 100_000;
    fill(pool, ROWS).await?;
    let filters = [
        ("all", ListFilter::default()),
        ("--held", ListFilter::default().held()),
        (
            "--prefix filler-4242",
            ListFilter::default().prefix("filler-4242"),
        ),
        ("--limit 100", ListFilter::default().limit(100)),
        (
            "--held --limit 100",
            ListFilter::default().held().limit(100),
        ),
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); filters.len()];
    let mut counts = vec![0usize; filters.len()];
    for _ in 0..5 {
        for (i, (_, filter)) in filters.iter().enumerate() {
            let start = Instant::now();
            counts[i] = m.list_matching(filter).await?.len();
            times[i].push(start.elapsed());
        }
    }
    let all = median(&times[0]).as_secs_f64();
    println!(
        "\nstatus of {ROWS} leases (library list_matching, as `pglease status` reads them; \
         median of 5):\n\n| filter | leases | ms | / all |\n|---|---:|---:|---:|"
    );
    for (i, (label, _)) in filters.iter().enumerate() {
        let t = median(&times[i]).as_secs_f64();
        println!(
            "| {label} | {} | {:.1} | {:.3} |",
            counts[i],
            t * 1e3,
            t / all
        );
    }
    Ok(())
}

/// Runs `elector` on a task of its own, with work that does nothing.
fn campaign(elector: &Arc<Elector>) -> tokio::task::JoinHandle<Result<(), Error>> {
    let elector = Arc::clone(elector);
    tokio::spawn(async move { elector.run(async |_term| {}).await })
}

/// Cost of a protected table per written row: the same fenced transaction
/// (declaration included) inserting into an unprotected table, a table
/// protected by pglease.protect (statement-level trigger) and one guarded
/// by the same check as a row-level trigger.
async fn protect_overhead(pool: &PgPool, m: &LeaseManager, secs: f64) -> Result<(), Error> {
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

/// Lease operations through PgBouncer (transaction mode, as many server
/// sessions as clients) beside the same operations on direct connections,
/// alternated. The write in the fenced transaction is an unnamed statement
/// on both sides (`persistent(false)`), as it must be through a pooler
/// without prepared-statement support.
async fn through_pooler(
    pool: &PgPool,
    m: &LeaseManager,
    leases: &Arc<Vec<Lease>>,
    secs: f64,
) -> Result<(), Error> {
    let server = pool.connect_options();
    let started = PgBouncer::builder().server_pool(8).start(&server);
    let Some(bouncer) = kit("Through PgBouncer", started)? else {
        return Ok(());
    };
    let pooled_pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(bouncer.options(&server))
        .await?;
    let pooled = LeaseManager::new(pooled_pool);
    println!(
        "\nThrough PgBouncer {} (pool_mode = transaction, 8 server sessions) vs direct, \
         alternated\n| operation | clients | direct ops/s | through PgBouncer ops/s | ratio |\n\
         |---|---:|---:|---:|---:|",
        PgBouncer::version().unwrap_or_default()
    );
    for clients in [1usize, 8] {
        let rows: Vec<(&str, Op, Op)> = vec![
            ("acquire + release", lib_cycle(m), lib_cycle(&pooled)),
            ("renew", lib_renew(m, leases), lib_renew(&pooled, leases)),
            (
                "fenced transaction, one write",
                lib_fenced(m, leases, false),
                lib_fenced(&pooled, leases, false),
            ),
        ];
        for (label, direct, through) in rows {
            let (d, p) = alternate(clients, secs, 2, direct, through).await;
            println!("| {label} | {clients} | {d:.0} | {p:.0} | {:.2} |", p / d);
        }
    }
    Ok(())
}

/// What TLS costs per operation: on the TLS formation (a non-superuser
/// owner, `scram-sha-256`), plain connections allowed beside TLS for the
/// baseline, the same operations through a manager connected with
/// `sslmode=disable` and one with `sslmode=verify-full`, alternated.
async fn tls_cost(secs: f64) -> Result<(), Error> {
    let Some(server) = kit("TLS", pglease_formations::TlsServer::start().await)? else {
        return Ok(());
    };
    server
        .allow_plain()
        .await
        .map_err(|e| Error::Database(sqlx::Error::Configuration(Box::new(e))))?;
    let plain = LeaseManager::connect(&server.url("sslmode=disable")).await?;
    let tls = LeaseManager::connect(&server.url("sslmode=verify-full")).await?;
    plain.migrate().await?;
    sqlx::raw_sql(
        "CREATE TABLE data (id int PRIMARY KEY, value bigint NOT NULL); \
         INSERT INTO data SELECT g, 0 FROM generate_series(0, 15) g",
    )
    .execute(plain.pool())
    .await?;
    let mut held = Vec::new();
    for c in 0..8 {
        held.push(
            plain
                .acquire(
                    &format!("held-{c}"),
                    AcquireOptions::ttl(LONG).holder("bench"),
                )
                .await?,
        );
    }
    let held = Arc::new(held);
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(tls.pool())
            .await?;
    let version: String = sqlx::query_scalar(
        "SELECT coalesce(version || ' ' || cipher, 'none') FROM pg_stat_ssl \
         WHERE pid = pg_backend_pid()",
    )
    .fetch_one(tls.pool())
    .await?;
    println!(
        "\nTLS per operation: the TLS formation, as its non-superuser owner, \
         sslmode=disable vs verify-full ({version}, encrypted: {encrypted}), alternated\n\
         | operation | clients | without TLS ops/s | with TLS ops/s | with / without |\n\
         |---|---:|---:|---:|---:|"
    );
    for clients in [1usize, 8] {
        let rows: Vec<(&str, Op, Op)> = vec![
            ("acquire + release", lib_cycle(&plain), lib_cycle(&tls)),
            ("renew", lib_renew(&plain, &held), lib_renew(&tls, &held)),
            (
                "fenced transaction, one write",
                lib_fenced(&plain, &held, false),
                lib_fenced(&tls, &held, false),
            ),
        ];
        for (label, without, with) in rows {
            let (a, b) = alternate(clients, secs, 3, without, with).await;
            println!("| {label} | {clients} | {a:.0} | {b:.0} | {:.2} |", b / a);
        }
    }
    Ok(())
}

/// P4 across a failover: a lease held (TTL 6 s, renewed every 2 s) through
/// a stable endpoint; the primary is killed at a random point of the
/// renewal period, the synchronous standby promoted at once and the
/// endpoint re-pointed. Time from the crash to the promotion, and to the
/// first renewal the promoted standby confirmed; a round whose promotion
/// took too long for the TTL ends with the lease lost, and is counted (with
/// how long the promotion took and how soon the holder was told) instead
/// of timed.
async fn failover() -> Result<(), Error> {
    const ROUNDS: usize = 5;
    let mut promoted = Vec::new();
    let mut renewed = Vec::new();
    let mut lost = Vec::new();
    let mut direct_renewed = Vec::new();
    let mut direct_lost = Vec::new();
    for round in 0..ROUNDS {
        let Some(pair) = kit("Failover", Replicated::start(Standby::Synchronous).await)? else {
            return Ok(());
        };
        let endpoint = kit("Failover", Endpoint::start(pair.primary().port()).await)?
            .expect("an endpoint needs nothing from the machine");
        let admin = kit("Failover", pair.primary().pool().await)?.expect("a pool");
        LeaseManager::new(admin.clone()).migrate().await?;
        admin.close().await;
        let leases = LeaseManager::new(
            pglease::connect::pool_options()
                .acquire_timeout(Duration::from_secs(1))
                .connect_lazy_with(endpoint.options()),
        );
        let held = leases
            .hold(
                "job",
                AcquireOptions::ttl(Duration::from_secs(6)).holder("bench"),
            )
            .await?;
        // Beside it, no endpoint: the URL names both servers.
        let direct = LeaseManager::connect(&format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres",
            pair.primary().port(),
            pair.standby().port()
        ))
        .await?;
        let direct_held = direct
            .hold(
                "direct",
                AcquireOptions::ttl(Duration::from_secs(6)).holder("bench"),
            )
            .await?;
        // A random point of the 2 s renewal period.
        let random = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            round,
        );
        let phase = Duration::from_millis(random % 2000);
        tokio::time::sleep(phase).await;
        let before = leases.stats().leases_renewed;
        let direct_before = direct.stats().leases_renewed;
        let crashed = Instant::now();
        kit("Failover", pair.crash_primary())?;
        kit("Failover", pair.promote().await)?;
        endpoint.repoint(pair.standby().port());
        let promotion = crashed.elapsed();
        promoted.push(promotion);
        loop {
            if leases.stats().leases_renewed != before {
                renewed.push(crashed.elapsed());
                break;
            }
            if let Some(at) = held.lost_at() {
                // Told before the database's expiry: safe, but not kept.
                let told = at.saturating_duration_since(crashed);
                lost.push((promotion, told));
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        loop {
            if direct.stats().leases_renewed != direct_before {
                direct_renewed.push(crashed.elapsed());
                break;
            }
            if let Some(at) = direct_held.lost_at() {
                direct_lost.push(at.saturating_duration_since(crashed));
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), held.release()).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), direct_held.release()).await;
        direct.shutdown().await?;
    }
    promoted.sort();
    renewed.sort();
    direct_renewed.sort();
    let ms = |d: Duration| d.as_millis();
    let median_worst = |v: &[Duration]| match v {
        [] => "- | -".to_owned(),
        v => format!("{} ms | {} ms", ms(v[v.len() / 2]), ms(v[v.len() - 1])),
    };
    println!(
        "\nFailover, {ROUNDS} rounds: a lease held through a stable endpoint (TTL 6 s, renewed \
         every 2 s), the primary killed, the synchronous standby promoted at once\n\
         | from the crash to | median | worst |\n|---|---:|---:|\n\
         | the standby promoted, endpoint re-pointed | {} |\n\
         | the first renewal confirmed by the promoted standby ({} rounds) | {} |\n\
         | the same, no endpoint: a multi-host URL ({} rounds) | {} |",
        median_worst(&promoted),
        renewed.len(),
        median_worst(&renewed),
        direct_renewed.len(),
        median_worst(&direct_renewed),
    );
    for told in direct_lost {
        println!(
            "lost in one round (multi-host URL): the holder was told (Unreachable) {} ms after \
             the crash",
            ms(told)
        );
    }
    for (promotion, told) in lost {
        println!(
            "lost in one round: the promotion took {} ms; the holder was told (Unreachable) \
             {} ms after the crash",
            ms(promotion),
            ms(told)
        );
    }
    auto_failover().await
}

/// Under pg_auto_failover (`pglease_formations::AutoFailover`, its
/// shortened timeouts): one formation, the primary crashed in each round
/// (keeper and every PostgreSQL process stopped, then killed) while a
/// manager on the formation's multi-host URL holds a lease (TTL 15 s,
/// renewed every 5 s) and a client acquires and releases in a loop. Time
/// from the crash to the other node writable (the monitor's detection and
/// promotion), to the first renewal confirmed there, and to the first
/// acquisition there; then the old primary rejoins as a standby.
async fn auto_failover() -> Result<(), Error> {
    let rounds = bench_rounds(6);
    let Some(formation) = kit("pg_auto_failover", AutoFailover::start().await)? else {
        return Ok(());
    };
    let url = formation.url();
    let leases = LeaseManager::connect(&url).await?;
    leases.migrate().await?;
    let (mut writable, mut renewed, mut acquired, mut rejoined) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut lost = 0;
    for round in 0..rounds {
        let held = leases
            .hold(
                "job",
                AcquireOptions::ttl(Duration::from_secs(15)).holder("bench"),
            )
            .await?;
        let random = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            round,
        );
        tokio::time::sleep(Duration::from_millis(random % 5000)).await;
        let old = kit("pg_auto_failover", formation.primary().await)?.expect("a primary");
        let before = leases.stats().leases_renewed;
        // A client acquiring in a loop; the first success after the crash.
        let client = leases.clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let first: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
        let crash_mark: Arc<std::sync::OnceLock<Instant>> = Arc::default();
        let acquiring = {
            let (stop, first, crash_mark) = (stop.clone(), first.clone(), crash_mark.clone());
            tokio::spawn(async move {
                let mut n = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    // A name of its own each time: an acquisition whose
                    // answer was lost in the crash holds its name on the
                    // new primary until it expires.
                    n += 1;
                    let started = Instant::now();
                    let how = AcquireOptions::ttl(Duration::from_secs(5)).holder("client");
                    match client.acquire(&format!("load-{round}-{n}"), how).await {
                        Ok(lease) => {
                            let _ = client.release(&lease).await;
                            if crash_mark.get().is_some_and(|at| started > *at) {
                                first.lock().expect("first").get_or_insert(Instant::now());
                            }
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            })
        };
        kit("pg_auto_failover", formation.crash(old))?;
        let crashed = Instant::now();
        let _ = crash_mark.set(crashed);
        kit("pg_auto_failover", formation.wait_for_failover(old).await)?;
        writable.push(crashed.elapsed());
        loop {
            if leases.stats().leases_renewed != before {
                renewed.push(crashed.elapsed());
                break;
            }
            if held.lost_at().is_some() {
                lost += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(at) = *first.lock().expect("first") {
                acquired.push(at.saturating_duration_since(crashed));
                break;
            }
            if Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let _ = acquiring.await;
        let _ = tokio::time::timeout(Duration::from_secs(5), held.release()).await;
        let started = Instant::now();
        kit("pg_auto_failover", formation.rejoin(old).await)?;
        rejoined.push(started.elapsed());
    }
    for v in [&mut writable, &mut renewed, &mut acquired, &mut rejoined] {
        v.sort();
    }
    let ms = |d: Duration| d.as_millis();
    let row = |v: &[Duration]| match v {
        [] => "- | - | -".to_owned(),
        v => format!(
            "{} ms | {} ms | {} ms",
            ms(v[0]),
            ms(v[v.len() / 2]),
            ms(v[v.len() - 1])
        ),
    };
    let t = formation.timeouts();
    println!(
        "\npg_auto_failover, {rounds} rounds (monitor: health_check_period {:?}, \
         health_check_timeout {:?}, max_retries {}, retry_delay {:?}, \
         node_considered_unhealthy_timeout {:?}, primary_demote_timeout {:?}; keepers: \
         network_partition_timeout {:?}): the primary crashed, a lease held on the multi-host \
         URL (TTL 15 s, renewed every 5 s), a client acquiring in a loop\n\
         | from the crash to | best | median | worst |\n|---|---:|---:|---:|\n\
         | the other node writable (detection + promotion) | {} |\n\
         | the first renewal confirmed there ({} rounds) | {} |\n\
         | the first acquisition attempted after the crash acknowledged there | {} |\n\
         | (rejoin) the old primary a secondary again, from its restart | {} |",
        t.health_check_period,
        t.health_check_timeout,
        t.health_check_max_retries,
        t.health_check_retry_delay,
        t.node_considered_unhealthy_timeout,
        t.primary_demote_timeout,
        t.network_partition_timeout,
        row(&writable),
        renewed.len(),
        row(&renewed),
        row(&acquired),
        row(&rejoined),
    );
    if lost > 0 {
        println!("lost in {lost} round(s): the lease was given up before a renewal succeeded");
    }
    leases.shutdown().await?;
    Ok(())
}

// Each pair: what it measures, the raw baseline's script, pglease's,
// whether the history records (pglease.set_history), and whether a
// waiter watches every cycle name (a session that LISTENs on both
// channels and watches them, draining what it hears).
// The library level (`library_level`) runs the same pairs through sqlx.
/// The floor twin of each raw script (`bench/pgbench/floor_*.sql`): the
/// same statements inside `SECURITY DEFINER` functions (setup.sql), the
/// least a design in which the database enforces who may act must cost.
const FLOORS: [(&str, &str); 7] = [
    ("raw_cycle", "floor_cycle"),
    ("raw_cycle_history", "floor_cycle_history"),
    ("raw_cycle_notify", "floor_cycle_notify"),
    ("raw_renew", "floor_renew"),
    ("raw_failed", "floor_failed"),
    ("raw_write", "floor_write"),
    ("raw_fenced", "floor_fenced"),
];

const P1_PAIRS: [(&str, &str, &str, bool, bool); 7] = [
    (
        "acquire + release, history off, nobody watching (raw cycle)",
        "raw_cycle",
        "lease_cycle",
        false,
        false,
    ),
    (
        "acquire + release, default history (raw cycle + the same history rows)",
        "raw_cycle_history",
        "lease_cycle",
        true,
        false,
    ),
    (
        "acquire + release, a waiter watching (raw cycle + history rows + pg_notify)",
        "raw_cycle_notify",
        "lease_cycle",
        true,
        true,
    ),
    (
        "renew (raw token-checked UPDATE)",
        "raw_renew",
        "lease_renew",
        true,
        false,
    ),
    (
        "failed acquire (raw UPDATE that matches nothing)",
        "raw_failed",
        "lease_failed",
        true,
        false,
    ),
    (
        "guarded write, one statement (minimal guard: FOR KEY SHARE + token + clock)",
        "raw_write",
        "lease_write",
        true,
        false,
    ),
    (
        "fenced transaction (minimal guard: FOR KEY SHARE + token + clock)",
        "raw_fenced",
        "lease_fenced",
        true,
        false,
    ),
];

/// A name's number in 1..=`names` for the next operation, spread over
/// the names as pgbench's `random(1, :names)` spreads them.
fn pick(names: usize) -> usize {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // splitmix64's finaliser over a counter: cheap, and no dependency.
    let mut x = NEXT
        .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    1 + (x % names as u64) as usize
}

/// P1 through the library: the pairs `BENCH_ONLY=sql` runs with pgbench
/// (`bench/pgbench/`: the same set-up, the same baselines, sent through
/// sqlx), each library operation beside its minimal hand-made statements,
/// alternated, at 1 and 8 clients on 1 and 1,000 names, in a database of
/// its own (`pglease_bench_p1`). Prints each pair's ratio (library / raw)
/// and their median.
async fn library_level(secs: f64) -> Result<(), Error> {
    const DB: &str = "pglease_bench_p1";
    let rounds = bench_rounds(3);
    let pool = fresh_database(DB, 8).await?;
    let m = LeaseManager::new(pool.clone());
    m.migrate().await?;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/pgbench");
    let setup = std::fs::read_to_string(dir.join("setup.sql"))
        .map_err(|e| Error::Database(sqlx::Error::Io(e)))?;
    sqlx::raw_sql(AssertSqlSafe(setup)).execute(&pool).await?;
    // The set-up acquired held-N in SQL; the library's operations need
    // its own handles, so it takes them again.
    sqlx::query(
        "SELECT count(pglease.release(name, token)) FROM pglease.leases WHERE name LIKE 'held-%'",
    )
    .execute(&pool)
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
    let held = Arc::new(held);
    let (low, high): (i64, i64) = sqlx::query_as(
        "SELECT min(token - substr(name, 6)::bigint), max(token - substr(name, 6)::bigint) \
         FROM raw_leases WHERE name LIKE 'held-%'",
    )
    .fetch_one(&pool)
    .await?;
    assert_eq!(
        low, high,
        "tokens of raw_leases' held leases are not consecutive"
    );
    let raw_offset = low;
    let url = found().await?.url(DB);

    // The raw cycle: take the name if free, release it if taken.
    let raw_cycle = |acquire: &'static str, release: &'static str, names: usize| {
        let pool = pool.clone();
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
    };
    let lib_cycle = |names: usize| {
        let m = m.clone();
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
    };
    println!(
        "P1 through the library (sqlx; the baselines of bench/pgbench, {rounds} pairs \
         alternated, raw first, {secs} s each): library ops/s / raw ops/s\n"
    );
    println!(
        "| operation | clients | names | raw ops/s (median) | pglease ops/s (median) | ratio per pair | median |\n\
         |---|---:|---:|---:|---:|---|---:|"
    );
    // Each baseline's operations, raw and through the library, for a
    // number of names.
    type Row<'a> = (&'a str, Box<dyn Fn(usize) -> (Op, Op) + 'a>);
    let rows: Vec<Row> = vec![
        (
            "raw_cycle",
            Box::new(|names| (raw_cycle(RAW_ACQUIRE, RAW_RELEASE, names), lib_cycle(names))),
        ),
        (
            "raw_cycle_history",
            Box::new(|names| {
                (
                    raw_cycle(RAW_ACQUIRE_HISTORY, RAW_RELEASE_HISTORY, names),
                    lib_cycle(names),
                )
            }),
        ),
        (
            "raw_cycle_notify",
            Box::new(|names| {
                (
                    raw_cycle(RAW_ACQUIRE_HISTORY, RAW_RELEASE_HISTORY_NOTIFY, names),
                    lib_cycle(names),
                )
            }),
        ),
        (
            "raw_renew",
            Box::new(|names| {
                let raw = {
                    let pool = pool.clone();
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
                };
                let lib = {
                    let (m, held) = (m.clone(), held.clone());
                    op(move |_| {
                        let (m, held) = (m.clone(), held.clone());
                        async move {
                            m.renew(&held[pick(names) - 1], LONG).await?;
                            Ok(())
                        }
                    })
                };
                (raw, lib)
            }),
        ),
        (
            "raw_failed",
            Box::new(|names| {
                let raw = {
                    let pool = pool.clone();
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
                };
                let lib = {
                    let m = m.clone();
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
                };
                (raw, lib)
            }),
        ),
        (
            "raw_write",
            Box::new(|names| {
                let raw = {
                    let pool = pool.clone();
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
                };
                let lib = {
                    let (pool, held) = (pool.clone(), held.clone());
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
                };
                (raw, lib)
            }),
        ),
        (
            "raw_fenced",
            Box::new(|names| {
                let raw = {
                    let pool = pool.clone();
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
                };
                let lib = {
                    let (m, held) = (m.clone(), held.clone());
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
                };
                (raw, lib)
            }),
        ),
    ];
    for &(label, raw_script, _, history, watched) in &P1_PAIRS {
        let (_, make) = rows
            .iter()
            .find(|(raw, _)| *raw == raw_script)
            .expect("the library's operations for every pair");
        let retention = if history { "30 days" } else { "0" };
        sqlx::query("SELECT pglease.set_history($1::interval)")
            .bind(retention)
            .execute(&pool)
            .await?;
        let watcher = if watched {
            Some(watch_cycle_names(&url).await?)
        } else {
            None
        };
        for clients in [1usize, 8] {
            for names in [1usize, 1000] {
                let (raw_op, lib_op) = make(names);
                pair_row(label, clients, names, rounds, secs, raw_op, lib_op).await;
            }
        }
        if let Some(watcher) = watcher {
            watcher.abort();
        }
    }
    pool.close().await;
    drop_database(DB).await
}

/// The SQL-level benchmark (P1 at the SQL level): each script pair of
/// `bench/pgbench/` (`raw_*.sql`, `lease_*.sql`) run by pgbench, alternated,
/// at 1 and 8 clients on 1 and 1,000 names, with prepared statements on
/// both sides and the session's default durability. Prints each round's
/// ratio (pglease tps / raw tps) and their median.
async fn sql_level(secs: f64) -> Result<(), Error> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/pgbench");
    let pgbench = pgbench_binary().ok_or_else(|| {
        Error::Database(sqlx::Error::Configuration(
            "pgbench not found on PATH or in /usr/lib/postgresql/*/bin (Debian: the \
             postgresql-client package)"
                .into(),
        ))
    })?;
    let rounds = bench_rounds(3);
    let pool = fresh_database("pglease_bench_sql", 2).await?;
    LeaseManager::new(pool.clone()).migrate().await?;
    let setup = std::fs::read_to_string(dir.join("setup.sql"))
        .map_err(|e| Error::Database(sqlx::Error::Io(e)))?;
    sqlx::raw_sql(AssertSqlSafe(setup)).execute(&pool).await?;
    // The held leases' tokens are consecutive in N (the set-up acquired them
    // in order); the scripts compute each token from its N.
    let offset = |table: &str| {
        format!(
            "SELECT min(token - substr(name, 6)::bigint), max(token - substr(name, 6)::bigint) \
             FROM {table} WHERE name LIKE 'held-%'"
        )
    };
    let mut offsets = Vec::new();
    for table in ["pglease.leases", "raw_leases"] {
        let (low, high): (i64, i64) = sqlx::query_as(AssertSqlSafe(offset(table)))
            .fetch_one(&pool)
            .await?;
        assert_eq!(
            low, high,
            "tokens of {table}'s held leases are not consecutive"
        );
        offsets.push(low);
    }
    pool.close().await;
    let url = found().await?.url("pglease_bench_sql");
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
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await?;
    for &(label, raw_script, lease_script, history, watched) in &P1_PAIRS {
        if !wanted.is_empty() && !wanted.split(',').any(|w| w == raw_script) {
            continue;
        }
        let floor_script = FLOORS
            .iter()
            .find(|(raw, _)| *raw == raw_script)
            .map(|(_, floor)| *floor)
            .expect("a floor script for every raw script");
        let retention = if history { "30 days" } else { "0" };
        sqlx::query("SELECT pglease.set_history($1::interval)")
            .bind(retention)
            .execute(&pool)
            .await?;
        let watcher = if watched {
            Some(watch_cycle_names(&url).await?)
        } else {
            None
        };
        for clients in [1usize, 8] {
            for names in [1u32, 1000] {
                let run = |script: &str| {
                    pgbench_tps(
                        &pgbench,
                        &url,
                        &dir.join(format!("{script}.sql")),
                        clients,
                        names,
                        secs,
                        offsets[0],
                        offsets[1],
                    )
                };
                let mut rounds_tps = Vec::new();
                for _ in 0..rounds {
                    rounds_tps.push([run(raw_script)?, run(floor_script)?, run(lease_script)?]);
                }
                println!(
                    "| {label} | {clients} | {names} | {} |",
                    three_way(&rounds_tps)
                );
            }
        }
        if let Some(watcher) = watcher {
            watcher.abort();
        }
    }
    if wanted.is_empty() || wanted.split(',').any(|w| w == "uncommon") {
        uncommon_paths(&pool, &pgbench, &dir, &url, secs, rounds, &offsets).await?;
    }
    pool.close().await;
    drop_database("pglease_bench_sql").await
}

/// The uncommon paths (`bench/pgbench/uncommon_*.sql`), each alternated
/// with the common acquire + release (`lease_cycle.sql`) at one client on
/// 1,000 names, default history: what each costs beside the usual case.
async fn uncommon_paths(
    pool: &PgPool,
    pgbench: &std::path::Path,
    dir: &std::path::Path,
    url: &str,
    secs: f64,
    rounds: usize,
    offsets: &[i64],
) -> Result<(), Error> {
    sqlx::query("SELECT pglease.set_history('30 days'::interval)")
        .execute(pool)
        .await?;
    println!(
        "\nUncommon paths, one client, 1,000 names, default history: each script's tps \
         beside acquire + release of a free name (lease_cycle), alternated\n"
    );
    println!(
        "| path | calls per transaction | lease_cycle tps (median) | path tps (median) | ratio per pair | median |\n\
         |---|---:|---:|---:|---|---:|"
    );
    // (what, script, calls per transaction, before, after)
    let paths = [
        (
            "first acquisition of a name (creates its row)",
            "uncommon_create",
            2,
            None,
            None,
        ),
        (
            "session-bound acquire + release",
            "uncommon_session",
            2,
            None,
            None,
        ),
        (
            "acquire + release of a name a grant covers (checked on the second try)",
            "uncommon_granted",
            2,
            Some("SELECT pglease.grant_names('cycle-', current_user)"),
            Some("SELECT pglease.revoke_names('cycle-', current_user)"),
        ),
        (
            "acquire of a name whose term expired unreleased (records the expiry)",
            "uncommon_expired",
            1,
            Some(
                "SELECT count((pglease.acquire('expiring-' || g, 'bench', \
                 interval '1 millisecond')).token) FROM generate_series(1, 1000) AS g",
            ),
            None,
        ),
    ];
    for (what, script, calls, before, after) in paths {
        if let Some(sql) = before {
            sqlx::query(sql).execute(pool).await?;
        }
        let (mut common, mut path, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let run = |script: &str| {
                pgbench_tps(
                    pgbench,
                    url,
                    &dir.join(format!("{script}.sql")),
                    1,
                    1000,
                    secs,
                    offsets[0],
                    offsets[1],
                )
            };
            let c = run("lease_cycle")?;
            let p = run(script)?;
            ratios.push(p / c);
            common.push(c);
            path.push(p);
        }
        if let Some(sql) = after {
            sqlx::query(sql).execute(pool).await?;
        }
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "| {what} | {calls} | {:.0} | {:.0} | {} | {:.2} |",
            median_f64(&mut common),
            median_f64(&mut path),
            each.join(", "),
            median_f64(&mut ratios)
        );
    }
    Ok(())
}

/// A waiter's session for the SQL-level benchmark: LISTENs on pglease's
/// release channel and the raw baseline's, watches every cycle name, and
/// drains what it hears until aborted.
async fn watch_cycle_names(url: &str) -> Result<tokio::task::JoinHandle<()>, Error> {
    let mut listener = sqlx::postgres::PgListener::connect(url).await?;
    listener
        .listen_all(["pglease_release", "raw_release"])
        .await?;
    let watched: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pglease.watch('cycle-' || g)) \
           FROM generate_series(1, 1000) AS g",
    )
    .fetch_one(&mut listener)
    .await?;
    assert_eq!(watched, 1000, "every cycle name watched");
    Ok(tokio::spawn(async move {
        while let Ok(Some(_)) = listener.try_recv().await {}
    }))
}

/// One row's cells from its rounds of `[raw, floor, pglease]` tps: the
/// median tps of each, pglease / floor per round and its median, then the
/// medians of pglease / raw and floor / raw (each a median of the rounds'
/// own ratios, so that a slow round moves one ratio, not every cell).
fn three_way(rounds: &[[f64; 3]]) -> String {
    let column = |i: usize| rounds.iter().map(|r| r[i]).collect::<Vec<f64>>();
    let ratio = |a: usize, b: usize| rounds.iter().map(|r| r[a] / r[b]).collect::<Vec<f64>>();
    let over_floor = ratio(2, 1);
    let each: Vec<String> = over_floor.iter().map(|r| format!("{r:.2}")).collect();
    format!(
        "{:.0} | {:.0} | {:.0} | {} | {:.2} | {:.2} | {:.2}",
        median_f64(&mut column(0)),
        median_f64(&mut column(1)),
        median_f64(&mut column(2)),
        each.join(", "),
        median_f64(&mut over_floor.clone()),
        median_f64(&mut ratio(2, 0)),
        median_f64(&mut ratio(1, 0))
    )
}

/// The middle value (the mean of the two middle ones for an even count).
fn median_f64(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// pgbench on PATH, else the newest server package's.
fn pgbench_binary() -> Option<std::path::PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("pgbench"))
            .find(|candidate| candidate.is_file())
    });
    on_path.or_else(|| {
        let mut found: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|entry| Some(entry.ok()?.path().join("bin/pgbench")))
            .filter(|candidate| candidate.is_file())
            .collect();
        found.sort();
        found.pop()
    })
}

/// Transactions per second of one pgbench run of `script`.
#[allow(clippy::too_many_arguments)]
fn pgbench_tps(
    pgbench: &std::path::Path,
    url: &str,
    script: &std::path::Path,
    clients: usize,
    names: u32,
    secs: f64,
    offset: i64,
    raw_offset: i64,
) -> Result<f64, Error> {
    let output = std::process::Command::new(pgbench)
        .args(["-n", "-M", "prepared"])
        .args(["-c", &clients.to_string(), "-j", &clients.to_string()])
        .args(["-T", &format!("{}", secs.ceil().max(1.0) as u64)])
        .args(["-D", &format!("names={names}")])
        .args(["-D", &format!("off={offset}")])
        .args(["-D", &format!("roff={raw_offset}")])
        .arg("-f")
        .arg(script)
        .arg(url)
        .output()
        .map_err(|e| Error::Database(sqlx::Error::Io(e)))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let tps = stdout
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok());
    match tps {
        Some(tps) if output.status.success() => Ok(tps),
        _ => Err(Error::Database(sqlx::Error::Configuration(
            format!(
                "pgbench {} failed ({}): {}",
                script.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )
            .into(),
        ))),
    }
}

/// The library's own cost (`BENCH_ONLY=thin`): each `LeaseManager`
/// operation beside the same pglease function call sent bare through
/// sqlx, one prepared statement per operation, alternated (bare first),
/// at 1 and 8 clients on 1 and 1,000 names. Prints library / bare per
/// pair and the median.
async fn thin_library(pool: &PgPool, m: &LeaseManager, secs: f64) -> Result<(), Error> {
    let rounds = bench_rounds(3);
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
    let held = Arc::new(held);
    sqlx::query("CREATE TABLE IF NOT EXISTS thin_data (id int PRIMARY KEY, value bigint NOT NULL)")
        .execute(pool)
        .await?;
    sqlx::query(
        "INSERT INTO thin_data SELECT g, 0 FROM generate_series(1, 1000) g ON CONFLICT DO NOTHING",
    )
    .execute(pool)
    .await?;
    println!(
        "\nThe library's own cost ({rounds} pairs alternated, bare first, {secs} s each): \
         LeaseManager ops/s / the same pglease call sent bare through sqlx\n"
    );
    println!(
        "| operation | clients | names | bare ops/s (median) | library ops/s (median) | ratio per pair | median |\n\
         |---|---:|---:|---:|---:|---|---:|"
    );
    for (label, clients, names) in ["cycle", "failed", "renew", "fenced"]
        .into_iter()
        .flat_map(|l| [(l, 1, 1), (l, 1, 1000), (l, 8, 1), (l, 8, 1000)])
    {
        let (bare, lib) = thin_pair(label, pool, m, &held, names);
        pair_row(label, clients, names, rounds, secs, bare, lib).await;
    }
    for lease in held.iter() {
        m.release(lease).await?;
    }
    Ok(())
}

/// `BENCH_ROUNDS`, else `default`.
fn bench_rounds(default: usize) -> usize {
    std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// One row of a pair table: `rounds` alternated runs of `first` then
/// `second`, printed as both medians, each pair's ratio (second / first)
/// and their median.
async fn pair_row(
    label: &str,
    clients: usize,
    names: usize,
    rounds: usize,
    secs: f64,
    first: Op,
    second: Op,
) {
    let (mut a, mut b, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let x = rate(clients, secs, first.clone()).await;
        let y = rate(clients, secs, second.clone()).await;
        ratios.push(y / x);
        a.push(x);
        b.push(y);
    }
    let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    println!(
        "| {label} | {clients} | {names} | {:.0} | {:.0} | {} | {:.2} |",
        median_f64(&mut a),
        median_f64(&mut b),
        each.join(", "),
        median_f64(&mut ratios)
    );
}

/// The bare operation and the library's for one row of [`thin_library`].
fn thin_pair(
    label: &str,
    pool: &PgPool,
    m: &LeaseManager,
    held: &Arc<Vec<Lease>>,
    names: usize,
) -> (Op, Op) {
    let (pool, m, held) = (pool.clone(), m.clone(), held.clone());
    match label {
        "cycle" => (
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
            }),
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
            }),
        ),
        "failed" => (
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
            }),
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
            }),
        ),
        "renew" => {
            let bare_held = held.clone();
            (
                op(move |_| {
                    let (pool, held) = (pool.clone(), bare_held.clone());
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
                }),
                op(move |_| {
                    let (m, held) = (m.clone(), held.clone());
                    async move { m.renew(&held[pick(names) - 1], LONG).await.map(drop) }
                }),
            )
        }
        _ => {
            let bare_held = held.clone();
            (
                op(move |_| {
                    let (pool, held) = (pool.clone(), bare_held.clone());
                    async move {
                        let n = pick(names);
                        let mut tx = pool.begin().await?;
                        sqlx::query("SELECT pglease.assert_held($1, $2)")
                            .bind(held[n - 1].name())
                            .bind(held[n - 1].token())
                            .execute(&mut *tx)
                            .await?;
                        thin_write(&mut tx, n).await?;
                        tx.commit().await?;
                        Ok(())
                    }
                }),
                op(move |_| {
                    let (m, held) = (m.clone(), held.clone());
                    async move {
                        let n = pick(names);
                        let mut tx = m.begin_fenced(&held[n - 1]).await?;
                        thin_write(&mut tx, n).await?;
                        tx.commit().await?;
                        Ok(())
                    }
                }),
            )
        }
    }
}

/// The fenced row's write of [`thin_library`].
async fn thin_write(tx: &mut sqlx::PgConnection, n: usize) -> Result<(), Error> {
    sqlx::query("UPDATE thin_data SET value = value + 1 WHERE id = $1")
        .bind(n as i32)
        .execute(tx)
        .await?;
    Ok(())
}
