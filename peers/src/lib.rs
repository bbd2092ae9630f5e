//! pglease side by side with the crates a Rust user would pick instead,
//! each driven through its public API at its crates.io version, on the same
//! server, in the same run: `pg_lease` 0.1.3 (a looping function run while
//! a lease row is heartbeated), `distributed-lock-postgres` 0.2.0
//! (session advisory locks behind a lock trait) and sqlx 0.8's
//! `PgAdvisoryLock`.
//!
//! The safety part runs the scenarios of `pglease demo` (its scenario
//! engine, `pglease_scenarios::engine`: the same scripts, ledger,
//! letters and verdicts) with each peer as a contender
//! ([`contenders`]), each write protected the way the peer's
//! documentation says (or, where it offers no way, the obvious way). Each
//! verdict is read from the database afterwards (which writes committed
//! after the new holder's), not assumed. (a) The holder has written and is
//! committing when its network freezes (a paused process looks the same
//! to the server) past its TTL; another worker tries to take over and
//! writes; then the holder's commit arrives. (b) The holder's connection
//! is killed, another worker tries to take over, then the first holder
//! writes. (d) A release arrives late, after the same holder acquired
//! again. (e) The holder's network freezes while it holds (until another
//! worker has taken over and the holder has been told, each waited for at
//! most 3 s): is it told before another worker takes over? (c), a holder that dies without
//! releasing, is the demo's only.

pub mod contenders;
mod looper;
mod speed;

pub use contenders::{SCENARIOS, run};
pub use pglease_scenarios::{BoxError, Judgement, Scenario, Verdict, Violation, Written};
pub use speed::{Load, Speed, speed, speed_table};

use std::time::Duration;

use pglease::testing::TestDatabase;
use sqlx08::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// A library compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// pglease: a lease with fenced writes.
    Pglease,
    /// `pg_lease` 0.1.3: `LeaseLooper`, writes checked with
    /// `verify_lease_held` in their transaction.
    PgLease,
    /// `distributed-lock-postgres` 0.2.0, session mode (its default).
    DistributedLock,
    /// sqlx 0.8's `PgAdvisoryLock` (session level).
    SqlxAdvisoryLock,
}

impl Peer {
    /// Every peer, in table order.
    pub const ALL: [Peer; 4] = [
        Peer::Pglease,
        Peer::PgLease,
        Peer::DistributedLock,
        Peer::SqlxAdvisoryLock,
    ];

    /// A short label.
    pub fn label(self) -> &'static str {
        match self {
            Peer::Pglease => "pglease",
            Peer::PgLease => "pg_lease 0.1.3",
            Peer::DistributedLock => "distributed-lock-postgres 0.2.0",
            Peer::SqlxAdvisoryLock => "sqlx 0.8 PgAdvisoryLock",
        }
    }
}

/// What each scenario puts the peers through, as a table's heading.
pub fn describe(scenario: Scenario) -> &'static str {
    match scenario {
        Scenario::PausedHolder => {
            "(a) the holder's commit is held up past its TTL of 1 s (its network frozen until \
             another worker has taken over and written, or for 3 s)"
        }
        Scenario::KilledConnection => "(b) the holder's connection is killed, then it writes",
        Scenario::DeadHolder => "(c) the holder dies without releasing",
        Scenario::LateRelease => "(d) a release arrives late, after the same holder acquired again",
        Scenario::SilentRenewal => {
            "(e) the holder's renewals get no answer (its network frozen until another worker has \
             taken over and the holder has been told, each waited for at most 3 s; TTL 1 s)"
        }
    }
}

/// What a violation means in `scenario`, as a column heading.
pub fn violation(scenario: Scenario) -> &'static str {
    match scenario {
        Scenario::PausedHolder | Scenario::KilledConnection | Scenario::DeadHolder => {
            "stale write applied after the new holder's"
        }
        Scenario::LateRelease => "the late release ended the new term, another took it",
        Scenario::SilentRenewal => "two holders at once, the old one not told",
    }
}

/// Every scenario for every peer, each in a database of its own.
///
/// # Errors
///
/// A peer or the database failing in a way the scenario does not expect.
pub async fn safety() -> Result<Vec<Verdict<Peer>>, BoxError> {
    let mut verdicts = Vec::new();
    for scenario in SCENARIOS {
        for peer in Peer::ALL {
            verdicts.push(run(scenario, peer).await?);
        }
    }
    Ok(verdicts)
}

/// A sqlx 0.8 pool on the scenario's database, its connections named `app`.
async fn pool(db: &TestDatabase, app: &str) -> Result<PgPool, BoxError> {
    let options: PgConnectOptions = db.url().parse()?;
    Ok(PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options.application_name(app))
        .await?)
}

/// A distributed-lock-postgres provider on `pool`.
async fn dlock(pool: PgPool) -> Result<distributed_lock_postgres::PostgresLockProvider, BoxError> {
    Ok(distributed_lock_postgres::PostgresLockProvider::builder()
        .pool(pool)
        .build()
        .await?)
}

/// Ends every session named `app`; how many.
async fn kill(db: &TestDatabase, app: &str) -> Result<i64, BoxError> {
    let killed: i64 = sqlx08::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
          WHERE datname = current_database() AND application_name = $1",
    )
    .bind(app)
    .fetch_one(&pool(db, "killer").await?)
    .await?;
    Ok(killed)
}

/// The verdicts as Markdown tables, one per scenario.
pub fn tables(verdicts: &[Verdict<Peer>]) -> String {
    let mut out = String::new();
    for scenario in Scenario::ALL {
        let these: Vec<&Verdict<Peer>> =
            verdicts.iter().filter(|v| v.scenario == scenario).collect();
        if !these.is_empty() {
            out.push_str(&format!(
                "\n{}\n\n{}\n",
                describe(scenario),
                table(violation(scenario), &these)
            ));
        }
    }
    out
}

/// The verdicts of one scenario as a Markdown table; `violation` heads
/// the verdict's column.
pub fn table(violation: &str, verdicts: &[&Verdict<Peer>]) -> String {
    let mut out = format!(
        "| peer | {violation} | takeover | what happened |\n\
         |---|---|---|---|"
    );
    for v in verdicts {
        out.push_str(&format!(
            "\n| {} | {} | {} | {} |",
            v.contender.label(),
            match v.judgement {
                Judgement::Violated(_) => "YES",
                Judgement::NotApplicable(_) => "n/a",
                Judgement::Safe => "no",
            },
            v.took_over
                .map_or_else(|| "none".to_owned(), |t| format!("{} ms", t.as_millis())),
            v.detail
        ));
    }
    out
}
