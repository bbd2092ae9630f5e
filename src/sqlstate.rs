//! The SQLSTATEs the `pglease` functions raise, for clients that match on
//! them ([`Error::sqlstate`](crate::Error::sqlstate) gives an error's).

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
