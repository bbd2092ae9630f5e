//! `pglease release NAME --token T`: end a lease held under a token.

use std::process::ExitCode;

use pglease::{Error, Fence, LeaseManager};
use serde_json::json;

use crate::exit::{self, Outcome};
use crate::output::{note, out};

/// `pglease release`: exit 0 if this ended the lease, 4 if it was not held.
pub(crate) async fn release(manager: &LeaseManager, fence: &Fence, json: bool) -> Outcome {
    let released = match manager.release(fence).await {
        Ok(released) => released,
        // An acquisition the database forgot in a failover or a restore.
        Err(e @ Error::Lost { .. }) => {
            if json {
                out!(
                    "{}",
                    json!({"name": fence.name(), "token": fence.token().get(), "released": false,
                           "lost": true})
                );
            }
            eprintln!("pglease: {e}: nothing to release");
            return Ok(ExitCode::from(exit::LOST));
        }
        Err(e) => return Err((e, "release")),
    };
    if json {
        out!(
            "{}",
            json!({"name": fence.name(), "token": fence.token().get(), "released": released})
        );
    }
    if released {
        note!(
            "pglease: released {:?} (token {})",
            fence.name(),
            fence.token()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "pglease: lease {:?} was not held under token {} (already released, \
             expired, or taken over): nothing to release",
            fence.name(),
            fence.token()
        );
        Ok(ExitCode::from(exit::LOST))
    }
}
