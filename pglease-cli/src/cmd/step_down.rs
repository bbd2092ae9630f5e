//! `pglease step-down NAME`: ask the holder of NAME to step down.

use std::process::ExitCode;

use pglease::{Error, LeaseKind, LeaseManager};
use serde_json::json;

use crate::exit::{self, Outcome};
use crate::output::{json_failure, note, out};

/// `pglease step-down NAME`: ask the current holder to step down; exit 3
/// if nobody holds it, 2 if only shared holders or slots do.
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
        None => not_asked(manager, name).await,
    }
}

/// Why nobody was asked: nobody holds `name` (exit 3), or its holders are
/// shared or slots, which a step-down request does not address (exit 2).
async fn not_asked(manager: &LeaseManager, name: &str) -> Outcome {
    let status = manager.inspect(name).await.map_err(|e| (e, "step-down"))?;
    match status.kind {
        LeaseKind::Shared => {
            eprintln!(
                "pglease: {name:?} is held shared by {} holder(s): a step-down request asks an \
                 exclusive holder (a leader), so nobody was asked; `pglease force-release` \
                 ends shared holders",
                status.readers
            );
            Ok(ExitCode::from(exit::USAGE))
        }
        LeaseKind::Counted => {
            eprintln!(
                "pglease: {name:?} is a counted lease ({} of {} slots held): ask the holder of \
                 one slot, `pglease step-down {name}#K`; nobody was asked",
                status.slots_held,
                status.slots.unwrap_or(0)
            );
            Ok(ExitCode::from(exit::USAGE))
        }
        _ => {
            eprintln!("pglease: nobody holds {name:?}: nobody to ask");
            Ok(ExitCode::from(exit::NOT_ACQUIRED))
        }
    }
}
