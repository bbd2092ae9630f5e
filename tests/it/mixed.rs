//! Every kind of lease at once, driven at random: exclusive, shared,
//! counted, fair, several at once and handover on three names, with
//! sessions ended and rows held locked underneath, for a bounded number of
//! steps per seed. Seeded: the choices of a seed are the same on every
//! run (the interleaving is the machine's). `PGLEASE_MIX_SEED=N` replays
//! one seed; `PGLEASE_MIX_SEEDS=K` runs K seeds (10 by default).
//!
//! Checked after every step and at the end of each seed:
//! - safety: no token handed out twice (of any kind); never an exclusive
//!   holder beside a valid shared holder (the status view, one statement);
//!   no write under a stale token committed (a name's logged tokens never
//!   decrease in commit order, and each is one of its exclusive tokens);
//! - liveness: once every worker has stopped, each name is acquired within
//!   the longest TTL plus the takeover grace (2 s);
//! - decoding: every error is a documented outcome (a refusal, a loss, or
//!   the database error of a session that the faults ended).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pglease::{AcquireOptions, Error, Lease, LeaseManager};
use sqlx::PgPool;

use crate::common::TestDb;

/// The names: two plain ones (exclusive, shared, fair, both at once) and
/// a counted one.
const NAMES: [&str; 2] = ["m0", "m1"];
const COUNTED: &str = "mc";
const SLOTS: u32 = 2;
const WORKERS: u64 = 4;
const STEPS: usize = 60;
const MAX_TTL_MS: u64 = 800;
/// How long a name may stay unacquirable once everyone has stopped: the
/// longest TTL (a holder, or a place in line, that nobody renews) and
/// the takeover grace (2 s: docs/design.md, "Takeover").
const LIVENESS_BOUND: Duration = Duration::from_millis(MAX_TTL_MS + 2_000);

/// splitmix64: the seed's choices, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn ms(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from + 1))
    }
}

/// What the run saw, for the checks and the figures.
#[derive(Default)]
struct Seen {
    /// Every token granted, with its name.
    tokens: HashMap<i64, String>,
    /// Exclusive tokens by name (a slot's name for a counted slot).
    exclusive: HashSet<(String, i64)>,
    steps: u64,
    granted: u64,
    refused: u64,
    lost: u64,
    ended_by_faults: u64,
    writes_committed: u64,
    writes_refused: u64,
    kills: u64,
    locks: u64,
}

type Shared = Arc<Mutex<Seen>>;

fn lock(seen: &Shared) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Records the leases granted; a token seen before fails the run.
fn granted(seen: &Shared, leases: &[Lease], seed: u64) {
    let mut seen = lock(seen);
    seen.granted += 1;
    for lease in leases {
        let token = lease.token().get();
        if let Some(before) = seen.tokens.insert(token, lease.name().to_owned()) {
            panic!(
                "seed {seed}: token {token} handed out twice ({before:?}, then {:?})",
                lease.name()
            );
        }
        if !lease.is_shared() {
            seen.exclusive.insert((lease.name().to_owned(), token));
        }
    }
}

/// Whether `e` is an outcome the library documents for the operation
/// (a refusal or a loss), or a session the faults ended; anything else,
/// a decoding error above all, fails the run.
fn documented(e: &Error) -> bool {
    match e {
        Error::Held { .. }
        | Error::Pinned { .. }
        | Error::InLine { .. }
        | Error::LineFull { .. }
        | Error::Lost { .. }
        | Error::NotHeld { .. } => true,
        Error::Database(sqlx::Error::Io(_)) => true,
        Error::Database(sqlx::Error::Database(db)) => {
            // A session ended by a fault or by a takeover (57P01), or
            // a row held by a fault for longer than a bounded wait.
            matches!(db.code().as_deref(), Some("57P01" | "55P03"))
        }
        Error::Database(other) => {
            let text = other.to_string();
            // A pooled connection whose session a fault ended.
            text.contains("connection closed") || text.contains("broken pipe")
        }
        _ => false,
    }
}

/// Counts `e` as a refusal, a loss or a fault's; fails on anything else.
fn outcome(seen: &Shared, e: &Error, seed: u64, what: &str) {
    assert!(
        documented(e),
        "seed {seed}: {what}: undocumented outcome {e:?}"
    );
    let mut seen = lock(seen);
    match e {
        Error::Lost { .. } | Error::NotHeld { .. } => seen.lost += 1,
        Error::Database(_) => seen.ended_by_faults += 1,
        _ => seen.refused += 1,
    }
}

/// Safety in one statement: no name with a valid exclusive holder and a
/// valid shared one.
async fn no_writer_beside_readers(pool: &PgPool, seed: u64) {
    // The faults may end this pool's session too: read on another.
    let mut tries = 0;
    let both: Vec<String> = loop {
        match sqlx::query_scalar("SELECT name FROM pglease.status WHERE held AND readers > 0")
            .fetch_all(pool)
            .await
        {
            Ok(both) => break both,
            Err(e) => {
                let e = Error::Database(e);
                assert!(
                    tries < 5 && documented(&e),
                    "seed {seed}: read the status view: {e}"
                );
                tries += 1;
            }
        }
    };
    assert!(
        both.is_empty(),
        "seed {seed}: exclusive and shared at once on {both:?}"
    );
}

/// One worker: STEPS random operations on its own leases.
async fn worker(manager: LeaseManager, pool: PgPool, seen: Shared, seed: u64, id: u64) {
    let mut rng = Rng(seed.wrapping_mul(1_000_003).wrapping_add(id));
    let holder = format!("w{id}");
    let mut held: Vec<Lease> = Vec::new();
    for _ in 0..STEPS {
        let name = NAMES[rng.below(2) as usize];
        let ttl = rng.ms(200, MAX_TTL_MS);
        let wait = if rng.below(2) == 0 {
            Duration::ZERO
        } else {
            rng.ms(50, 300)
        };
        let how = AcquireOptions::ttl(ttl).holder(holder.as_str()).wait(wait);
        match rng.below(12) {
            0 | 1 => match manager.acquire(name, how).await {
                Ok(lease) => {
                    granted(&seen, std::slice::from_ref(&lease), seed);
                    held.push(lease);
                }
                Err(e) => outcome(&seen, &e, seed, "acquire"),
            },
            2 => match manager.acquire(name, how.shared(true)).await {
                Ok(lease) => {
                    granted(&seen, std::slice::from_ref(&lease), seed);
                    held.push(lease);
                }
                Err(e) => outcome(&seen, &e, seed, "acquire shared"),
            },
            3 => match manager.acquire(COUNTED, how.limit(SLOTS)).await {
                Ok(lease) => {
                    granted(&seen, std::slice::from_ref(&lease), seed);
                    held.push(lease);
                }
                Err(e) => outcome(&seen, &e, seed, "acquire counted"),
            },
            4 => {
                let fair = how.wait(rng.ms(100, 300)).fair(true);
                match manager.acquire(name, fair).await {
                    Ok(lease) => {
                        granted(&seen, std::slice::from_ref(&lease), seed);
                        held.push(lease);
                    }
                    Err(e) => outcome(&seen, &e, seed, "acquire fair"),
                }
            }
            5 => match manager.acquire_all(&NAMES, how).await {
                Ok(leases) => {
                    granted(&seen, &leases, seed);
                    held.extend(leases);
                }
                Err(e) => outcome(&seen, &e, seed, "acquire_all"),
            },
            6 if !held.is_empty() => {
                let lease = &held[rng.below(held.len() as u64) as usize];
                if let Err(e) = manager.renew(lease, ttl).await {
                    outcome(&seen, &e, seed, "renew");
                }
            }
            7 | 8 if !held.is_empty() => {
                let lease = held.swap_remove(rng.below(held.len() as u64) as usize);
                if let Err(e) = manager.release(&lease).await {
                    outcome(&seen, &e, seed, "release");
                }
            }
            9 | 10 if !held.is_empty() => {
                let lease = &held[rng.below(held.len() as u64) as usize];
                if !lease.is_shared() {
                    let pause = rng.ms(0, 400);
                    write(&manager, lease, pause, &seen, seed).await;
                }
            }
            11 if !held.is_empty() => {
                // A handover to a successor that does not wait keeps the
                // lease: still its holder's.
                let lease = &held[rng.below(held.len() as u64) as usize];
                if !lease.is_shared() {
                    match manager
                        .hand_over(lease, "nobody-waits", ttl, pglease::WithoutSuccessor::Keep)
                        .await
                    {
                        Ok(token) => assert_eq!(token, None, "seed {seed}: nobody waits"),
                        Err(e) => outcome(&seen, &e, seed, "hand over"),
                    }
                }
            }
            _ => tokio::time::sleep(rng.ms(0, 50)).await,
        }
        lock(&seen).steps += 1;
        no_writer_beside_readers(&pool, seed).await;
    }
    for lease in held {
        if let Err(e) = manager.release(&lease).await {
            outcome(&seen, &e, seed, "release at the end");
        }
    }
}

/// A write under `lease` in a fenced transaction, paused for `pause`
/// before its commit (a holder that stalls: its lease may end and be
/// taken meanwhile, and then its commit must fail).
async fn write(manager: &LeaseManager, lease: &Lease, pause: Duration, seen: &Shared, seed: u64) {
    let result = async {
        let mut tx = manager.begin_fenced(lease).await?;
        sqlx::query("INSERT INTO mixed_log (name, token) VALUES ($1, $2)")
            .bind(lease.name())
            .bind(lease.token().get())
            .execute(&mut *tx)
            .await?;
        tokio::time::sleep(pause).await;
        tx.commit().await
    }
    .await;
    match result {
        Ok(()) => lock(seen).writes_committed += 1,
        Err(e) => {
            assert!(documented(&e), "seed {seed}: fenced write: {e:?}");
            lock(seen).writes_refused += 1;
        }
    }
}

/// The faults, until `until`: a random session of the test database
/// ended, or a random name's row held locked FOR UPDATE for up to 500 ms.
async fn faults(db_pool: PgPool, seed: u64, seen: Shared, until: Instant) {
    let mut rng = Rng(seed ^ 0x5eed);
    while Instant::now() < until {
        tokio::time::sleep(rng.ms(20, 120)).await;
        if rng.below(2) == 0 {
            let ended: Option<i32> = sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity \
                  WHERE datname = current_database() AND pid <> pg_backend_pid() \
                    AND backend_type = 'client backend' \
                  ORDER BY state = 'idle in transaction' DESC, state = 'idle', pid \
                 OFFSET $1 LIMIT 1",
            )
            .bind(i64::try_from(rng.below(3)).unwrap_or(0))
            .fetch_optional(&db_pool)
            .await
            .expect("pick a session");
            if let Some(pid) = ended {
                let _ = sqlx::query("SELECT pg_terminate_backend($1)")
                    .bind(pid)
                    .execute(&db_pool)
                    .await;
                lock(&seen).kills += 1;
            }
        } else {
            let names = [NAMES[0], NAMES[1], "mc#1", "mc#2"];
            let name = names[rng.below(4) as usize];
            let hold = rng.ms(50, 500);
            let Ok(mut tx) = db_pool.begin().await else {
                continue;
            };
            let _ = sqlx::query("SELECT 1 FROM pglease.leases WHERE name = $1 FOR UPDATE")
                .bind(name)
                .execute(&mut *tx)
                .await;
            tokio::time::sleep(hold).await;
            let _ = tx.rollback().await;
            lock(&seen).locks += 1;
        }
    }
}

/// How long until `name` is acquired, exclusively and at once, by a new
/// acquirer (retried every 20 ms): at most LIVENESS_BOUND.
async fn acquirable_within(manager: &LeaseManager, name: &str, seed: u64) -> Duration {
    let began = Instant::now();
    loop {
        match manager
            .acquire(
                name,
                AcquireOptions::ttl(Duration::from_secs(5)).holder("probe"),
            )
            .await
        {
            Ok(lease) => {
                manager.release(&lease).await.expect("release the probe");
                return began.elapsed();
            }
            Err(e) => assert!(documented(&e), "seed {seed}: probe of {name}: {e:?}"),
        }
        assert!(
            began.elapsed() <= LIVENESS_BOUND,
            "seed {seed}: {name} unacquirable for {:?} with every worker stopped",
            began.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The logged writes: per name, tokens never decrease in commit order
/// (a stale write committed after a newer term's would), and each is
/// one of the name's exclusive tokens. Commit order is the order of a
/// deferred trigger's sequence, drawn as each transaction commits (the
/// row's id is drawn at its INSERT, before the pause that makes a write
/// stale, so it would not show a late commit).
async fn no_stale_write(pool: &PgPool, seen: &Shared, seed: u64) {
    let rows: Vec<(i64, String, i64, Option<i64>)> =
        sqlx::query_as("SELECT id, name, token, committed FROM mixed_log ORDER BY committed")
            .fetch_all(pool)
            .await
            .expect("read the log");
    let seen = lock(seen);
    let mut last: HashMap<&str, i64> = HashMap::new();
    for (id, name, token, committed) in &rows {
        assert!(
            committed.is_some(),
            "seed {seed}: row {id} without its commit's place"
        );
        assert!(
            seen.exclusive.contains(&(name.clone(), *token)),
            "seed {seed}: row {id} under token {token} of {name}, never granted exclusive"
        );
        let before = last.insert(name, *token).unwrap_or(0);
        assert!(
            *token >= before,
            "seed {seed}: row {id} under token {token} of {name} committed after one under {before}"
        );
    }
}

/// One seed: the workers and the faults, then the checks.
async fn one_seed(db: &TestDb, seed: u64) -> (Seen, Duration) {
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS mixed_log; \
         DROP SEQUENCE IF EXISTS mixed_commits; \
         CREATE TABLE mixed_log (id bigserial PRIMARY KEY, name text NOT NULL, token bigint NOT NULL, \
                                 committed bigint); \
         CREATE SEQUENCE mixed_commits; \
         CREATE OR REPLACE FUNCTION mixed_committed() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
             UPDATE mixed_log SET committed = nextval('mixed_commits') WHERE id = NEW.id; \
             RETURN NULL; \
         END $$; \
         CREATE CONSTRAINT TRIGGER mixed_committed AFTER INSERT ON mixed_log \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION mixed_committed(); \
         SELECT pglease.set_fair('m1', true)",
    )
    .execute(db.pool())
    .await
    .expect("the log");
    let seen: Shared = Arc::default();
    let until = Instant::now() + Duration::from_secs(30);
    let faults = tokio::spawn(faults(db.pool().clone(), seed, seen.clone(), until));
    let workers: Vec<_> = (0..WORKERS)
        .map(|id| {
            let manager = db.manager();
            tokio::spawn(worker(manager, db.pool().clone(), seen.clone(), seed, id))
        })
        .collect();
    for w in workers {
        if let Err(e) = w.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    faults.abort();
    let _ = faults.await;
    let manager = db.manager();
    let mut slowest = Duration::ZERO;
    for name in [NAMES[0], NAMES[1], "mc#1", "mc#2"] {
        slowest = slowest.max(acquirable_within(&manager, name, seed).await);
    }
    no_writer_beside_readers(db.pool(), seed).await;
    no_stale_write(db.pool(), &seen, seed).await;
    let seen = std::mem::take(&mut *lock(&seen));
    (seen, slowest)
}

/// The seeds, one after another, each on a fresh database.
async fn every_kind_at_random_under_faults_stays_safe_live_and_decoded() {
    let seeds: Vec<u64> = match std::env::var("PGLEASE_MIX_SEED") {
        Ok(one) => vec![one.parse().expect("PGLEASE_MIX_SEED is a number")],
        Err(_) => {
            let k = std::env::var("PGLEASE_MIX_SEEDS")
                .ok()
                .and_then(|k| k.parse().ok())
                .unwrap_or(10);
            (1..=k).collect()
        }
    };
    for seed in seeds {
        let db = TestDb::new().await;
        let began = Instant::now();
        let (seen, slowest) = one_seed(&db, seed).await;
        println!(
            "seed {seed}: {} steps ({} granted, {} refused, {} lost, {} ended by faults), \
             writes {} committed / {} refused, faults {} sessions ended / {} rows held, \
             every name acquired {:?} after the stop at most, {:?} in all",
            seen.steps,
            seen.granted,
            seen.refused,
            seen.lost,
            seen.ended_by_faults,
            seen.writes_committed,
            seen.writes_refused,
            seen.kills,
            seen.locks,
            slowest,
            began.elapsed()
        );
    }
}

pglease_formations::tests![every_kind_at_random_under_faults_stays_safe_live_and_decoded(4)];
