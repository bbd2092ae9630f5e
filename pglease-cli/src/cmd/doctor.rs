//! `pglease doctor`: is this server fit for leases (schema, durability,
//! standbys and timelines, takeover privilege; with several hosts, each
//! host and whether a failover fits the TTL)?

use std::process::ExitCode;

use std::time::Duration;

use pglease::LeaseManager;
use pglease::connect::Target;
use pglease::doctor::{DoctorOptions, PatroniTiming, Verdict};
use serde_json::json;

use crate::args::DoctorArgs;
use crate::exit::{self, Outcome};
use crate::output::out;

/// `pglease doctor`: every check, one line each (or one JSON object); exit
/// 0 only when all are ok, 1 otherwise.
pub(crate) async fn doctor(manager: &LeaseManager, args: DoctorArgs) -> Outcome {
    // The failover time: given, from pg_auto_failover's monitor, or from
    // Patroni's REST API.
    let DoctorArgs {
        json,
        ttl,
        failover_time,
        monitor,
        patroni,
    } = args;
    let mut options = DoctorOptions::new();
    if let Some(ttl) = ttl {
        options = options.ttl(ttl);
    }
    if let Some(time) = failover_time {
        options = options.failover_time(time);
    }
    // Checked when the arguments were parsed.
    if let Some(monitor) = monitor.and_then(|m| Target::parse(&m).ok()) {
        options = options.monitor(monitor);
    }
    // Asked only when the failover time is not given.
    if let Some(url) = patroni.filter(|_| failover_time.is_none()) {
        match patroni_timing(url.clone()).await {
            Ok(timing) => options = options.patroni(timing),
            // The other checks go on; the failover check says it cannot
            // tell.
            Err(e) => eprintln!(
                "pglease: cannot read Patroni's configuration from {url}/config ({e}); check \
                 --patroni (Patroni's restapi.connect_address), or give --failover-time"
            ),
        }
    }
    let diagnosis = manager
        .admin()
        .doctor(&options)
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

/// Patroni's timing from its REST API's `GET /config` (the dynamic
/// configuration; a setting it leaves out has Patroni's default).
async fn patroni_timing(url: String) -> Result<PatroniTiming, String> {
    let body = tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        agent
            .get(format!("{url}/config"))
            .call()
            .and_then(|mut response| response.body_mut().read_to_string())
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())??;
    let config: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("not JSON: {e}"))?;
    // An object; a setting it leaves out has Patroni's default.
    if !config.is_object() {
        return Err(format!(
            "not Patroni's dynamic configuration: {}",
            body.chars().take(80).collect::<String>()
        ));
    }
    let seconds = |key: &str, default: Duration| -> Result<Duration, String> {
        match config.get(key) {
            None | Some(serde_json::Value::Null) => Ok(default),
            // Patroni takes numbers, and numbers written as strings.
            Some(value) => value
                .as_u64()
                .or_else(|| value.as_str().and_then(|s| s.trim().parse().ok()))
                .map(Duration::from_secs)
                .ok_or_else(|| format!("{key} is {value}, not a number of seconds")),
        }
    };
    let default = PatroniTiming::DEFAULT;
    Ok(PatroniTiming::new(
        seconds("ttl", default.ttl)?,
        seconds("loop_wait", default.loop_wait)?,
        seconds("retry_timeout", default.retry_timeout)?,
    ))
}
