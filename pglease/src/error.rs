//! The one error type, and the single place where SQLSTATEs are mapped.

use chrono::{DateTime, Utc};

/// SQLSTATE raised by `pglease` functions for invalid arguments.
pub const SQLSTATE_INVALID_INPUT: &str = "22023";
/// SQLSTATE raised when a lease is not held under the given token.
pub const SQLSTATE_NOT_HELD: &str = "LE001";
/// SQLSTATE raised for a write to a protected table without a declared token.
pub const SQLSTATE_NOT_DECLARED: &str = "LE002";

/// Why a held lease is no longer to be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The local deadline (last confirmed renewal sent + TTL − safety
    /// margin, on the monotonic clock) passed without a confirmed renewal,
    /// and no renewal had failed: typically the process or its runtime was
    /// paused or starved. The database may still show the lease for up to
    /// the safety margin.
    Expired,
    /// The database no longer accepts the token: the lease expired there,
    /// or was acquired again (`current_token` is then larger).
    Stale {
        /// The lease's latest token, if it was ever acquired.
        current_token: Option<i64>,
        /// The lease's current or last holder (`None` once released).
        current_holder: Option<String>,
    },
    /// The lease was released: by this process, by a shutdown, or by anyone
    /// else using the same token.
    Released,
    /// Renewals failed or got no answer until the local deadline; the last
    /// renewal's outcome is unknown (it may still commit).
    Unreachable {
        /// The last renewal error seen.
        error: String,
    },
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::Expired => {
                f.write_str("its local deadline passed without a confirmed renewal")
            }
            LossReason::Stale {
                current_token: Some(current),
                current_holder,
            } => write!(
                f,
                "the database no longer accepts the token (latest token {current}, holder {})",
                current_holder.as_deref().unwrap_or("none")
            ),
            LossReason::Stale { .. } => f.write_str("the database has no such lease"),
            LossReason::Released => f.write_str("it was released"),
            LossReason::Unreachable { error } => write!(
                f,
                "the database did not confirm a renewal before the local deadline ({error})"
            ),
        }
    }
}

/// Everything that can go wrong in `pglease`, named for what a caller can do
/// about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was rejected before anything was changed.
    #[error("invalid {argument}: {reason}")]
    InvalidInput {
        /// Which argument (`name`, `holder`, `ttl`, `token`, `resource`, ...).
        argument: &'static str,
        /// Why it was rejected.
        reason: String,
    },

    /// The lease is held by someone else and has not expired (a failed
    /// `try_acquire`). Retry after `expires_at`, or wait for a release.
    #[error("lease {name:?} is held by {holder:?} until {expires_at}")]
    Held {
        /// The lease name.
        name: String,
        /// The current holder.
        holder: String,
        /// When the current holder's lease expires unless renewed.
        expires_at: DateTime<Utc>,
    },

    /// The lease has ended (expired or released), but its row is still
    /// held by a transaction that the database could not end within the
    /// takeover grace: typically a transaction fenced on it under an
    /// earlier token whose session the role that owns the `pglease`
    /// functions may not end (it needs `pg_signal_backend`); `reason` says
    /// which. The lease can be acquired once that transaction ends; a
    /// waiting acquisition keeps trying until its `max_wait`.
    #[error("lease {name:?} has ended (at {ended_at}) but cannot be taken yet: {reason}")]
    Pinned {
        /// The lease name.
        name: String,
        /// The last holder, if the lease expired (`None` if it was released).
        holder: Option<String>,
        /// When the lease ended, on the database clock.
        ended_at: DateTime<Utc>,
        /// What holds it, from the database (the same text as the WARNING
        /// in the server's log).
        reason: String,
    },

    /// The database rejected a guarded check or write: the token is stale,
    /// the lease expired, was released, or was never acquired (SQLSTATE
    /// `LE001`). Stop acting on the resource; acquire again for a new token.
    #[error("{message}")]
    NotHeld {
        /// The database's explanation, naming the lease and the reason.
        message: String,
    },

    /// A write to a protected table came from a transaction that declared
    /// no token for its lease (SQLSTATE `LE002`).
    #[error("{message}")]
    NotDeclared {
        /// The database's explanation, naming the table and the lease.
        message: String,
    },

    /// The lease is lost: a renewal found it no longer valid, or a held
    /// lease's local deadline passed without a confirmed renewal. Stop
    /// starting new work under this token; `reason` says what happened.
    #[error("lease {name:?} under token {token} is lost: {reason}")]
    Lost {
        /// The lease name.
        name: String,
        /// The token that is no longer valid.
        token: i64,
        /// Why the lease is considered lost.
        reason: LossReason,
    },

    /// The manager was shut down ([`LeaseManager::shutdown`](crate::LeaseManager::shutdown)):
    /// it no longer acquires or holds leases.
    #[error("the lease manager has been shut down")]
    ShutDown,

    /// Applying the `pglease` schema failed.
    #[error("pglease migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),

    /// The database could not be reached or failed for another reason.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
}

impl Error {
    /// The SQLSTATE behind this error, when the database raised it.
    pub fn sqlstate(&self) -> Option<String> {
        match self {
            Error::NotHeld { .. } => Some(SQLSTATE_NOT_HELD.to_owned()),
            Error::NotDeclared { .. } => Some(SQLSTATE_NOT_DECLARED.to_owned()),
            Error::Database(e) => e
                .as_database_error()
                .and_then(|d| d.code())
                .map(|c| c.into_owned()),
            _ => None,
        }
    }

    pub(crate) fn invalid(argument: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            argument,
            reason: reason.into(),
        }
    }
}

impl From<sqlx::Error> for Error {
    /// Maps the SQLSTATEs that `pglease` functions raise to their variants;
    /// everything else is `Database`.
    fn from(e: sqlx::Error) -> Self {
        let Some(db) = e.as_database_error() else {
            return Error::Database(e);
        };
        let message = db.message().to_owned();
        match db.code().as_deref() {
            Some(SQLSTATE_NOT_HELD) => Error::NotHeld { message },
            Some(SQLSTATE_NOT_DECLARED) => Error::NotDeclared { message },
            Some(SQLSTATE_INVALID_INPUT) if message.starts_with("pglease: ") => {
                // The functions' messages start with the argument's name.
                let named = message.trim_start_matches("pglease: ");
                let argument = ["name", "holder", "ttl", "token", "resource"]
                    .into_iter()
                    .find(|a| named.starts_with(&format!("{a} ")))
                    .unwrap_or("argument");
                Error::InvalidInput {
                    argument,
                    reason: message,
                }
            }
            _ => Error::Database(e),
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
