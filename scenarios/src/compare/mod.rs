//! The failure scenarios, run live against the database for a
//! lease with fencing, a session-level advisory lock and a
//! transaction-level advisory lock. Every outcome is measured, not
//! assumed: whether a stale write landed, whether another worker could take
//! over without the old holder's cooperation, and how long that took.
//!
//! The scenarios are the engine's ([`crate::engine`]); this module
//! supplies the demo's three contenders. Used by the test suite and by
//! `pglease demo`.

mod harness;
mod lease;
mod locks;

use std::time::Duration;

use pglease::LeaseManager;

use crate::engine::{self, BoxError, Ledger, Observer, Scenario, Stage, Verdict};
use harness::{Ctx, unique};
use lease::LeaseContender;
use locks::{SessionContender, XactContender};

/// A way of guarding a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// A pglease lease with fenced (database-checked) writes.
    Lease,
    /// A session-level advisory lock (`pg_try_advisory_lock`).
    SessionLock,
    /// A transaction-level advisory lock (`pg_try_advisory_xact_lock`),
    /// with the writes in the same transaction.
    XactLock,
}

impl Variant {
    /// All variants, in table order.
    pub const ALL: [Variant; 3] = [Variant::Lease, Variant::SessionLock, Variant::XactLock];

    /// A short label.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Lease => "lease + fencing",
            Variant::SessionLock => "session advisory lock",
            Variant::XactLock => "transaction advisory lock",
        }
    }

    /// The lease's TTL in `scenario` at `unit` ([`run`]'s and [`play`]'s);
    /// `None` for the advisory locks, which do not expire.
    pub fn ttl(self, scenario: Scenario, unit: Duration) -> Option<Duration> {
        match self {
            Variant::Lease => Some(lease::ttl(scenario, unit)),
            Variant::SessionLock | Variant::XactLock => None,
        }
    }

    /// A shorter label, for the table's header.
    pub fn short_label(self) -> &'static str {
        match self {
            Variant::Lease => "lease + fencing",
            Variant::SessionLock => "session lock",
            Variant::XactLock => "xact lock",
        }
    }
}

/// What one scenario did to one variant, as measured.
pub type Outcome = Verdict<Variant>;

/// Runs every scenario against every variant, reporting each outcome as it
/// is measured. `unit` scales the scenario (a lease's TTL is two units);
/// the whole run takes about 30 units. Creates a ledger table of its own
/// for the guarded data and drops it afterwards; lease and lock names
/// carry the process id.
///
/// # Errors
///
/// The database failing in a way a scenario does not expect.
pub async fn run(
    manager: &LeaseManager,
    unit: Duration,
    mut report: impl FnMut(&Outcome),
) -> Result<Vec<Outcome>, BoxError> {
    let tag = format!("{}_{}", std::process::id(), unique());
    let pool = manager.pool();
    let ledger = Ledger::create(pool, &format!("pglease_compare_{tag}")).await?;
    let window = move |scenario| harness::window(unit, scenario);
    let stage = Stage::new(&ledger, pool, &window);
    let mut outcomes = Vec::new();
    let mut failure = None;
    'all: for scenario in Scenario::ALL {
        for variant in Variant::ALL {
            let ctx = Ctx {
                m: manager.clone(),
                ledger: ledger.clone(),
                name: format!("compare-{tag}-{scenario:?}-{variant:?}"),
                unit,
                scenario,
            };
            match play_on(&stage, ctx, variant).await {
                Ok(outcome) => {
                    report(&outcome);
                    outcomes.push(outcome);
                }
                Err(e) => {
                    failure = Some(e);
                    break 'all;
                }
            }
        }
    }
    let dropped = ledger.drop(pool).await;
    if let Some(e) = failure {
        return Err(e);
    }
    dropped?;
    Ok(outcomes)
}

/// Plays `scenario` against `variant` on the lease or lock `name`, at the
/// same `unit` as [`run`], telling `observer` each step (the demo tells
/// scenario (a) this way, through a [`crate::Narrator`]). Creates a ledger
/// table of its own and drops it afterwards.
///
/// # Errors
///
/// The database failing in a way the scenario does not expect.
pub async fn play(
    manager: &LeaseManager,
    scenario: Scenario,
    variant: Variant,
    name: &str,
    unit: Duration,
    observer: &dyn Observer,
) -> Result<Outcome, BoxError> {
    let tag = format!("{}_{}", std::process::id(), unique());
    let pool = manager.pool();
    let ledger = Ledger::create(pool, &format!("pglease_compare_{tag}")).await?;
    let window = move |scenario| harness::window(unit, scenario);
    let stage = Stage::new(&ledger, pool, &window).observed(observer);
    let ctx = Ctx {
        m: manager.clone(),
        ledger: ledger.clone(),
        name: name.to_owned(),
        unit,
        scenario,
    };
    let outcome = play_on(&stage, ctx, variant).await;
    let dropped = ledger.drop(pool).await;
    let outcome = outcome?;
    dropped?;
    Ok(outcome)
}

/// `ctx`'s scenario against `variant`'s contender, on `stage`.
async fn play_on(stage: &Stage<'_>, ctx: Ctx, variant: Variant) -> Result<Outcome, BoxError> {
    let scenario = ctx.scenario;
    match variant {
        Variant::Lease => engine::run(stage, scenario, variant, &LeaseContender::new(ctx)).await,
        Variant::SessionLock => {
            engine::run(stage, scenario, variant, &SessionContender::new(ctx)).await
        }
        Variant::XactLock => engine::run(stage, scenario, variant, &XactContender::new(ctx)).await,
    }
}

/// The outcomes as a Markdown table, aligned and at most 100 columns wide:
/// one row per scenario, one column per variant; each cell says "safe" or
/// "UNSAFE" and how long until another worker took over ("none": nobody
/// did).
pub fn table(outcomes: &[Outcome]) -> String {
    let header: Vec<&str> = std::iter::once("scenario")
        .chain(Variant::ALL.iter().map(|v| v.short_label()))
        .collect();
    let mut rows: Vec<Vec<String>> = Vec::new();
    for s in Scenario::ALL {
        let mut row = vec![s.label().to_owned()];
        for v in Variant::ALL {
            row.push(
                match outcomes
                    .iter()
                    .find(|o| o.scenario == s && o.contender == v)
                {
                    Some(o) => {
                        let verdict = if o.safe() { "safe" } else { "UNSAFE" };
                        match o.took_over {
                            Some(t) => format!("{verdict}, {} ms", t.as_millis()),
                            None => format!("{verdict}, none"),
                        }
                    }
                    None => "not run".to_owned(),
                },
            );
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain(std::iter::once(header[i].chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[&str]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("| {} |", padded.join(" | "))
    };
    let mut out = line(&header);
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
    out.push('\n');
    out.push_str(&line(&rule).replace(' ', "-"));
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        out.push('\n');
        out.push_str(&line(&cells));
    }
    out.push_str(
        "\n(safe or UNSAFE, then the time until another worker took over; none: nobody did)",
    );
    out
}
