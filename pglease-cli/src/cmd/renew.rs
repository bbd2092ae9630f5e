//! `pglease renew NAME --token T --ttl D`: extend a lease held under a
//! token.

use std::process::ExitCode;
use std::time::Duration;

use pglease::{Error, Fence, LeaseManager, Token};
use serde_json::json;

use crate::exit::{self, Outcome};
use crate::output::{lease_json, out};

pub(crate) async fn renew(
    manager: &LeaseManager,
    name: &str,
    token: Token,
    ttl: Duration,
    json: bool,
) -> Outcome {
    let fence = Fence::new(name, token).map_err(|e| (e, "renew"))?;
    match manager.renew(&fence, ttl).await {
        Ok(expires_at) => {
            if json {
                let status = manager.inspect(name).await.map_err(|e| (e, "renew"))?;
                out!(
                    "{}",
                    lease_json(
                        name,
                        status.holder.as_deref(),
                        Some(token),
                        Some(expires_at)
                    )
                );
            } else {
                out!(
                    "renewed {name:?} under token {token}: held {}",
                    crate::output::from_now(expires_at)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ Error::Lost { .. }) => {
            if json {
                // As `acquire --json` when not acquired: the lease as
                // found, with no token of this caller's.
                let status = manager.inspect(name).await.map_err(|e| (e, "renew"))?;
                let mut found = lease_json(name, status.holder.as_deref(), None, None);
                found["lost"] = json!(true);
                found["current_token"] = json!(status.token.map(Token::get));
                out!("{found}");
            }
            eprintln!("pglease: {e}; acquire it again for a new token");
            Ok(ExitCode::from(exit::LOST))
        }
        Err(e) => Err((e, "renew")),
    }
}
