//! The metrics pglease records through the `metrics` facade: without a
//! recorder installed (the service's Prometheus or OpenTelemetry exporter)
//! each call is a no-op. The names are listed in [`METRICS`] and in
//! docs/library.md, "Metrics".

use std::time::Duration;

use crate::error::LossReason;

/// Every metric pglease records: (name, kind, labels, meaning).
pub const METRICS: &[(&str, &str, &str, &str)] = &[
    (
        ACQUIRE_ATTEMPTS,
        "counter",
        "outcome = acquired | held | pinned | in_line | delayed | error",
        "acquisition statements answered",
    ),
    (
        ACQUISITIONS,
        "counter",
        "outcome = acquired | held | pinned | in_line | delayed | error",
        "acquire/hold calls, by how they ended (after any wait)",
    ),
    (
        ACQUIRE_SECONDS,
        "histogram",
        "",
        "time from an acquire/hold call to the lease, waits included",
    ),
    (
        TAKEOVER_DELAY_SECONDS,
        "histogram",
        "",
        "database time from the previous holder's expiry to a waiter's acquisition of the lease",
    ),
    (
        RENEWAL_STATEMENTS,
        "counter",
        "",
        "renewal statements sent (each renews every lease due)",
    ),
    (
        RENEWALS,
        "counter",
        "",
        "lease renewals confirmed by the database",
    ),
    (
        RENEWAL_FAILURES,
        "counter",
        "",
        "renewal statements that failed or timed out (retried)",
    ),
    (
        LEASE_ENDS,
        "counter",
        "reason = released | stale | expired | session_ended | forgotten | unreachable",
        "held leases that ended, by reason (released: by its holder or someone else)",
    ),
    (
        LEASES_HELD,
        "gauge",
        "",
        "leases held with background renewal, by all managers of the process",
    ),
    (WAITING, "gauge", "", "acquirers waiting for a lease"),
    (
        RENEWAL_OUTAGES,
        "counter",
        "event = failing | recovered",
        "held leases whose renewals started failing, and that renewed again before their deadline",
    ),
    (
        RENEWAL_OUTAGE_SECONDS,
        "histogram",
        "",
        "from a lease's first failed renewal to the next confirmed one (a failover, say)",
    ),
    (
        HOST_SWITCHES,
        "counter",
        "",
        "times a manager of several hosts followed the primary to another host",
    ),
    (
        GROUP_PARTITIONS,
        "gauge",
        "group",
        "partitions this process's members of a lease group own",
    ),
    (
        GROUP_MOVES,
        "counter",
        "group, event = taken | handed_over | released | lost",
        "partitions a lease group member took, handed over, released or lost",
    ),
];

/// Describes every metric of [`METRICS`] to the recorder installed (its
/// meaning becomes the exporter's help text, `# HELP` in Prometheus'
/// format; the histograms are in seconds). Call it once, after installing
/// the recorder; without one it does nothing.
pub fn describe() {
    for &(name, kind, _, meaning) in METRICS {
        match kind {
            "counter" => metrics::describe_counter!(name, meaning),
            "gauge" => metrics::describe_gauge!(name, meaning),
            _ => metrics::describe_histogram!(name, metrics::Unit::Seconds, meaning),
        }
    }
}

const ACQUIRE_ATTEMPTS: &str = "pglease_acquire_attempts_total";
const ACQUISITIONS: &str = "pglease_acquisitions_total";
const ACQUIRE_SECONDS: &str = "pglease_acquire_seconds";
const TAKEOVER_DELAY_SECONDS: &str = "pglease_takeover_delay_seconds";
const RENEWAL_STATEMENTS: &str = "pglease_renewal_statements_total";
const RENEWALS: &str = "pglease_renewals_total";
const RENEWAL_FAILURES: &str = "pglease_renewal_failures_total";
const LEASE_ENDS: &str = "pglease_lease_ends_total";
const LEASES_HELD: &str = "pglease_leases_held";
const WAITING: &str = "pglease_acquirers_waiting";
const RENEWAL_OUTAGES: &str = "pglease_renewal_outages_total";
const RENEWAL_OUTAGE_SECONDS: &str = "pglease_renewal_outage_seconds";
const HOST_SWITCHES: &str = "pglease_host_switches_total";
const GROUP_PARTITIONS: &str = "pglease_group_partitions";
const GROUP_MOVES: &str = "pglease_group_moves_total";

pub(crate) fn acquire_attempt(outcome: &'static str) {
    metrics::counter!(ACQUIRE_ATTEMPTS, "outcome" => outcome).increment(1);
}

pub(crate) fn acquisition(outcome: &'static str, took: Option<Duration>) {
    metrics::counter!(ACQUISITIONS, "outcome" => outcome).increment(1);
    if let Some(took) = took {
        metrics::histogram!(ACQUIRE_SECONDS).record(took.as_secs_f64());
    }
}

pub(crate) fn takeover_delay(delay: Duration) {
    metrics::histogram!(TAKEOVER_DELAY_SECONDS).record(delay.as_secs_f64());
}

pub(crate) fn renewal_statement() {
    metrics::counter!(RENEWAL_STATEMENTS).increment(1);
}

pub(crate) fn renewed(leases: u64, failed: bool) {
    metrics::counter!(RENEWALS).increment(leases);
    if failed {
        metrics::counter!(RENEWAL_FAILURES).increment(1);
    }
}

pub(crate) fn lease_ended(reason: &LossReason) {
    let reason = match reason {
        LossReason::Released => "released",
        LossReason::Stale { .. } => "stale",
        LossReason::Expired => "expired",
        LossReason::SessionEnded => "session_ended",
        LossReason::Forgotten { .. } => "forgotten",
        LossReason::Unreachable { .. } => "unreachable",
    };
    metrics::counter!(LEASE_ENDS, "reason" => reason).increment(1);
}

/// Leases held by every manager of the process: +1 or -1.
pub(crate) fn leases_held(change: f64) {
    metrics::gauge!(LEASES_HELD).increment(change);
}

pub(crate) fn waiting(change: f64) {
    metrics::gauge!(WAITING).increment(change);
}

/// `failing` leases' renewals started failing; `recovered` ones renewed
/// again, after outages of `lasted`.
pub(crate) fn renewal_outages(failing: u64, recovered: &[Duration]) {
    if failing > 0 {
        metrics::counter!(RENEWAL_OUTAGES, "event" => "failing").increment(failing);
    }
    if !recovered.is_empty() {
        metrics::counter!(RENEWAL_OUTAGES, "event" => "recovered")
            .increment(recovered.len() as u64);
        for lasted in recovered {
            metrics::histogram!(RENEWAL_OUTAGE_SECONDS).record(lasted.as_secs_f64());
        }
    }
}

pub(crate) fn host_switch() {
    metrics::counter!(HOST_SWITCHES).increment(1);
}

/// Partitions of `group` the member owns now.
pub(crate) fn group_partitions(group: &str, owned: usize) {
    metrics::gauge!(GROUP_PARTITIONS, "group" => group.to_owned()).set(owned as f64);
}

/// `count` partitions of `group` moved by `event`.
pub(crate) fn group_moves(group: &str, event: &'static str, count: usize) {
    if count > 0 {
        metrics::counter!(GROUP_MOVES, "group" => group.to_owned(), "event" => event)
            .increment(count as u64);
    }
}
