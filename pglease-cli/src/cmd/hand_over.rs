//! `pglease hand-over NAME --token T --to SUCCESSOR --ttl D`: move a held
//! lease to a successor that waits in its line.

use std::process::ExitCode;
use std::time::Duration;

use pglease::{Error, Fence, LeaseManager};
use serde_json::json;

use crate::exit::{self, Outcome};
use crate::output::{note, out};

/// `pglease hand-over`: exit 0 handed over (the successor's token on
/// stdout), 3 when the successor did not wait and the lease was released
/// instead, 4 when the lease was not held under the token.
pub(crate) async fn hand_over(
    manager: &LeaseManager,
    fence: &Fence,
    successor: &str,
    ttl: Duration,
    json: bool,
) -> Outcome {
    let handed = match manager.hand_over(fence, successor, ttl).await {
        Ok(handed) => handed,
        Err(e @ (Error::NotHeld { .. } | Error::Lost { .. })) => {
            if json {
                out!(
                    "{}",
                    json!({"name": fence.name(), "token": fence.token().get(), "handed_over": false,
                           "released": false})
                );
            }
            eprintln!("pglease: {e}: nothing to hand over");
            return Ok(ExitCode::from(exit::LOST));
        }
        Err(e) => return Err((e, "hand-over")),
    };
    if json {
        out!(
            "{}",
            json!({"name": fence.name(), "token": fence.token().get(),
                   "handed_over": handed.is_some(), "released": handed.is_none(),
                   "successor": successor, "successor_token": handed.map(|t| t.get())})
        );
    }
    match handed {
        Some(token) => {
            if !json {
                out!("{token}");
            }
            note!(
                "pglease: handed {:?} over to {successor:?} (token {token})",
                fence.name()
            );
            Ok(ExitCode::SUCCESS)
        }
        None => {
            eprintln!(
                "pglease: {successor:?} does not wait in line for {:?}: the lease was \
                 released instead",
                fence.name()
            );
            Ok(exit::conflict())
        }
    }
}
