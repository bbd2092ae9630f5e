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

// The server's own SQLSTATEs that pglease reacts to.

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

/// Whether `code` says the `pglease` schema is missing or out of date in
/// the database (run the migration).
pub fn is_schema_missing(code: &str) -> bool {
    [UNDEFINED_FUNCTION, UNDEFINED_TABLE, INVALID_SCHEMA_NAME].contains(&code)
}

/// Whether retrying cannot mend what `code` reports: the schema is
/// missing or out of date, or the role may not use it (class 42, syntax
/// error or access rule violation, and [`INVALID_SCHEMA_NAME`]).
pub fn is_permanent(code: &str) -> bool {
    code.starts_with("42") || code == INVALID_SCHEMA_NAME
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        for code in [UNDEFINED_FUNCTION, UNDEFINED_TABLE, INVALID_SCHEMA_NAME] {
            assert!(is_schema_missing(code) && is_permanent(code), "{code}");
        }
        assert!(is_permanent(NOT_PERMITTED) && !is_schema_missing(NOT_PERMITTED));
        for code in [
            READ_ONLY,
            LOCK_NOT_AVAILABLE,
            INVALID_INPUT,
            NOT_HELD,
            "40001",
        ] {
            assert!(!is_permanent(code) && !is_schema_missing(code), "{code}");
        }
    }
}
