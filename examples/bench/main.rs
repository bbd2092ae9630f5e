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
//! `pglease_bench_1m`). `BENCH_SECS` sets the seconds per measurement
//! (default 2), `BENCH_ROUNDS` the alternated pairs of the tables that
//! count them; `BENCH_ONLY=<measure>` runs one measure alone, one of
//! [`ALONE`] (docs/benchmark.md says what each measures).
//!
//! One module per measure, named for what it measures (its doc says its
//! `BENCH_ONLY` value); what they share is in [`shared`].

mod auto_failover;
mod declared;
mod elect;
mod failed_attempts;
mod failover;
mod fenced;
mod flushes;
mod groups;
mod handover;
mod history;
mod library_level;
mod many_leases;
mod named_handover;
mod pooler;
mod protect;
mod renewal_batches;
mod scale;
mod session_takeover;
mod shared;
mod sql_level;
mod status;
mod takeover;
mod thin;
mod tls;
mod uncommon_paths;

use std::future::Future;
use std::pin::Pin;

use pglease::Error;

use shared::Bench;

/// A measure: it runs on the benchmark's set-up and prints its table.
type Measure = for<'a> fn(&'a Bench) -> Pin<Box<dyn Future<Output = Result<(), Error>> + 'a>>;

/// Every value of `BENCH_ONLY`, and the measure it runs alone: the one
/// list the dispatcher reads.
const ALONE: [(&str, Measure); 18] = [
    ("sql", |b| Box::pin(sql_level::run(b))),
    ("failover", |b| Box::pin(failover::run(b))),
    ("pooler", |b| Box::pin(pooler::run(b))),
    ("status", |b| Box::pin(status::run(b))),
    ("history", |b| Box::pin(history::run(b))),
    ("elect", |b| Box::pin(elect::run(b))),
    ("fenced", |b| Box::pin(fenced::run(b))),
    ("p1", |b| Box::pin(library_level::run(b))),
    ("p2b", |b| Box::pin(many_leases::run(b))),
    ("p3", |b| Box::pin(handover::run(b))),
    ("p3h", |b| Box::pin(named_handover::run(b))),
    ("p4", |b| Box::pin(takeover::run(b))),
    ("p4c", |b| Box::pin(session_takeover::run(b))),
    ("flushes", |b| Box::pin(flushes::run(b))),
    ("tls", |b| Box::pin(tls::run(b))),
    ("thin", |b| Box::pin(thin::run(b))),
    ("declared", |b| Box::pin(declared::run(b))),
    ("groups", |b| Box::pin(groups::run(b))),
];

/// What a run without `BENCH_ONLY` measures, in this order (P1, P6, P1's
/// fenced opening, P5, protected tables, P2, P3, P4, election, history,
/// status, PgBouncer, failover).
const EVERYTHING: [Measure; 13] = [
    |b| Box::pin(library_level::run(b)),
    |b| Box::pin(failed_attempts::run(b)),
    |b| Box::pin(fenced::run(b)),
    |b| Box::pin(scale::run(b)),
    |b| Box::pin(protect::run(b)),
    |b| Box::pin(renewal_batches::run(b)),
    |b| Box::pin(handover::run(b)),
    |b| Box::pin(takeover::run(b)),
    |b| Box::pin(elect::run(b)),
    |b| Box::pin(history::run(b)),
    |b| Box::pin(status::run(b)),
    |b| Box::pin(pooler::run(b)),
    |b| Box::pin(failover::run(b)),
];

#[tokio::main]
async fn main() -> Result<(), Error> {
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let Some(measures) = chosen(&only) else {
        let names: Vec<&str> = ALONE.iter().map(|(name, _)| *name).collect();
        eprintln!(
            "BENCH_ONLY={only}: no such measure; one of {} (docs/benchmark.md), or unset for \
             the full run",
            names.join(", ")
        );
        std::process::exit(2);
    };
    println!("benchmark on {}", shared::database::found().await?);
    let bench = Bench::set_up().await?;
    let mut outcome = Ok(());
    for measure in measures {
        outcome = measure(&bench).await;
        if outcome.is_err() {
            break;
        }
    }
    // `pglease_bench` is dropped after a failed measure too.
    bench.tear_down().await?;
    outcome
}

/// The measures `only` (`BENCH_ONLY`) names: the full run when it is
/// empty, none when it names no measure.
fn chosen(only: &str) -> Option<Vec<Measure>> {
    if only.is_empty() {
        return Some(EVERYTHING.to_vec());
    }
    ALONE
        .iter()
        .find(|(name, _)| *name == only)
        .map(|(_, measure)| vec![*measure])
}
