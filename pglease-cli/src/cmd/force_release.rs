//! `pglease force-release NAME --reason TEXT`: the break-glass release
//! that moves a lease's fence.

use std::process::ExitCode;

use pglease::{Error, LeaseKind, LeaseManager};
use serde_json::json;

use crate::exit::{self, Outcome};
use crate::output::{json_failure, note, out};

/// `pglease force-release NAME --reason TEXT`: 0 forced, 3 nobody held it.
pub(crate) async fn force_release(
    manager: &LeaseManager,
    name: &str,
    reason: &str,
    json: bool,
) -> Outcome {
    // Who held it, for the message only (the force decides on its own).
    let before = manager.inspect(name).await.ok();
    let forced = manager.admin().force_release(name, reason).await;
    if let (true, Ok(token)) = (json, &forced) {
        let kind = before.as_ref().map(|s| s.kind.as_str());
        out!(
            "{}",
            json!({"name": name, "token": token.map(|t| t.get()), "kind": kind})
        );
    }
    match forced {
        Ok(Some(token)) => {
            let whom = match &before {
                Some(s) if s.kind == LeaseKind::Shared => format!(
                    "its {} shared holder(s) ended, tokens up to {token}",
                    s.readers
                ),
                Some(s) if s.kind == LeaseKind::Counted => format!(
                    "its {} held slot(s) ended, tokens up to {token}",
                    s.slots_held
                ),
                _ => format!("token {token} is stale from now on"),
            };
            note!(
                "pglease: forced {name:?}: {whom} (renewals fail and fenced writes are \
                 rejected); recorded in the history"
            );
            Ok(ExitCode::SUCCESS)
        }
        Ok(None) => {
            eprintln!("pglease: nobody holds {name:?}: nothing to force");
            Ok(ExitCode::from(exit::NOT_ACQUIRED))
        }
        Err(e @ Error::NotPermitted { .. }) => {
            let role = manager.pool().connect_options().get_username().to_owned();
            let message = format!(
                "role {role:?} may not force leases ({e}); force-release is for pglease \
                 administrators, which a superuser makes it: GRANT pglease_admin TO \"{role}\""
            );
            eprintln!("pglease: {message}");
            if json {
                json_failure(&message, exit::DATABASE);
            }
            Ok(ExitCode::from(exit::DATABASE))
        }
        Err(e) => Err((e, "force-release")),
    }
}
