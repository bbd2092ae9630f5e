//! `pglease history NAME`: a lease's recorded transitions, oldest first.

use std::process::ExitCode;
use std::time::Duration;

use pglease::LeaseManager;
use pglease::history::Transition;
use serde_json::json;

use crate::exit::Outcome;
use crate::output::{note, out, printable};

/// `pglease history NAME [--since D] [--json]`: oldest first.
pub(crate) async fn history(
    manager: &LeaseManager,
    name: &str,
    since: Option<Duration>,
    json: bool,
) -> Outcome {
    // "The last D" on the database clock, which recorded the times: never
    // this machine's clock against a database timestamp.
    let since = match since {
        Some(ago) => {
            let now = manager
                .admin()
                .database_time()
                .await
                .map_err(|e| (e, "history"))?;
            let ago = chrono::Duration::from_std(ago).unwrap_or(chrono::Duration::MAX);
            Some(now.checked_sub_signed(ago).unwrap_or_default())
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
        "{:<32} {:<20} {:>10}  {:<24} {:<16} DETAIL",
        "AT",
        "EVENT",
        "TOKEN",
        "HOLDER",
        "ROLE"
    );
    for t in &rows {
        let mut detail = t.detail.as_deref().map(printable).unwrap_or_default();
        if let Some(renewals) = t.renewals {
            let times = if renewals == 1 { "time" } else { "times" };
            let rest = if detail.is_empty() { "" } else { "; " };
            detail = format!("renewed {renewals} {times}{rest}{detail}");
        }
        out!(
            "{:<32} {:<20} {:>10}  {:<24} {:<16} {detail}",
            t.at.to_rfc3339(),
            t.event.as_str(),
            t.token,
            t.holder
                .as_deref()
                .map(printable)
                .unwrap_or_else(|| "-".to_owned()),
            t.role
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
        "role": t.role,
    })
}
