//! The one error type, and the single place where SQLSTATEs are mapped.

use chrono::{DateTime, Utc};

/// SQLSTATE raised by `pglease` functions for invalid arguments.
pub const SQLSTATE_INVALID_INPUT: &str = "22023";
/// SQLSTATE raised when a lease is not held under the given token.
pub const SQLSTATE_NOT_HELD: &str = "LE001";
/// SQLSTATE raised for a write to a protected table without a declared token.
pub const SQLSTATE_NOT_DECLARED: &str = "LE002";

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

    /// A renewal found the lease no longer valid: it expired, was released,
    /// or was taken over. Stop starting new work under this token.
    #[error("lease {name:?} under token {token} is lost (expired, released or taken over)")]
    Lost {
        /// The lease name.
        name: String,
        /// The token that is no longer valid.
        token: i64,
    },

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
