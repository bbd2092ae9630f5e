//! `pglease migrate`: create or upgrade the `pglease` schema, and say
//! whether a takeover from a holder frozen inside a fenced transaction can
//! work here.

use std::process::ExitCode;

use pglease::LeaseManager;
use serde_json::json;

use crate::exit::Outcome;
use crate::output::{note, out};

pub(crate) async fn migrate(manager: &LeaseManager, json: bool) -> Outcome {
    let migrated = manager.migrate().await.map_err(|e| (e, "migrate"))?;
    if json {
        out!(
            "{}",
            json!({"applied": migrated.applied, "latest": migrated.latest})
        );
    }
    let span = |v: &[i64]| match (v.first(), v.last()) {
        (Some(first), Some(last)) if first != last => format!("migrations {first} to {last}"),
        (Some(only), _) => format!("migration {only}"),
        _ => String::new(),
    };
    match migrated.applied.first() {
        None => note!(
            "pglease: the schema is up to date (migration {}); nothing applied",
            migrated.latest
        ),
        Some(1) => note!(
            "pglease: created the pglease schema ({})",
            span(&migrated.applied)
        ),
        Some(_) => note!(
            "pglease: upgraded the pglease schema ({} applied)",
            span(&migrated.applied)
        ),
    }
    let can_end = manager
        .admin()
        .can_end_stale_transactions()
        .await
        .map_err(|e| (e, "migrate"))?;
    if !can_end {
        let owner = manager
            .admin()
            .functions_owner()
            .await
            .map_err(|e| (e, "migrate"))?;
        eprintln!(
            "pglease: note: role {owner:?}, which owns the pglease functions, is neither a \
             superuser nor a member of pg_signal_backend. An expired lease whose holder froze \
             inside a fenced transaction then stays pinned until that transaction ends (and \
             acquire reports it as pinned) unless the holders connect as {owner:?} itself. \
             To allow the takeover, a superuser runs: GRANT pg_signal_backend TO {owner};"
        );
    }
    Ok(ExitCode::SUCCESS)
}
