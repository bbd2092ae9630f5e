//! `pglease doctor`: is this server fit for leases (schema, durability,
//! synchronous standbys, takeover privilege)?

use std::process::ExitCode;

use pglease::LeaseManager;
use pglease::doctor::Verdict;
use serde_json::json;

use crate::exit::{self, Outcome};
use crate::output::out;

/// `pglease doctor`: every check, one line each (or one JSON object); exit
/// 0 only when all are ok, 1 otherwise.
pub(crate) async fn doctor(manager: &LeaseManager, json: bool) -> Outcome {
    let diagnosis = manager.doctor().await.map_err(|e| (e, "doctor"))?;
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
