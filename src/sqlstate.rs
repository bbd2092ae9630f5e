//! The SQLSTATEs the `pglease` functions raise, for clients that match on
//! them ([`Error::sqlstate`](crate::Error::sqlstate) gives an error's), and
//! the server's own that pglease reacts to, each named once here.

/// Invalid arguments (`invalid_parameter_value`); the error's COLUMN field
/// names the argument.
pub const INVALID_INPUT: &str = "22023";

/// A lease not held under the given token (stale, expired, released, never
/// issued), in `pglease.assert_held` or a write to a protected table; the
/// DETAIL field says why.
pub const NOT_HELD: &str = "LE001";

/// A write to a protected table from a transaction that declared no token
/// for its lease.
pub const NOT_DECLARED: &str = "LE002";

/// An operation the session's login role may not make
/// (`insufficient_privilege`): acting under a lease another role acquired,
/// acquiring a name granted to other roles, or an administrator's
/// operation (see docs/design.md, "Roles and grants").
pub const NOT_PERMITTED: &str = "42501";

/// A write to a table that carries pglease's guard trigger but was never
/// protected with `pglease.protect` (`object_not_in_prerequisite_state`).
pub const NOT_PROTECTED: &str = "55000";

/// The fence sequence has no room left to move past an old timeline's
/// tokens (`sequence_generator_limit_exceeded`): after a failover or a
/// restore, with tokens within `2^40` of `i64::MAX`.
pub const FENCE_EXHAUSTED: &str = "2200H";

/// An acquisition with a ticket whose place in line has ended (taken,
/// left, its session ended, or not kept within its TTL): join again.
pub const NOT_IN_LINE: &str = "LE003";

/// Raised and caught inside `pglease.acquire_all` to undo a set it could
/// not take whole; it never reaches a client.
pub const SET_UNDONE: &str = "LE099";

// The server's own SQLSTATEs that pglease reacts to (the functions raise
// READ_ONLY and LOCK_NOT_AVAILABLE too, with messages of their own).

/// The server refuses writes (`read_only_sql_transaction`): a standby, or
/// a primary in read-only mode.
pub const READ_ONLY: &str = "25006";

/// A lock could not be taken in time (`lock_not_available`): a
/// `lock_timeout` ran out.
pub const LOCK_NOT_AVAILABLE: &str = "55P03";

/// `undefined_function`: with [`UNDEFINED_TABLE`] and
/// [`INVALID_SCHEMA_NAME`], what a database without the `pglease` schema
/// (or with an older one) answers.
pub const UNDEFINED_FUNCTION: &str = "42883";

/// `undefined_table` (see [`UNDEFINED_FUNCTION`]).
pub const UNDEFINED_TABLE: &str = "42P01";

/// `invalid_schema_name` (see [`UNDEFINED_FUNCTION`]).
pub const INVALID_SCHEMA_NAME: &str = "3F000";

/// `invalid_sql_statement_name`: a prepared statement the connection
/// believed it had is not on the server session it was given (a
/// transaction pooler in between); with [`DUPLICATE_STATEMENT`] and
/// [`PROTOCOL_VIOLATION`], what makes the manager stop preparing.
pub const NO_SUCH_STATEMENT: &str = "26000";

/// `duplicate_prepared_statement` (see [`NO_SUCH_STATEMENT`]).
pub const DUPLICATE_STATEMENT: &str = "42P05";

/// `protocol_violation`, as when a statement of another client's with the
/// same name takes other parameters (see [`NO_SUCH_STATEMENT`]).
pub const PROTOCOL_VIOLATION: &str = "08P01";

/// `invalid_authorization_specification`: the server refused the login
/// itself (no `pg_hba.conf` entry allows it), as a server that requires
/// TLS answers a connection without it.
pub const INVALID_AUTHORIZATION: &str = "28000";

/// Whether retrying cannot mend what `code` reports: the schema is
/// missing or out of date, or the role may not use it (class 42, syntax
/// error or access rule violation, and [`INVALID_SCHEMA_NAME`]).
pub fn is_permanent(code: &str) -> bool {
    code.starts_with("42") || code == INVALID_SCHEMA_NAME
}

/// Whether `code` ends the server session: class `57P` (operator
/// intervention: `57P01` admin shutdown, which `pg_terminate_backend`
/// gives, `57P02` crash shutdown, `57P03` cannot connect now) or class `08`
/// (connection exceptions).
pub(crate) fn ends_session(code: &str) -> bool {
    code.starts_with("57P") || code.starts_with("08")
}

/// The SQLSTATE of a server's answer, if `error` is one.
pub(crate) fn of(error: &sqlx::Error) -> Option<std::borrow::Cow<'_, str>> {
    error.as_database_error().and_then(|db| db.code())
}

/// Whether `error` is a `lock_timeout` running out ([`LOCK_NOT_AVAILABLE`]).
pub(crate) fn lock_timed_out(error: &sqlx::Error) -> bool {
    of(error).as_deref() == Some(LOCK_NOT_AVAILABLE)
}

/// Whether `error` says that a prepared statement was not the
/// connection's own on the server session (a transaction pooler in
/// between): it did not run.
pub(crate) fn not_prepared(error: &sqlx::Error) -> bool {
    matches!(
        of(error).as_deref(),
        Some(NO_SUCH_STATEMENT | DUPLICATE_STATEMENT | PROTOCOL_VIOLATION)
    )
}

/// Whether `error` says the connection or its session is gone: an I/O or
/// protocol error, or the server ending the session ([`ends_session`]).
pub(crate) fn session_gone(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        _ => of(error).is_some_and(|code| ends_session(&code)),
    }
}

/// What a server error means to pglease: the one classification of
/// SQLSTATEs behind [`Error`](crate::Error)'s variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// [`NOT_HELD`].
    NotHeld,
    /// [`NOT_DECLARED`].
    NotDeclared,
    /// [`NOT_PERMITTED`], from a pglease function or from the server (a
    /// role without `EXECUTE` on a function, say).
    NotPermitted,
    /// [`INVALID_INPUT`] raised by a pglease function (its message starts
    /// with `pglease: `); the server's own stays a database error.
    InvalidInput,
    /// [`INVALID_SCHEMA_NAME`] naming the `pglease` schema, or
    /// [`UNDEFINED_FUNCTION`] or [`UNDEFINED_TABLE`] naming an object in
    /// it: the schema is missing or older than this version. The same
    /// codes naming a caller's objects (`protect('no_such_table')`) are
    /// not.
    SchemaMissing,
    /// [`READ_ONLY`].
    ReadOnly,
    /// Anything else: a database error.
    Other,
}

/// Classifies a server error by its SQLSTATE and message.
pub(crate) fn classify(code: &str, message: &str) -> Class {
    match code {
        NOT_HELD => Class::NotHeld,
        NOT_DECLARED => Class::NotDeclared,
        NOT_PERMITTED => Class::NotPermitted,
        INVALID_INPUT if message.starts_with("pglease: ") => Class::InvalidInput,
        READ_ONLY => Class::ReadOnly,
        INVALID_SCHEMA_NAME if names_the_schema(message) => Class::SchemaMissing,
        UNDEFINED_FUNCTION | UNDEFINED_TABLE if names_an_object_in_it(message) => {
            Class::SchemaMissing
        }
        _ => Class::Other,
    }
}

/// Whether a server's message names the `pglease` schema: the word
/// `pglease` on its own, whatever quotes the server's language puts around
/// it (`"pglease"`, `»pglease«`, `« pglease »`), not a name that merely
/// contains it (`pglease2`, `my_pglease`).
fn names_the_schema(message: &str) -> bool {
    message.match_indices("pglease").any(|(at, word)| {
        let before = message[..at].chars().next_back();
        let after = message[at + word.len()..].chars().next();
        !before.is_some_and(is_identifier) && !after.is_some_and(is_identifier)
    })
}

/// Whether a server's message names an object in the `pglease` schema
/// (`function pglease.acquire(...)`, `relation "pglease.leases"`), not a
/// caller's own (`relation "pglease" does not exist` is a table named so).
fn names_an_object_in_it(message: &str) -> bool {
    message
        .match_indices("pglease.")
        .any(|(at, _)| !message[..at].chars().next_back().is_some_and(is_identifier))
}

/// A character that may continue an unquoted SQL identifier.
fn is_identifier(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every SQLSTATE this file names.
    const NAMED: [&str; 13] = [
        INVALID_INPUT,
        NOT_IN_LINE,
        NOT_HELD,
        NOT_DECLARED,
        NOT_PERMITTED,
        NOT_PROTECTED,
        FENCE_EXHAUSTED,
        SET_UNDONE,
        READ_ONLY,
        LOCK_NOT_AVAILABLE,
        UNDEFINED_FUNCTION,
        UNDEFINED_TABLE,
        INVALID_SCHEMA_NAME,
    ];

    #[test]
    fn every_code_the_schema_raises_is_named_here() {
        let schema = crate::schema::SOURCE;
        let marker = "ERRCODE = '";
        let raised: std::collections::BTreeSet<&str> = schema
            .match_indices(marker)
            .map(|(at, _)| {
                let rest = &schema[at + marker.len()..];
                &rest[..rest.find('\'').expect("a closing quote")]
            })
            .collect();
        assert!(raised.len() >= 8, "read {raised:?}");
        let unnamed: Vec<_> = raised.iter().filter(|code| !NAMED.contains(code)).collect();
        assert!(
            unnamed.is_empty(),
            "raised by the schema, not named here: {unnamed:?}"
        );
    }

    #[test]
    fn permanence() {
        for code in [
            UNDEFINED_FUNCTION,
            UNDEFINED_TABLE,
            INVALID_SCHEMA_NAME,
            NOT_PERMITTED,
        ] {
            assert!(is_permanent(code), "{code}");
        }
        for code in [
            READ_ONLY,
            LOCK_NOT_AVAILABLE,
            INVALID_INPUT,
            NOT_HELD,
            "40001",
        ] {
            assert!(!is_permanent(code), "{code}");
        }
    }

    #[test]
    fn session_ends() {
        for code in ["57P01", "57P02", "57P03", "08006", "08003"] {
            assert!(ends_session(code), "{code}");
        }
        for code in ["57014", READ_ONLY, NOT_PERMITTED, "40001"] {
            assert!(!ends_session(code), "{code}");
        }
    }

    #[test]
    fn the_schema_missing_is_told_from_a_callers_missing_table() {
        for (code, message) in [
            (INVALID_SCHEMA_NAME, r#"schema "pglease" does not exist"#),
            (
                UNDEFINED_FUNCTION,
                "function pglease.acquire(text, text, interval) does not exist",
            ),
            (
                UNDEFINED_TABLE,
                r#"relation "pglease.leases" does not exist"#,
            ),
        ] {
            assert_eq!(classify(code, message), Class::SchemaMissing, "{message}");
        }
        for (code, message) in [
            (
                UNDEFINED_TABLE,
                r#"relation "no_such_table" does not exist"#,
            ),
            (
                UNDEFINED_TABLE,
                r#"relation "app.mypglease.x" does not exist"#,
            ),
            (UNDEFINED_FUNCTION, "function my_pglease.f() does not exist"),
            (INVALID_SCHEMA_NAME, r#"schema "pglease2" does not exist"#),
            (INVALID_SCHEMA_NAME, r#"schema "my_pglease" does not exist"#),
            (INVALID_SCHEMA_NAME, r#"schema "app" does not exist"#),
            // A caller's table named pglease.
            (UNDEFINED_TABLE, r#"relation "pglease" does not exist"#),
        ] {
            assert_eq!(classify(code, message), Class::Other, "{message}");
        }
    }

    #[test]
    fn the_functions_codes_and_the_servers() {
        assert_eq!(classify(NOT_HELD, "pglease: x"), Class::NotHeld);
        assert_eq!(classify(NOT_DECLARED, "pglease: x"), Class::NotDeclared);
        assert_eq!(
            classify(NOT_PERMITTED, "pglease: role may not"),
            Class::NotPermitted
        );
        assert_eq!(
            classify(
                NOT_PERMITTED,
                "permission denied for function force_release"
            ),
            Class::NotPermitted
        );
        assert_eq!(
            classify(INVALID_INPUT, "pglease: bad ttl"),
            Class::InvalidInput
        );
        assert_eq!(
            classify(INVALID_INPUT, "invalid value for parameter"),
            Class::Other
        );
        assert_eq!(
            classify(
                READ_ONLY,
                "cannot execute UPDATE in a read-only transaction"
            ),
            Class::ReadOnly
        );
        assert_eq!(
            classify(LOCK_NOT_AVAILABLE, "canceling statement"),
            Class::Other
        );
    }
}
