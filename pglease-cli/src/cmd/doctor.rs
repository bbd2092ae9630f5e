//! `pglease doctor`: is this server fit for leases (schema, durability,
//! synchronous standbys, takeover privilege; with several hosts, each
//! host and whether a failover fits the TTL)?

use std::process::ExitCode;

use std::time::Duration;

use pglease::LeaseManager;
use pglease::connect::Target;
use pglease::doctor::{DoctorOptions, Verdict};
use serde_json::json;

use crate::exit::{self, Outcome};
use crate::output::out;

/// `pglease doctor`: every check, one line each (or one JSON object); exit
/// 0 only when all are ok, 1 otherwise.
pub(crate) async fn doctor(
    manager: &LeaseManager,
    json: bool,
    ttl: Option<Duration>,
    failover_time: Option<Duration>,
    monitor: Option<&str>,
) -> Outcome {
    let mut options = DoctorOptions::new();
    options.ttl = ttl;
    options.failover_time = failover_time;
    // Checked when the arguments were parsed.
    options.monitor = monitor.and_then(|m| Target::parse(m).ok());
    let diagnosis = manager
        .doctor_with(&options)
        .await
        .map_err(|e| (e, "doctor"))?;
    if json {
        let checks: Vec<serde_json::Value> = diagnosis
            .checks
            .iter()
            .map(|c| json!({"name": c.name, "verdict": c.verdict.to_string(), "detail": c.detail}))
            .collect();
        out!(
            "{}",
            json!({"verdict": diagnosis.verdict().to_string(), "checks": checks})
        );
    } else {
        for check in &diagnosis.checks {
            out!("{:<8} {:<15} {}", check.verdict, check.name, check.detail);
        }
    }
    Ok(if diagnosis.verdict() == Verdict::Ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit::PROBLEMS)
    })
}
