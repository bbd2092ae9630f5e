//! Exit statuses, and how a library error becomes one (with its message
//! on stderr).

use std::process::ExitCode;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use pglease::connect::Target;
use pglease::{Error, ErrorKind};

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

/// Where this run connects: the database, the hosts and the user, for
/// messages that must say which server they mean.
static PLACE: OnceLock<(String, String, String)> = OnceLock::new();

/// Records where this run connects.
pub(crate) fn set_place(target: &Target) {
    let _ = PLACE.set((
        target.database().to_owned(),
        target.describe(),
        target.user().to_owned(),
    ));
}

/// Records `--conflict-exit-code`.
pub(crate) fn set_conflict(code: u8) {
    CONFLICT.store(code, Ordering::Relaxed);
}

/// The exit status for "held by another" (`--conflict-exit-code`).
pub(crate) fn conflict() -> ExitCode {
    ExitCode::from(CONFLICT.load(Ordering::Relaxed))
}

/// The exit status for an error of `kind` that a command does not handle
/// itself. A refused acquisition ([`ErrorKind::Conflict`]) is each
/// command's to say (`cmd::not_acquired`, with [`conflict`]); one that
/// reaches here failed as the database does.
pub(crate) fn status(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::Usage => USAGE,
        ErrorKind::Lost => LOST,
        _ => DATABASE,
    }
}

/// Says `e` on stderr, as the failure of `what`, and gives its exit status
/// ([`status`] of its kind).
pub(crate) fn fail(e: &Error, what: &str) -> u8 {
    match e.kind() {
        ErrorKind::Usage if matches!(e, Error::InvalidInput { .. }) => {
            eprintln!("pglease: {e}");
        }
        ErrorKind::Usage => {
            eprintln!("pglease: {what}: {e}; check the name and token (nothing was changed)");
        }
        ErrorKind::Lost => {
            eprintln!("pglease: {what}: {e}; acquire it again for a new token");
        }
        ErrorKind::SchemaMissing => {
            let place = PLACE.get().map_or(String::new(), |(database, hosts, _)| {
                format!(" (database {database:?} on {hosts})")
            });
            eprintln!("pglease: {what} failed: {e}{place}; run `pglease migrate` first");
        }
        _ => {
            let grant = PLACE
                .get()
                .and_then(|(_, _, user)| e.grant_needed(user))
                .map_or(String::new(), |grant| {
                    format!("\nThe schema's owner (or a superuser) grants it: {grant};")
                });
            eprintln!("pglease: {what} failed: {e}{grant}");
        }
    }
    status(e.kind())
}
