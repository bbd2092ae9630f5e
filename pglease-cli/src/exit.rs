//! Exit statuses, and how a library error becomes one (with its message
//! on stderr).

use std::process::ExitCode;
use std::sync::atomic::{AtomicU8, Ordering};

use pglease::Error;

/// Exit status of `doctor` when a check is not ok.
pub(crate) const PROBLEMS: u8 = 1;
/// Bad usage or bad input (clap uses it too); nothing was changed.
pub(crate) const USAGE: u8 = 2;
/// Not acquired (held by another), or nobody holds it.
pub(crate) const NOT_ACQUIRED: u8 = 3;
/// The lease is lost (renew, release, run).
pub(crate) const LOST: u8 = 4;
/// The database is unreachable or failed.
pub(crate) const DATABASE: u8 = 5;
/// `run --timeout`: CMD ran out of time (as timeout(1)).
pub(crate) const TIMED_OUT: u8 = 124;
/// CMD cannot be started.
pub(crate) const CANNOT_START: u8 = 127;

/// What a command ends with: its exit status, or the library's error and
/// the name of the step that failed.
pub(crate) type Outcome = Result<ExitCode, (Error, &'static str)>;

static CONFLICT: AtomicU8 = AtomicU8::new(NOT_ACQUIRED);

/// Records `--conflict-exit-code`.
pub(crate) fn set_conflict(code: u8) {
    CONFLICT.store(code, Ordering::Relaxed);
}

/// The exit status for "held by another" (`--conflict-exit-code`).
pub(crate) fn conflict() -> ExitCode {
    ExitCode::from(CONFLICT.load(Ordering::Relaxed))
}

/// Says `e` on stderr, as the failure of `what`, and gives its exit status.
pub(crate) fn fail(e: &Error, what: &str) -> u8 {
    match e {
        Error::InvalidInput { .. } => {
            eprintln!("pglease: {e}");
            USAGE
        }
        Error::NotHeld { .. } => {
            eprintln!("pglease: {what}: {e}; check the name and token (nothing was changed)");
            USAGE
        }
        Error::Lost { .. } => {
            eprintln!("pglease: {what}: {e}; acquire it again for a new token");
            LOST
        }
        Error::SchemaMissing(_) => {
            eprintln!("pglease: {what} failed: {e}; run `pglease migrate` first");
            DATABASE
        }
        _ => {
            eprintln!("pglease: {what} failed: {e}");
            DATABASE
        }
    }
}
