//! `pglease hand-over NAME --token T --to SUCCESSOR --ttl D`: move a held
//! lease to a successor that waits in its line.

use std::process::ExitCode;
use std::time::Duration;

use pglease::{Error, Fence, LeaseManager};
use serde_json::json;

use crate::exit::{self, Outcome};
use crate::output::{note, out};

/// To whom, for how long, and what if nobody waits under that name.
pub(crate) struct To<'a> {
    pub(crate) successor: &'a str,
    pub(crate) ttl: Duration,
    /// Release the lease when the successor does not wait (else keep it).
    pub(crate) or_release: bool,
}

/// `pglease hand-over`: exit 0 handed over (the successor's token on
/// stdout), 3 when the successor did not wait (the lease kept, or
/// released with `--or-release`), 4 when the lease was not held under the
/// token.
pub(crate) async fn hand_over(
    manager: &LeaseManager,
    fence: &Fence,
    to: To<'_>,
    json: bool,
) -> Outcome {
    let To {
        successor,
        ttl,
        or_release,
    } = to;
    let otherwise = if or_release {
        pglease::WithoutSuccessor::Release
    } else {
        pglease::WithoutSuccessor::Keep
    };
    let handed = manager.hand_over(fence, successor, ttl, otherwise).await;
    let handed = match handed {
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
                   "handed_over": handed.is_some(), "released": handed.is_none() && or_release,
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
        None if or_release => {
            eprintln!(
                "pglease: {successor:?} does not wait in line for {:?}: the lease was \
                 released instead",
                fence.name()
            );
            Ok(exit::conflict())
        }
        None => {
            eprintln!(
                "pglease: {successor:?} does not wait in line for {:?}: the lease is kept, \
                 unchanged, under token {} (check the name; --or-release releases it instead)",
                fence.name(),
                fence.token().get()
            );
            Ok(exit::conflict())
        }
    }
}
