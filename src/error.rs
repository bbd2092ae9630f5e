//! The one error type. Which server error becomes which variant is
//! decided in `sqlstate.rs` (`classify`); `From<sqlx::Error>` here builds
//! the variant it names.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgDatabaseError;

use crate::human::Human;
use crate::sqlstate::{Class, NOT_DECLARED, NOT_HELD, NOT_PERMITTED};
use crate::token::{InvalidToken, Token};

/// Why a held lease is no longer to be trusted.
#[derive(Debug, Clone)]
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
        current_token: Option<Token>,
        /// The lease's current or last holder (`None` once released).
        current_holder: Option<String>,
    },
    /// The lease was released: by this process, by a shutdown, or by anyone
    /// else using the same token.
    Released,
    /// The server session a session-bound lease was bound to has ended
    /// (its connection dropped or its backend was terminated); nobody has
    /// taken the lease yet, but anyone may.
    SessionEnded,
    /// The database changed timeline (a failover to a standby that had not
    /// received the acquisition, or a restore from backup) and does not
    /// know this acquisition: it was lost with the old timeline's latest
    /// commits, and the database refuses its token. Tokens drawn since are
    /// above it, so nobody else holds this token.
    Forgotten {
        /// The timeline the database changed to.
        timeline: i64,
    },
    /// Renewals failed or got no answer until the local deadline; the last
    /// renewal's outcome is unknown (it may still commit).
    Unreachable {
        /// The last renewal error seen ([`Error::Timeout`] for a renewal
        /// that got no answer).
        error: Arc<Error>,
    },
}

/// Two `Unreachable` reasons are equal when their errors read the same.
impl PartialEq for LossReason {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (LossReason::Expired, LossReason::Expired)
            | (LossReason::Released, LossReason::Released)
            | (LossReason::SessionEnded, LossReason::SessionEnded) => true,
            (
                LossReason::Stale {
                    current_token: a,
                    current_holder: b,
                },
                LossReason::Stale {
                    current_token: c,
                    current_holder: d,
                },
            ) => a == c && b == d,
            (LossReason::Forgotten { timeline: a }, LossReason::Forgotten { timeline: b }) => {
                a == b
            }
            (LossReason::Unreachable { error: a }, LossReason::Unreachable { error: b }) => {
                Arc::ptr_eq(a, b) || a.to_string() == b.to_string()
            }
            _ => false,
        }
    }
}

impl Eq for LossReason {}

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
            LossReason::SessionEnded => f.write_str("the server session it was bound to has ended"),
            LossReason::Forgotten { timeline } => forgotten(f, *timeline),
            LossReason::Unreachable { error } => write!(
                f,
                "the database did not confirm a renewal before the local deadline ({error})"
            ),
        }
    }
}

/// Why the database refused a token ([`Error::NotHeld`], SQLSTATE `LE001`).
/// It displays as the clause that ends the error's message, such as "it
/// expired at ...".
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotHeldReason {
    /// The lease has never been acquired.
    NeverAcquired,
    /// The lease was acquired again since: the token is stale.
    Stale {
        /// The lease's latest token.
        current_token: Token,
    },
    /// No such token has been issued for this lease (it is larger than the
    /// latest).
    NotIssued {
        /// The lease's latest token.
        current_token: Token,
    },
    /// The lease was released under this token.
    Released {
        /// When, on the database clock.
        at: DateTime<Utc>,
    },
    /// The lease expired under this token without renewal.
    Expired {
        /// When, on the database clock.
        at: DateTime<Utc>,
    },
    /// The server session the (session-bound) lease was bound to has
    /// ended.
    SessionEnded,
    /// The database changed timeline (a failover or a restore) and does
    /// not know this acquisition: see [`LossReason::Forgotten`].
    Forgotten {
        /// The timeline the database changed to.
        timeline: i64,
    },
    /// The token is a shared holder's ([`AcquireOptions::shared`](crate::AcquireOptions::shared)),
    /// and the check wanted the exclusive holder's (a write under the
    /// lease).
    Shared,
    /// No valid shared holder of the lease has the token (released, or
    /// ended and purged, or never issued).
    NotShared,
    /// The reason could not be read (a server with another version of the
    /// schema); the error's message still says it.
    Unknown,
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
    /// acquisition). Retry after `expires_at`, or wait for a release.
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
    /// waiting acquisition keeps trying until its wait is over.
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

    /// Not acquired: the lease is free, but `ahead` acquirers wait in line
    /// for it before this one (first come, first served: see
    /// [`AcquireOptions::fair`](crate::AcquireOptions::fair)). A fair
    /// acquisition that waits gets its turn.
    #[error("lease {name:?} is free, but {ahead} acquirer(s) wait in line for it before this one")]
    InLine {
        /// The lease name.
        name: String,
        /// How many wait before this acquisition.
        ahead: u32,
    },

    /// Not acquired: the line for `name` already has as many waiters as
    /// the acquisition allowed
    /// ([`AcquireOptions::max_waiting`](crate::AcquireOptions::max_waiting)).
    #[error("the line for {name:?} is full: {waiting} acquirer(s) wait in it")]
    LineFull {
        /// The lease name (for a set, its names joined with ", ").
        name: String,
        /// How many wait in the line (the longest of a set's lines).
        waiting: u32,
    },

    /// Not acquired because the database changed timeline (a failover or a
    /// restore) and an administrator set a grant delay
    /// (`pglease.set_grant_delay`): no lease is granted until `until`, so
    /// that a holder whose acquisition the change lost has stopped its side
    /// effects. A waiting acquisition waits for it. Renewals of the leases
    /// the database knows go on meanwhile.
    #[error("lease {name:?} is not granted until {until}: {reason}")]
    GrantDelayed {
        /// The lease name.
        name: String,
        /// When grants resume, on the database clock.
        until: DateTime<Utc>,
        /// The database's explanation.
        reason: String,
    },

    /// The database rejected a guarded check or write (SQLSTATE `LE001`):
    /// stop acting on the resource; acquire again for a new token.
    #[error("lease {name:?} is not held under token {}: {}", DisplayToken(*token), reason)]
    NotHeld {
        /// The lease name.
        name: String,
        /// The token that was refused (`None` if the lease was never
        /// acquired, where the database does not say).
        token: Option<Token>,
        /// Why.
        reason: NotHeldReason,
    },

    /// A write to a protected table came from a transaction that declared
    /// no token for its lease (SQLSTATE `LE002`).
    #[error("{message}")]
    NotDeclared {
        /// The database's explanation, naming the table and the lease.
        message: String,
    },

    /// The database refused an operation this session's role may not make
    /// (SQLSTATE `42501`): acting under a lease another role acquired,
    /// acquiring a name granted to other roles, an administrator's
    /// operation, or a function the role may not execute. Nothing was
    /// changed.
    #[error("{message}")]
    NotPermitted {
        /// The database's explanation, naming the role and the lease or
        /// the function.
        message: String,
    },

    /// The `pglease` schema is missing from this database, or older than
    /// this version (SQLSTATE `3F000`, `42883` or `42P01` naming the
    /// schema or an object in it): run the migration
    /// ([`LeaseManager::migrate`](crate::LeaseManager::migrate), or
    /// `pglease migrate`). Retrying does not help; nothing was changed.
    #[error("the pglease schema is missing or out of date in this database ({})", DatabaseText(.0))]
    SchemaMissing(#[source] sqlx::Error),

    /// The server refuses writes (SQLSTATE `25006`): a standby, or a
    /// primary in read-only mode. With several hosts, list the primary's
    /// with `target_session_attrs=read-write` (the default then); after a
    /// failover, connecting again finds the new primary. Nothing was
    /// changed.
    #[error("{}", DatabaseText(.0))]
    ReadOnly(#[source] sqlx::Error),

    /// The lease is lost: a renewal found it no longer valid, or a held
    /// lease's local deadline passed without a confirmed renewal. Stop
    /// starting new work under this token; `reason` says what happened.
    #[error("lease {name:?} under token {token} is lost: {reason}")]
    Lost {
        /// The lease name.
        name: String,
        /// The token that is no longer valid.
        token: Token,
        /// Why the lease is considered lost.
        reason: LossReason,
    },

    /// A statement got no answer in time (a renewal or a release).
    #[error("no answer to the {operation}{}", after.map(|a| format!(" within {}", Human(a))).unwrap_or_default())]
    Timeout {
        /// What was sent.
        operation: &'static str,
        /// How long it waited, when known.
        after: Option<Duration>,
    },

    /// The manager was shut down ([`LeaseManager::shutdown`](crate::LeaseManager::shutdown)):
    /// it no longer acquires or holds leases.
    #[error("the lease manager has been shut down")]
    ShutDown,

    /// Applying the `pglease` schema failed.
    #[error("pglease migration failed: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),

    /// The database holds a `pglease` schema this version cannot use:
    /// migrated by a newer version (`newer`), or by a development version
    /// with another migration history. Nothing was changed.
    #[error("{}", SchemaText { version: *.version, newer: *.newer })]
    IncompatibleSchema {
        /// The first recorded migration this version does not know (or
        /// knows with different contents).
        version: i64,
        /// Whether that migration is later than every one this version has.
        newer: bool,
    },

    /// The database could not be reached or failed for another reason.
    #[error("{}", DatabaseText(.0))]
    Database(#[source] sqlx::Error),
}

/// What an [`Error`] asks of its caller, in five kinds: the one grouping
/// of the variants, for callers (a command line's exit status, a retry
/// policy) that decide by kind rather than by variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The call was wrong and nothing was changed: an argument was
    /// rejected ([`Error::InvalidInput`]), or the lease is not held under
    /// the token given ([`Error::NotHeld`]).
    Usage,
    /// Not acquired: someone else has the lease, or it cannot be granted
    /// yet ([`Error::Held`], [`Error::Pinned`], [`Error::InLine`],
    /// [`Error::LineFull`], [`Error::GrantDelayed`]).
    Conflict,
    /// A lease that was held is lost ([`Error::Lost`]).
    Lost,
    /// The database has no `pglease` schema, or an older one
    /// ([`Error::SchemaMissing`]): run the migration.
    SchemaMissing,
    /// Everything else: the database refused ([`Error::NotDeclared`],
    /// [`Error::NotPermitted`], [`Error::ReadOnly`]), failed or could not
    /// be reached ([`Error::Database`], [`Error::Timeout`]), the schema is
    /// one this version cannot use or cannot apply ([`Error::Migrate`],
    /// [`Error::IncompatibleSchema`]), or the manager was shut down
    /// ([`Error::ShutDown`]).
    Database,
}

struct SchemaText {
    version: i64,
    newer: bool,
}

impl std::fmt::Display for SchemaText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.newer {
            write!(
                f,
                "the pglease schema in this database was migrated by a newer pglease \
                 (migration {} is unknown here): use that version or a later one",
                self.version
            )
        } else {
            write!(
                f,
                "the pglease schema in this database was made by a development version of \
                 pglease with another migration history (migration {} differs; before 0.1 the \
                 schema came in seven files): nothing was changed. For a development database \
                 only, drop it once and migrate again: `DROP SCHEMA pglease CASCADE` (every \
                 lease, token and history row in it goes, and tables protected with \
                 pglease.protect lose their protection: protect them again)",
                self.version
            )
        }
    }
}

struct DisplayToken(Option<Token>);

impl std::fmt::Display for DisplayToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(token) => token.fmt(f),
            None => f.write_str("(any)"),
        }
    }
}

impl std::fmt::Display for NotHeldReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotHeldReason::NeverAcquired => f.write_str("it has never been acquired"),
            NotHeldReason::Stale { current_token } => write!(
                f,
                "the token is stale, the lease was acquired again with token {current_token}"
            ),
            NotHeldReason::NotIssued { current_token } => write!(
                f,
                "no such token has been issued (the latest is {current_token})"
            ),
            NotHeldReason::Released { at } => write!(f, "it was released at {at}"),
            NotHeldReason::Expired { at } => write!(f, "it expired at {at}"),
            NotHeldReason::SessionEnded => {
                f.write_str("the server session it was bound to has ended")
            }
            NotHeldReason::Forgotten { timeline } => forgotten(f, *timeline),
            NotHeldReason::Shared => f.write_str(
                "it is a shared holder's token; writes under the lease need the exclusive \
                 holder's",
            ),
            NotHeldReason::NotShared => f.write_str("no valid shared holder has that token"),
            NotHeldReason::Unknown => f.write_str("the database refused it"),
        }
    }
}

/// The one wording of [`LossReason::Forgotten`] and
/// [`NotHeldReason::Forgotten`].
fn forgotten(f: &mut std::fmt::Formatter<'_>, timeline: i64) -> std::fmt::Result {
    write!(
        f,
        "the database failed over or was restored (it is now on timeline {timeline}) and does not \
         know this acquisition: it was lost with the old timeline's latest commits"
    )
}

/// A database error said once: the server's message and its SQLSTATE,
/// without sqlx's prefixes or the server's source location.
struct DatabaseText<'a>(&'a sqlx::Error);

impl std::fmt::Display for DatabaseText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            sqlx::Error::Database(db) => {
                let message = db.message();
                let message = message.strip_prefix("pglease: ").unwrap_or(message);
                match db.code() {
                    // A standby, or a primary that refuses writes: pglease
                    // cannot work there, and the server's message does not
                    // say what to do.
                    Some(code) if code == crate::sqlstate::READ_ONLY => write!(
                        f,
                        "database error {code}: {message} (the server is read-only: a standby? \
                         List the primary's hosts with target_session_attrs=read-write, the \
                         default with several hosts)"
                    ),
                    Some(code) => write!(f, "database error {code}: {message}"),
                    None => write!(f, "database error: {message}"),
                }
            }
            sqlx::Error::Io(io) => write!(f, "cannot reach the database: {io}"),
            sqlx::Error::Tls(tls) => write!(f, "cannot reach the database (TLS): {tls}"),
            sqlx::Error::PoolTimedOut => {
                f.write_str("cannot reach the database: no connection within the pool's timeout")
            }
            sqlx::Error::PoolClosed => f.write_str("the connection pool is closed"),
            sqlx::Error::Protocol(what) => write!(f, "protocol error: {what}"),
            other => write!(f, "database error: {other}"),
        }
    }
}

impl Error {
    /// This error's [`ErrorKind`].
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidInput { .. } | Error::NotHeld { .. } => ErrorKind::Usage,
            Error::Held { .. }
            | Error::Pinned { .. }
            | Error::InLine { .. }
            | Error::LineFull { .. }
            | Error::GrantDelayed { .. } => ErrorKind::Conflict,
            Error::Lost { .. } => ErrorKind::Lost,
            Error::SchemaMissing(_) => ErrorKind::SchemaMissing,
            Error::NotDeclared { .. }
            | Error::NotPermitted { .. }
            | Error::ReadOnly(_)
            | Error::Timeout { .. }
            | Error::ShutDown
            | Error::Migrate(_)
            | Error::IncompatibleSchema { .. }
            | Error::Database(_) => ErrorKind::Database,
        }
    }

    /// The SQLSTATE behind this error, when the database raised it.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::NotHeld { .. } => Some(NOT_HELD),
            Error::NotDeclared { .. } => Some(NOT_DECLARED),
            Error::NotPermitted { .. } => Some(NOT_PERMITTED),
            Error::Database(e) | Error::SchemaMissing(e) | Error::ReadOnly(e) => e
                .as_database_error()
                .and_then(|d| d.try_downcast_ref::<PgDatabaseError>())
                .map(PgDatabaseError::code),
            _ => None,
        }
    }

    /// For a privilege the server refused (SQLSTATE `42501`, "permission
    /// denied for schema pglease", "... for view status", "... for
    /// function force_release"), the `GRANT` that gives it to `role`, run
    /// by the schema's owner or a superuser. `None` for anything else, and
    /// for pglease's own refusals of acting under another role's lease,
    /// which no grant fixes.
    pub fn grant_needed(&self, role: &str) -> Option<String> {
        if self.sqlstate() != Some(NOT_PERMITTED) {
            return None;
        }
        let message = match self {
            Error::NotPermitted { message } => message.as_str(),
            Error::Database(e) => e.as_database_error()?.message(),
            _ => return None,
        };
        let (kind, object) = message
            .strip_prefix("permission denied for ")?
            .split_once(' ')?;
        let object = object.trim().trim_matches('"');
        let role = format!("\"{}\"", role.replace('"', "\"\""));
        let qualified = |o: &str| {
            if o.contains('.') {
                o.to_owned()
            } else {
                format!("pglease.{o}")
            }
        };
        Some(match kind {
            "schema" => format!("GRANT USAGE ON SCHEMA {object} TO {role}"),
            "table" | "view" => format!("GRANT SELECT ON {} TO {role}", qualified(object)),
            "sequence" => format!("GRANT USAGE ON SEQUENCE {} TO {role}", qualified(object)),
            "function" => format!(
                "GRANT EXECUTE ON FUNCTION {} TO {role} (for administrators' functions: \
                 GRANT pglease_admin TO {role})",
                qualified(object)
            ),
            _ => return None,
        })
    }

    pub(crate) fn invalid(argument: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            argument,
            reason: reason.into(),
        }
    }
}

/// The arguments the SQL functions name (in the error's COLUMN field;
/// checked against the schema by a unit test below). renew_many names an
/// element's argument (name, token, ttl), or `names` for the arrays.
const ARGUMENTS: [&str; 27] = [
    "name",
    "holder",
    "ttl",
    "token",
    "resource",
    "tbl",
    "names",
    "value",
    "requested_by",
    "reason",
    "slots",
    "names",
    "prefix",
    "role",
    "retention",
    "max_rows",
    "session_bound",
    "delay",
    "max_waiting",
    "ticket",
    "successor",
    "fair",
    "fenced",
    "group",
    "member",
    "partition",
    "partitions",
];

impl From<sqlx::Error> for Error {
    /// Maps the SQLSTATEs that `pglease` functions raise to their variants;
    /// everything else is `Database`.
    fn from(e: sqlx::Error) -> Self {
        let Some(db) = e
            .as_database_error()
            .and_then(|d| d.try_downcast_ref::<PgDatabaseError>())
        else {
            return Error::Database(e);
        };
        let message = || db.message().trim_start_matches("pglease: ").to_owned();
        match crate::sqlstate::classify(db.code(), db.message()) {
            Class::NotHeld => not_held(db.detail()),
            Class::NotDeclared => Error::NotDeclared { message: message() },
            Class::NotPermitted => Error::NotPermitted { message: message() },
            Class::InvalidInput => Error::InvalidInput {
                argument: db
                    .column()
                    .and_then(|c| ARGUMENTS.into_iter().find(|a| *a == c))
                    .unwrap_or("argument"),
                reason: message(),
            },
            Class::SchemaMissing => Error::SchemaMissing(e),
            Class::ReadOnly => Error::ReadOnly(e),
            Class::Other => Error::Database(e),
        }
    }
}

impl From<InvalidToken> for Error {
    /// [`Error::InvalidInput`] for argument `token`, with the same message.
    fn from(e: InvalidToken) -> Self {
        Error::invalid("token", e.reason())
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        match e {
            sqlx::migrate::MigrateError::Execute(e) => Error::from(e),
            e => Error::Migrate(e),
        }
    }
}

/// `assert_held`'s DETAIL: `key=value` fields separated by spaces, `name`
/// last (it may contain spaces). See `assert_held` in `migrations/0001_schema.sql`.
fn not_held(detail: Option<&str>) -> Error {
    let detail = detail.unwrap_or_default();
    let (fields, name) = match detail.split_once(" name=") {
        Some((fields, name)) => (fields, name.to_owned()),
        None => (detail, String::new()),
    };
    let field = |key: &str| {
        fields
            .split(' ')
            .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
    };
    let token_field = |key: &str| {
        field(key)
            .and_then(|v| v.parse::<i64>().ok())
            .map(Token::issued)
    };
    let time_field = |key: &str| {
        field(key)
            .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
            .map(|t| t.with_timezone(&Utc))
    };
    let reason = match field("reason") {
        Some("never_acquired") => Some(NotHeldReason::NeverAcquired),
        Some("stale") => {
            token_field("current_token").map(|current_token| NotHeldReason::Stale { current_token })
        }
        Some("not_issued") => token_field("current_token")
            .map(|current_token| NotHeldReason::NotIssued { current_token }),
        Some("released") => time_field("at").map(|at| NotHeldReason::Released { at }),
        Some("expired") => time_field("at").map(|at| NotHeldReason::Expired { at }),
        Some("session_ended") => Some(NotHeldReason::SessionEnded),
        Some("shared") => Some(NotHeldReason::Shared),
        Some("not_shared") => Some(NotHeldReason::NotShared),
        Some("forgotten") => field("timeline")
            .and_then(|v| v.parse().ok())
            .map(|timeline| NotHeldReason::Forgotten { timeline }),
        _ => None,
    };
    Error::NotHeld {
        name,
        token: token_field("token"),
        reason: reason.unwrap_or(NotHeldReason::Unknown),
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::ARGUMENTS;
    use std::collections::BTreeSet;

    /// Every argument name the schema's functions put in an error's COLUMN
    /// field: the literal ones (`COLUMN = 'ttl'`) and those passed to the
    /// text check (`_check_text('name', ...)`), which raises with
    /// `COLUMN = argument`.
    fn schema_arguments() -> BTreeSet<String> {
        let schema = crate::schema::SOURCE;
        let mut found = BTreeSet::new();
        for marker in ["COLUMN = '", "pglease._check_text('"] {
            for (at, _) in schema.match_indices(marker) {
                let rest = &schema[at + marker.len()..];
                let end = rest.find('\'').expect("a closing quote");
                found.insert(rest[..end].to_owned());
            }
        }
        found
    }

    #[test]
    fn the_argument_names_are_the_schemas() {
        let schema = schema_arguments();
        let ours: BTreeSet<String> = ARGUMENTS.iter().map(|a| (*a).to_owned()).collect();
        let missing: Vec<_> = schema.difference(&ours).collect();
        assert!(
            missing.is_empty(),
            "raised by the schema, not in ARGUMENTS: {missing:?}"
        );
        let never: Vec<_> = ours.difference(&schema).collect();
        assert!(
            never.is_empty(),
            "in ARGUMENTS, raised by no function: {never:?}"
        );
    }
}
