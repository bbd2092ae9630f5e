//! `pglease observe NAME`: NAME's state, then every change, one JSON
//! object per line, until interrupted.

use std::process::ExitCode;

use pglease::LeaseManager;
use pglease::Token;
use pglease::observe::Change;
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

use crate::exit::{self, Outcome};
use crate::output::status_json;

/// `pglease observe NAME`: the lease now, then every change, one JSON
/// object per line, until interrupted (exit 0).
pub(crate) async fn observe(manager: &LeaseManager, name: &str) -> Outcome {
    use std::io::Write;
    let (Ok(mut sigterm), Ok(mut sigint)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("pglease: cannot watch for signals");
        return Ok(ExitCode::from(exit::DATABASE));
    };
    let mut observer = manager.observe(name).await.map_err(|e| (e, "observe"))?;
    let mut out = std::io::stdout().lock();
    loop {
        let change = tokio::select! {
            change = observer.next() => change.map_err(|e| (e, "observe"))?,
            _ = sigterm.recv() => return Ok(ExitCode::SUCCESS),
            _ = sigint.recv() => return Ok(ExitCode::SUCCESS),
        };
        // A reader that went away (a closed pipe) ends the observation.
        if writeln!(out, "{}", change_json(name, &change))
            .and_then(|()| out.flush())
            .is_err()
        {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// One change as a JSON object.
fn change_json(name: &str, change: &Change) -> serde_json::Value {
    let token = |t: &Token| t.get();
    match change {
        Change::Current(status) => {
            let mut value = status_json(status);
            value["event"] = json!("current");
            value
        }
        Change::Acquired {
            token: t,
            holder,
            expires_at,
        } => json!({"event": "acquired", "name": name, "token": token(t), "holder": holder,
                     "expires_at": expires_at.to_rfc3339()}),
        Change::ValueChanged { token: t, value } => {
            json!({"event": "value", "name": name, "token": token(t), "value": value})
        }
        Change::StepDownRequested { token: t, by } => {
            json!({"event": "step_down_requested", "name": name, "token": token(t), "by": by})
        }
        Change::Released { token: t } => {
            json!({"event": "released", "name": name, "token": token(t)})
        }
        Change::Expired { token: t } => {
            json!({"event": "expired", "name": name, "token": token(t)})
        }
        other => json!({"event": "unknown", "name": name, "detail": format!("{other:?}")}),
    }
}
