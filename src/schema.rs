//! What clients see of the `pglease` schema besides its functions and
//! views: where [`LeaseManager::migrate`](crate::LeaseManager::migrate)
//! records its migrations and what it did, and the channels the functions
//! notify. A notification on either channel is a wake-up hint, not a fact:
//! anyone who can connect can send one, so pglease reads the lease before
//! it believes anything.

/// The schema's one migration, for the unit tests that check the facts
/// both sides state (limits, argument names) against it.
#[cfg(test)]
pub(crate) const SOURCE: &str = include_str!("../migrations/0001_schema.sql");

/// Where `pglease` records which of its migrations are applied: its own
/// table in its own schema, so it never clashes with the host
/// application's `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "pglease._pglease_migrations";

/// The channel `pglease.release` notifies when a session watches the name
/// (`pglease.watch`). The payload is only the name's key,
/// `hashtext(name)` in decimal: a hint, which anyone who can connect may
/// also send, and which names no lease.
pub const RELEASE_CHANNEL: &str = "pglease_release";

/// The channel the functions notify (`pglease._changed`) of every change of a
/// lease that a session observes (`pglease.observe`). The payload is only
/// the name's key, `hashtext(name)` in decimal: a hint to read the lease,
/// never believed (anyone who can connect may NOTIFY).
pub const CHANGE_CHANNEL: &str = "pglease_change";

/// What [`LeaseManager::migrate`](crate::LeaseManager::migrate) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Migrated {
    /// The migrations applied by this call, in order (empty: the schema
    /// was up to date; starting with 1: it was created).
    pub applied: Vec<i64>,
    /// The latest migration the schema has now.
    pub latest: i64,
}
