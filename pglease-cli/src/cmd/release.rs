//! `pglease release NAME --token T`: end a lease held under a token.

use std::process::ExitCode;

use pglease::{Fence, LeaseManager};
use serde_json::json;

use crate::exit::{self, Outcome};
use crate::output::{note, out};

/// `pglease release`: exit 0 if this ended the lease, 4 if it was not held.
pub(crate) async fn release(manager: &LeaseManager, fence: &Fence, json: bool) -> Outcome {
    let released = manager.release(fence).await.map_err(|e| (e, "release"))?;
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
