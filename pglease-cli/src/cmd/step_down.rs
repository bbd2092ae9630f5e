//! `pglease step-down NAME`: ask the holder of NAME to step down.

use std::process::ExitCode;

use pglease::{Error, LeaseManager};
use serde_json::json;

use crate::exit::{self, Outcome};
use crate::output::{json_failure, note, out};

/// `pglease step-down NAME`: ask the current holder to step down; exit 3
/// if nobody holds it.
pub(crate) async fn step_down(manager: &LeaseManager, name: &str, by: &str, json: bool) -> Outcome {
    let asked = match manager.request_step_down(name, by).await {
        Err(Error::InvalidInput {
            argument: "requested_by",
            reason,
        }) => {
            eprintln!("pglease: invalid --by: {reason}");
            if json {
                json_failure(&format!("invalid --by: {reason}"), exit::USAGE);
            }
            return Ok(ExitCode::from(exit::USAGE));
        }
        asked => asked.map_err(|e| (e, "step-down"))?,
    };
    if json {
        out!("{}", json!({"name": name, "token": asked.map(|t| t.get())}));
    }
    match asked {
        Some(token) => {
            note!("pglease: asked the holder of {name:?} (token {token}) to step down");
            Ok(ExitCode::SUCCESS)
        }
        None => {
            eprintln!("pglease: nobody holds {name:?}: nobody to ask");
            Ok(ExitCode::from(exit::NOT_ACQUIRED))
        }
    }
}
