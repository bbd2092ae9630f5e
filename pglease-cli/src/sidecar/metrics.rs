//! The command line's own metrics, beside the library's
//! (`pglease::telemetry::METRICS`), and the recorder that renders both
//! for `/metrics`. Without `--http` no recorder is installed and each
//! call is a no-op.

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use super::board::{Kind, Snapshot};

/// Every metric the command line records itself: (name, kind, labels,
/// meaning), as `pglease::telemetry::METRICS` lists the library's.
pub(crate) const CLI_METRICS: &[(&str, &str, &str, &str)] = &[
    (
        STATE,
        "gauge",
        "command = run | elect | share, state",
        "1 for the state the command is in now, 0 for its other states",
    ),
    (
        READY,
        "gauge",
        "command",
        "1 while /readyz answers 200 (elect: leading; run: CMD running under valid leases; share: a member)",
    ),
    (
        CMD_STARTS,
        "counter",
        "command",
        "times CMD was started (restarts included)",
    ),
    (
        CMD_RESTARTS,
        "counter",
        "command",
        "times CMD was started again after it exited by itself (elect: after a failure; share: any exit)",
    ),
    (
        SIGNALS_FORWARDED,
        "counter",
        "command, signal",
        "signals pglease received and forwarded to CMD's process group (run)",
    ),
];

const STATE: &str = "pglease_cli_state";
const READY: &str = "pglease_cli_ready";
const CMD_STARTS: &str = "pglease_cli_cmd_starts_total";
const CMD_RESTARTS: &str = "pglease_cli_cmd_restarts_total";
const SIGNALS_FORWARDED: &str = "pglease_cli_signals_forwarded_total";

/// The buckets of every histogram (all in seconds): from a prompt
/// handover (about a millisecond) to a long wait for a lease.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Installs the Prometheus recorder for the whole process and describes
/// every metric; its handle renders them. `Err` if a recorder is
/// installed already.
pub(crate) fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets(BUCKETS)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    pglease::telemetry::describe();
    for &(name, kind, _, meaning) in CLI_METRICS {
        if kind == "counter" {
            metrics::describe_counter!(name, meaning);
        } else {
            metrics::describe_gauge!(name, meaning);
        }
    }
    Ok(handle)
}

/// Sets the gauges read off `snapshot`, before a scrape renders them.
pub(crate) fn show(snapshot: &Snapshot) {
    let command = snapshot.kind.as_str();
    for &phase in snapshot.kind.phases() {
        let now = if phase == snapshot.phase { 1.0 } else { 0.0 };
        metrics::gauge!(STATE, "command" => command, "state" => phase.as_str()).set(now);
    }
    let ready = if snapshot.readiness().is_ok() {
        1.0
    } else {
        0.0
    };
    metrics::gauge!(READY, "command" => command).set(ready);
}

/// CMD was started; `again`: after it had exited by itself.
pub(crate) fn cmd_started(kind: Kind, again: bool) {
    metrics::counter!(CMD_STARTS, "command" => kind.as_str()).increment(1);
    if again {
        metrics::counter!(CMD_RESTARTS, "command" => kind.as_str()).increment(1);
    }
}

/// `run` forwarded `signal` to CMD.
pub(crate) fn signal_forwarded(signal: nix::sys::signal::Signal) {
    metrics::counter!(SIGNALS_FORWARDED, "command" => Kind::Run.as_str(), "signal" => signal.as_str())
        .increment(1);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::CLI_METRICS;

    /// Every series a name of either list can produce in Prometheus'
    /// format (a histogram's `_bucket`, `_sum` and `_count`).
    fn series() -> BTreeSet<String> {
        let mut all = BTreeSet::new();
        for &(name, kind, _, _) in pglease::telemetry::METRICS.iter().chain(CLI_METRICS) {
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    all.insert(format!("{name}{suffix}"));
                }
            } else {
                all.insert(name.to_owned());
            }
        }
        all
    }

    /// The metric names an expression names: words starting `pglease_`.
    fn named(expr: &str) -> Vec<String> {
        let mut names = Vec::new();
        let mut rest = expr;
        while let Some(at) = rest.find("pglease_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.push(tail[..end].to_owned());
            rest = &tail[end..];
        }
        names
    }

    /// Every query of the dashboard (a panel's `expr`, a variable's
    /// `definition`), wherever it sits in the JSON.
    fn exprs(value: &serde_json::Value, found: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, v) in map {
                    match (key.as_str(), v) {
                        ("expr" | "definition", serde_json::Value::String(e)) => {
                            found.push(e.clone())
                        }
                        _ => exprs(v, found),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| exprs(v, found)),
            _ => {}
        }
    }

    #[test]
    fn the_grafana_dashboard_names_only_series_that_exist() {
        let text = include_str!("../../../docs/grafana/pglease.json");
        let dashboard: serde_json::Value = match serde_json::from_str(text) {
            Ok(dashboard) => dashboard,
            Err(e) => panic!("docs/grafana/pglease.json is not JSON: {e}"),
        };
        let mut found = Vec::new();
        exprs(&dashboard, &mut found);
        assert!(found.len() >= 8, "only {} queries found", found.len());
        let series = series();
        let mut used = BTreeSet::new();
        for expr in &found {
            let names = named(expr);
            assert!(!names.is_empty(), "{expr:?} names no pglease series");
            for name in names {
                assert!(
                    series.contains(&name),
                    "{expr:?} names {name}, which does not exist"
                );
                used.insert(name);
            }
        }
        // The questions the dashboard is for: leadership and its changes,
        // waits, renewal failures and outages.
        for needed in [
            "pglease_cli_ready",
            "pglease_acquisitions_total",
            "pglease_acquire_seconds_bucket",
            "pglease_renewal_failures_total",
            "pglease_lease_ends_total",
            "pglease_renewal_outages_total",
        ] {
            assert!(
                used.contains(needed),
                "the dashboard does not show {needed}"
            );
        }
    }

    #[test]
    fn the_command_lines_metrics_are_named_once_under_their_prefix() {
        let names: BTreeSet<&str> = CLI_METRICS.iter().map(|m| m.0).collect();
        assert_eq!(names.len(), CLI_METRICS.len());
        assert!(names.iter().all(|n| n.starts_with("pglease_cli_")));
        let library: BTreeSet<&str> = pglease::telemetry::METRICS.iter().map(|m| m.0).collect();
        assert!(names.is_disjoint(&library));
    }
}
