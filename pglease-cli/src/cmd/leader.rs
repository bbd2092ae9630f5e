//! `pglease leader NAME`: who leads NAME now, with its value.

use std::process::ExitCode;

use pglease::LeaseManager;

use crate::exit::{self, Outcome};
use crate::output::{out, printable, status_json};

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
        // One line whatever the holder and value hold: control characters
        // are escaped, as in `status`.
        out!(
            "{}\ttoken {token}\t{}",
            printable(holder),
            status
                .value
                .as_deref()
                .map_or_else(|| "-".to_owned(), printable)
        );
        if let Some(by) = &status.step_down_requested_by {
            eprintln!("pglease: {by:?} asked this leader to step down");
        }
    }
    Ok(ExitCode::SUCCESS)
}
