//! A takeover lets the transactions still fenced on an ended lease end by
//! themselves for `FENCED_GRACE` before it ends their sessions. Fenced
//! checks in autocommit statements, racing releases and acquisitions of
//! their lease, lose no session unless the check's transaction was open
//! for longer than the bound: a check that passed and was committing as
//! the lease ended keeps its connection, and so does the connection's
//! next, unrelated statement.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pglease::history::Event;
use pglease::limits::FENCED_GRACE;
use pglease::{AcquireOptions, Error, LeaseManager};
use sqlx::Connection;

use crate::common::TestDb;

/// How long the checks race the takeovers.
const RACE: Duration = Duration::from_secs(10);
const CHECKERS: usize = 6;
const CYCLERS: usize = 2;
const NAME: &str = "raced";

/// What one checker saw.
#[derive(Default)]
struct Seen {
    /// Checks that passed, and that were refused (stale token).
    passed: u64,
    refused: u64,
    /// Sessions lost while their latest check had taken less than the
    /// bound, with how long it took.
    within_grace: Vec<Duration>,
    /// Sessions lost with a check that took longer.
    after_grace: u64,
    /// Every check's duration, in microseconds.
    durations: Vec<u64>,
}

/// Whether `error` says the server ended this session.
fn session_ended(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(e) => e.code().as_deref() == Some("57P01"),
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        _ => false,
    }
}

/// Reads the lease's current token and checks it in an autocommit
/// statement, again and again until `stop`, on a connection of its own
/// (a new one after each session lost). A session lost is put down to the
/// connection's latest check, the only fenced transaction it had: the one
/// under way, with how long it had run, or the one before, with how long
/// it took from its send to its answer (a session ended as its check
/// commits tells it at the next statement). That time bounds how long the
/// check's transaction was open.
async fn checker(db: Arc<TestDb>, stop: Arc<AtomicBool>) -> Seen {
    let mut seen = Seen::default();
    let mut conn = db.connect().await;
    // How long the connection's latest check took (none yet: zero, so that
    // a session lost before any check counts against the grace).
    let mut last_check = Duration::ZERO;
    while !stop.load(Ordering::Relaxed) {
        let token = sqlx::query_scalar::<_, Option<i64>>(
            "SELECT token FROM pglease.leases WHERE name = $1",
        )
        .bind(NAME)
        .fetch_optional(&mut conn)
        .await;
        let outcome = match token {
            Ok(Some(Some(token))) if token > 0 => {
                let checked = Instant::now();
                let outcome = sqlx::query("SELECT pglease.assert_held($1, $2)")
                    .bind(NAME)
                    .bind(token)
                    .execute(&mut conn)
                    .await;
                last_check = checked.elapsed();
                seen.durations
                    .push(u64::try_from(last_check.as_micros()).unwrap_or(u64::MAX));
                outcome.map(drop)
            }
            Ok(_) => continue,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => seen.passed += 1,
            Err(e) if session_ended(&e) => {
                if last_check < FENCED_GRACE {
                    seen.within_grace.push(last_check);
                } else {
                    seen.after_grace += 1;
                }
                conn = db.connect().await;
                last_check = Duration::ZERO;
            }
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("LE001") => {
                seen.refused += 1;
            }
            Err(e) => panic!("a check failed otherwise: {e}"),
        }
    }
    let _ = conn.close().await;
    seen
}

/// Acquires and releases the lease until `stop`; how many terms it had.
async fn cycler(m: LeaseManager, holder: String, stop: Arc<AtomicBool>) -> u64 {
    let mut terms = 0;
    while !stop.load(Ordering::Relaxed) {
        let how = AcquireOptions::ttl(Duration::from_secs(10)).holder(holder.as_str());
        match m.acquire(NAME, how).await {
            Ok(lease) => {
                terms += 1;
                m.release(&lease).await.expect("release");
            }
            Err(Error::Held { .. }) => tokio::task::yield_now().await,
            Err(e) => panic!("acquire failed otherwise: {e}"),
        }
    }
    terms
}

async fn checks_racing_takeovers_keep_their_sessions_within_the_grace() {
    let db = Arc::new(TestDb::new().await);
    let m = db.manager();
    let first = m
        .acquire(NAME, AcquireOptions::ttl(Duration::from_secs(10)))
        .await
        .expect("the first acquisition");
    m.release(&first).await.expect("release");
    let stop = Arc::new(AtomicBool::new(false));
    let checkers: Vec<_> = (0..CHECKERS)
        .map(|_| tokio::spawn(checker(Arc::clone(&db), Arc::clone(&stop))))
        .collect();
    let cyclers: Vec<_> = (0..CYCLERS)
        .map(|i| tokio::spawn(cycler(m.clone(), format!("cycler-{i}"), Arc::clone(&stop))))
        .collect();
    tokio::time::sleep(RACE).await;
    stop.store(true, Ordering::Relaxed);
    let mut terms = 0;
    for cycler in cyclers {
        terms += cycler.await.expect("a cycler panicked");
    }
    let mut all = Seen::default();
    for checker in checkers {
        let seen = checker.await.expect("a checker panicked");
        all.passed += seen.passed;
        all.refused += seen.refused;
        all.within_grace.extend(seen.within_grace);
        all.after_grace += seen.after_grace;
        all.durations.extend(seen.durations);
    }
    let evicted = m
        .history(NAME, None)
        .await
        .expect("history")
        .iter()
        .filter(|t| t.event == Event::Evicted)
        .count();
    all.durations.sort_unstable();
    let at = |q: f64| {
        let i = ((all.durations.len() as f64 - 1.0) * q).round() as usize;
        all.durations.get(i).copied().unwrap_or(0)
    };
    println!(
        "{terms} terms, {} checks passed, {} refused; check p50 {} µs, p99 {} µs, max {} µs; \
         {evicted} evictions recorded; sessions lost within the {FENCED_GRACE:?} grace: {} \
         (the first after {:?}), after it: {}",
        all.passed,
        all.refused,
        at(0.5),
        at(0.99),
        at(1.0),
        all.within_grace.len(),
        all.within_grace.iter().take(8).collect::<Vec<_>>(),
        all.after_grace,
    );
    assert!(terms > 100 && all.passed > 100, "too little raced");
    assert!(
        all.within_grace.is_empty(),
        "{} sessions ended within the grace",
        all.within_grace.len()
    );
}

pglease_formations::tests![checks_racing_takeovers_keep_their_sessions_within_the_grace(8),];
