//! A test kit for services that use pglease (feature `testing`, for
//! dev-dependencies): a database of its own per test, and lease loss on
//! demand.
//!
//! - [`TestDatabase`]: a fresh database with the schema migrated, on the
//!   server that [`crate::provision`] finds (`DATABASE_URL`, a running
//!   server, a throwaway cluster, a container), dropped afterwards; tests
//!   run in parallel, each in its own database.
//! - [`expire_now`] and [`take_over`]: end a lease in the database at once,
//!   and let another holder have it, without waiting for a TTL.
//! - [`Faults`] (from [`LeaseManager::faults`]): make a manager's renewals
//!   fail as if the server could not be reached, pause its renewal task,
//!   or renew at once.
//!
//! Each drives the code that runs in production: the holder learns of the
//! loss from its renewal or its deadline and reports the same
//! [`LossReason`](crate::LossReason) it would report there, and its fenced
//! writes are rejected by the database. Nothing here can be switched on
//! in a build without the feature, and the SQL side is a plain `UPDATE` of
//! `pglease.leases`, which only the schema's owner (or a role granted
//! `UPDATE` on the table) may run: an application role that follows
//! the documented grants gets `42501`.
//!
//! See docs/library.md, "Testing your service", and `examples/worker_test.rs`.

mod database;
mod faults;

use std::future::Future;
use std::time::Duration;

use sqlx::postgres::PgPool;

use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::limits::check_text;
use crate::manager::LeaseManager;
use crate::options::AcquireOptions;
use crate::provision::{ClusterError, NoServer};

pub use database::TestDatabase;
pub use faults::Faults;

/// Why a [`TestDatabase`] could not be made. Its `Debug` is its message,
/// so that `.expect()` prints it readably.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// No server was found or started.
    #[error(transparent)]
    NoServer(#[from] NoServer),
    /// The server refused to create the database or to apply the schema.
    #[error("cannot set up a test database on {server}: {error}")]
    Database {
        /// The server, as [`Server`](crate::provision::Server)'s `Display` names it.
        server: String,
        /// What failed.
        error: Error,
    },
    /// This machine lacks what the test needs (PgBouncer, the PostgreSQL
    /// server binaries, a command that restarts the server); the text says
    /// what and how to get it. A test harness should report such a test as
    /// ignored, with this text, rather than passed (pglease's own suites
    /// do, unless `PGLEASE_TEST_REQUIRE_ALL` is set).
    #[error("{0}")]
    Unavailable(String),
    /// A throwaway server (a cluster, or another server a test starts) did not
    /// start or did not do what it was asked; the text says which step and
    /// what it printed.
    #[error("{0}")]
    Server(String),
}

impl From<ClusterError> for SetupError {
    fn from(error: ClusterError) -> Self {
        if error.is_missing() {
            SetupError::Unavailable(error.to_string())
        } else {
            SetupError::Server(error.to_string())
        }
    }
}

impl std::fmt::Debug for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Ends lease `name` now, in the database: its expiry becomes the
/// database clock's now, so its token fences nothing from here on (fenced
/// writes fail with `LE001`, renewals are refused, the next acquisition
/// takes it over). Its holder learns of it at its next renewal
/// ([`Faults::renew_now`] makes that happen at once) and loses it with
/// [`LossReason::Stale`](crate::LossReason::Stale). Observers are not
/// notified of the earlier expiry (they see it when they next read).
///
/// Returns whether a held lease was ended (`false`: it was not held).
///
/// # Errors
///
/// [`Error::InvalidInput`] for a bad name; [`Error::NotPermitted`]
/// (SQLSTATE `42501`) for a role that may not update `pglease.leases` (an
/// application role never may).
///
/// # Cancel safety
///
/// One statement: cancelled, it has ended the lease or not.
pub async fn expire_now(pool: &PgPool, name: &str) -> Result<bool> {
    check_text("name", name)?;
    let ended = sqlx::query(
        "UPDATE pglease.leases SET expires_at = clock_timestamp() \
          WHERE name = $1 AND holder IS NOT NULL AND expires_at > clock_timestamp()",
    )
    .persistent(false)
    .bind(name)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(ended > 0)
}

/// Ends lease `name` now ([`expire_now`]) and acquires it through
/// `manager` as `how` says: another holder takes it over, as after a real
/// expiry (a transaction still fenced under the old token is ended, its
/// writes rolled back).
///
/// # Errors
///
/// As [`expire_now`] and [`LeaseManager::acquire`]; [`Error::Timeout`] if
/// the acquisition is held up longer than `how` allows.
///
/// # Cancel safety
///
/// As [`LeaseManager::acquire`]; cancelled after the first step, the lease
/// has ended and nobody holds it.
pub async fn take_over(manager: &LeaseManager, name: &str, how: AcquireOptions) -> Result<Lease> {
    expire_now(manager.pool(), name).await?;
    manager.acquire(name, how).await
}

/// Polls `check` every 10 ms until it yields `true`: the bounded wait a
/// test uses instead of a sleep, for a state that another task, process or
/// server reaches in its own time.
///
/// # Panics
///
/// After `limit`, naming `what` it waited for: the test fails there.
pub async fn poll_until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
