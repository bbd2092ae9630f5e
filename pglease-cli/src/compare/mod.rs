//! The article's failure scenarios, run live against the database for a
//! lease with fencing, a session-level advisory lock and a
//! transaction-level advisory lock. Every outcome is measured, not
//! assumed: whether a stale write landed, whether another worker could take
//! over without the old holder's cooperation, and how long that took.
//!
//! Used by the test suite and by `pglease demo`.

mod harness;
mod lease;
mod locks;

use std::time::Duration;

use pglease::{LeaseManager, Result};
use sqlx::AssertSqlSafe;

use harness::{Harness, unique};

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

    /// A shorter label, for the table's header.
    pub fn short_label(self) -> &'static str {
        match self {
            Variant::Lease => "lease + fencing",
            Variant::SessionLock => "session lock",
            Variant::XactLock => "xact lock",
        }
    }
}

/// A failure scenario from the article.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// (a) The holder pauses past the TTL, another worker takes over and
    /// writes, then the first holder's delayed write arrives.
    PausedHolder,
    /// (b) The holder's connection is killed, another worker takes over,
    /// then the first holder writes through a fresh connection.
    KilledConnection,
    /// (c) The holder process dies without releasing.
    DeadHolder,
    /// (d) A delayed duplicate release arrives after the same holder
    /// acquired again.
    DuplicateRelease,
    /// (e) The holder's own renewal (or liveness check) gets no answer:
    /// does anything stop it from starting new work?
    RenewalTimeout,
}

impl Scenario {
    /// All scenarios, in table order.
    pub const ALL: [Scenario; 5] = [
        Scenario::PausedHolder,
        Scenario::KilledConnection,
        Scenario::DeadHolder,
        Scenario::DuplicateRelease,
        Scenario::RenewalTimeout,
    ];

    /// A short label.
    pub fn label(self) -> &'static str {
        match self {
            Scenario::PausedHolder => "(a) holder pauses past the TTL",
            Scenario::KilledConnection => "(b) holder's connection killed",
            Scenario::DeadHolder => "(c) holder dies without releasing",
            Scenario::DuplicateRelease => "(d) delayed duplicate release",
            Scenario::RenewalTimeout => "(e) holder's renewal gets no answer",
        }
    }
}

/// What one scenario did to one variant, as measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The scenario.
    pub scenario: Scenario,
    /// The variant.
    pub variant: Variant,
    /// No write from a holder that had lost its right landed, and no two
    /// workers could act as holders at once.
    pub safe: bool,
    /// How long until another worker held the resource without the old
    /// holder's cooperation; `None` if it could not within the scenario.
    pub took_over: Option<Duration>,
    /// What happened, in one sentence with the measured figures.
    pub detail: String,
}

/// Runs every scenario against every variant, reporting each outcome as it
/// is measured. `unit` scales the scenario (a lease's TTL is two units);
/// the whole run takes about 25 units. Creates a table of its own for the
/// guarded data and drops it afterwards; lease and lock names carry the
/// process id.
pub async fn run(
    manager: &LeaseManager,
    unit: Duration,
    mut report: impl FnMut(&Outcome),
) -> Result<Vec<Outcome>> {
    let tag = format!("{}_{}", std::process::id(), unique());
    let table = format!("pglease_compare_{tag}");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id int PRIMARY KEY, value text NOT NULL)"
    )))
    .execute(manager.pool())
    .await?;
    let h = Harness {
        m: manager.clone(),
        table: table.clone(),
        tag,
        unit,
    };
    let mut outcomes = Vec::new();
    let mut failure = None;
    'all: for scenario in Scenario::ALL {
        for variant in Variant::ALL {
            match h.run(scenario, variant).await {
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
    let dropped = sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
        .execute(manager.pool())
        .await;
    if let Some(e) = failure {
        return Err(e);
    }
    dropped?;
    Ok(outcomes)
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
                match outcomes.iter().find(|o| o.scenario == s && o.variant == v) {
                    Some(o) => {
                        let verdict = if o.safe { "safe" } else { "UNSAFE" };
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
