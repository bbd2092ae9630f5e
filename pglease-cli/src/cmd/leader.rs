//! `pglease leader NAME`: who leads NAME now, with its value.

use std::process::ExitCode;

use pglease::LeaseManager;

use crate::exit::{self, Outcome};
use crate::output::{out, status_json};

/// `pglease leader NAME`: the holder, token and value of the current term;
/// exit 3 if nobody leads.
pub(crate) async fn leader(manager: &LeaseManager, name: &str, json: bool) -> Outcome {
    let status = manager.inspect(name).await.map_err(|e| (e, "leader"))?;
    if json {
        out!("{}", status_json(&status));
    }
    let (true, Some(holder), Some(token)) = (status.held, &status.holder, status.token) else {
        if !json {
            eprintln!("pglease: nobody leads {name:?}");
        }
        return Ok(ExitCode::from(exit::NOT_ACQUIRED));
    };
    if !json {
        out!(
            "{holder}\ttoken {token}\t{}",
            status.value.as_deref().unwrap_or("-")
        );
        if let Some(by) = &status.step_down_requested_by {
            eprintln!("pglease: {by:?} asked this leader to step down");
        }
    }
    Ok(ExitCode::SUCCESS)
}
