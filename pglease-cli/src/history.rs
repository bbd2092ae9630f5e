//! `history` (a lease's recorded transitions) and `force-release` (the
//! break-glass release that moves a lease's fence).

use std::process::ExitCode;
use std::time::Duration;

use pglease::LeaseManager;
use pglease::history::Transition;
use serde_json::json;

use crate::commands::printable;
use crate::{EXIT_DATABASE, EXIT_NOT_ACQUIRED, Outcome, note, out};

fn transition_json(t: &Transition) -> serde_json::Value {
    json!({
        "id": t.id,
        "name": t.name,
        "token": t.token.get(),
        "event": t.event.as_str(),
        "holder": t.holder,
        "at": t.at.to_rfc3339(),
        "renewals": t.renewals,
        "detail": t.detail,
    })
}

/// `pglease history NAME [--since D] [--json]`: oldest first.
pub(crate) async fn history(
    manager: &LeaseManager,
    name: &str,
    since: Option<Duration>,
    json: bool,
) -> Outcome {
    let since = match since {
        Some(ago) => {
            let ago = chrono::Duration::from_std(ago).unwrap_or(chrono::Duration::MAX);
            Some(
                chrono::Utc::now()
                    .checked_sub_signed(ago)
                    .unwrap_or_default(),
            )
        }
        None => None,
    };
    let rows = manager
        .history(name, since)
        .await
        .map_err(|e| (e, "history"))?;
    if json {
        let rows: Vec<_> = rows.iter().map(transition_json).collect();
        out!("{}", serde_json::Value::Array(rows));
        return Ok(ExitCode::SUCCESS);
    }
    out!(
        "{:<32} {:<20} {:>10}  {:<24} DETAIL",
        "AT",
        "EVENT",
        "TOKEN",
        "HOLDER"
    );
    for t in &rows {
        let mut detail = t.detail.as_deref().map(printable).unwrap_or_default();
        if let Some(renewals) = t.renewals {
            let times = if renewals == 1 { "time" } else { "times" };
            let rest = if detail.is_empty() { "" } else { "; " };
            detail = format!("renewed {renewals} {times}{rest}{detail}");
        }
        out!(
            "{:<32} {:<20} {:>10}  {:<24} {detail}",
            t.at.to_rfc3339(),
            t.event.as_str(),
            t.token,
            t.holder
                .as_deref()
                .map(printable)
                .unwrap_or_else(|| "-".to_owned()),
        );
    }
    if rows.is_empty() {
        note!("pglease: no recorded transitions of {name:?}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `pglease force-release NAME --reason TEXT`: 0 forced, 3 nobody held it.
pub(crate) async fn force_release(
    manager: &LeaseManager,
    name: &str,
    reason: &str,
    json: bool,
) -> Outcome {
    let forced = manager.force_release(name, reason).await;
    if let (true, Ok(token)) = (json, &forced) {
        out!("{}", json!({"name": name, "token": token.map(|t| t.get())}));
    }
    match forced {
        Ok(Some(token)) => {
            note!(
                "pglease: forced {name:?}: token {token} is stale from now on (its holder's \
                 renewal fails and its fenced writes are rejected); recorded in the history"
            );
            Ok(ExitCode::SUCCESS)
        }
        Ok(None) => {
            eprintln!("pglease: nobody holds {name:?}: nothing to force");
            Ok(ExitCode::from(EXIT_NOT_ACQUIRED))
        }
        Err(e) if e.sqlstate() == Some("42501") => {
            let role = manager.pool().connect_options().get_username().to_owned();
            let message = format!(
                "role {role:?} may not force leases ({e}); an administrator allows it: \
                 GRANT EXECUTE ON FUNCTION pglease.force_release(text, text) TO \"{role}\""
            );
            eprintln!("pglease: {message}");
            if json {
                crate::json_failure(&message, EXIT_DATABASE);
            }
            Ok(ExitCode::from(EXIT_DATABASE))
        }
        Err(e) => Err((e, "force-release")),
    }
}
