//! `pglease protect` and `pglease unprotect`: the fences a declared
//! session (`run --declare`) meets, set up and undone in one command each:
//! a table, or a migration tool's version table, that only the lease's
//! holder may write, and the DDL fence.

use std::process::ExitCode;

use pglease::sqlstate::UNDEFINED_TABLE;
use pglease::{Error, LeaseManager};

use crate::args::{ProtectArgs, UnprotectArgs};
use crate::exit::{self, Outcome};
use crate::output::note;

/// `pglease protect [TABLE | --tool TOOL] --lease NAME [--ddl]`: 0 done.
/// Nothing is left half-done: the DDL fence, turned on first (the step
/// that needs a superuser), is turned off again if the table cannot be
/// protected.
pub(crate) async fn protect(manager: &LeaseManager, args: &ProtectArgs) -> Outcome {
    let was_fenced = match args.ddl {
        true => Some(
            manager
                .admin()
                .fence_ddl(true)
                .await
                .map_err(|e| (e, "protect --ddl"))?,
        ),
        false => None,
    };
    if let (Some(table), Some(lease)) = (args.table(), args.lease.as_deref()) {
        if let Err(e) = manager.admin().protect(table, lease).await {
            if was_fenced == Some(false)
                && let Err(undo) = manager.admin().fence_ddl(false).await
            {
                eprintln!(
                    "pglease: the DDL fence, turned on first, could not be turned off again \
                     ({undo}): run pglease unprotect --ddl"
                );
            }
            return missing_table(e, table, args.tool.as_deref(), "protect");
        }
        note!(
            "pglease: {table} is protected by lease {lease:?}: writes need its current token \
             (pglease.assert_held, or a session of `pglease run {lease} --declare`)"
        );
    }
    if let Some(was) = was_fenced {
        note!(
            "pglease: the DDL fence is on{}: each DDL command of a session that declares a \
             lease is checked under its token",
            if was { " (it was already)" } else { "" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `pglease unprotect [TABLE | --tool TOOL] [--ddl]`: 0 done (also when
/// nothing was protected, which it says).
pub(crate) async fn unprotect(manager: &LeaseManager, args: &UnprotectArgs) -> Outcome {
    if let Some(table) = args.table() {
        match manager.admin().unprotect(table).await {
            Ok(true) => note!("pglease: {table} is no longer protected"),
            Ok(false) => note!("pglease: {table} was not protected"),
            Err(e) => return missing_table(e, table, args.tool.as_deref(), "unprotect"),
        }
    }
    if args.ddl {
        let was = manager
            .admin()
            .fence_ddl(false)
            .await
            .map_err(|e| (e, "unprotect --ddl"))?;
        note!(
            "pglease: the DDL fence is off{}",
            if was { "" } else { " (it was already)" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// How a failure to (un)protect `table` ends: a table that does not exist
/// is said plainly (a tool makes its version table on its first run),
/// exit 2, nothing changed; anything else as every other failure.
fn missing_table(e: Error, table: &str, tool: Option<&str>, what: &'static str) -> Outcome {
    if e.sqlstate() != Some(UNDEFINED_TABLE) {
        return Err((e, what));
    }
    match tool {
        Some(tool) => eprintln!(
            "pglease: {what}: table {table} does not exist here: {tool} creates it on its \
             first run. Run the first migration once (the DDL fence, --ddl, checks that run), \
             or create the table as {tool} would, then protect it; nothing was changed"
        ),
        None => eprintln!(
            "pglease: {what}: table {table} does not exist (as the connected role's \
             search_path resolves it); nothing was changed"
        ),
    }
    Ok(ExitCode::from(exit::USAGE))
}
