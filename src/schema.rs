//! What clients see of the `pglease` schema besides its functions and
//! views: where [`LeaseManager::migrate`](crate::LeaseManager::migrate)
//! records its migrations and what it did, and the channels the functions
//! notify. A notification on either channel is a wake-up hint, not a fact:
//! anyone who can connect can send one, so pglease reads the lease before
//! it believes anything.

/// The schema's one migration, generated from its parts in `schema/`
/// (`cargo xtask schema`), for the unit tests that check the facts both
/// sides state (limits, argument names) against it.
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

/// The migration tools whose version table pglease knows, as (tool, the
/// table it records applied migrations in, unqualified: the tool creates
/// it in the first schema of its search_path unless configured
/// otherwise). Protected for the deployers' lease
/// ([`Admin::protect`](crate::Admin::protect), `pglease
/// protect --tool`), a tool's table makes a stale deployer's migration
/// transaction fail as it records itself. The schema's
/// `pglease.migration_tools()` says the same, and a test checks it.
pub const MIGRATION_TOOLS: &[(&str, &str)] = &[
    ("sqlx", "_sqlx_migrations"),
    ("refinery", "refinery_schema_history"),
    ("diesel", "__diesel_schema_migrations"),
    ("alembic", "alembic_version"),
    ("flyway", "flyway_schema_history"),
    ("golang-migrate", "schema_migrations"),
    ("liquibase", "databasechangelog"),
];

/// The version table of migration tool `tool` (one of
/// [`MIGRATION_TOOLS`], by its name there), if pglease knows it.
pub fn version_table(tool: &str) -> Option<&'static str> {
    MIGRATION_TOOLS
        .iter()
        .find(|(name, _)| *name == tool)
        .map(|(_, table)| *table)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// `migrations/0001_schema.sql` is what `cargo xtask schema` makes of
    /// `schema/NN_*.sql`, and each part states what it uses from later
    /// parts.
    #[test]
    fn the_migration_is_generated_from_its_parts() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        if let Err(why) = xtask::schema(root, true) {
            panic!("{why}");
        }
    }

    #[test]
    fn the_migration_tools_are_the_schemas() {
        let start = SOURCE
            .find("CREATE FUNCTION pglease.migration_tools()")
            .expect("pglease.migration_tools() is in the schema");
        let body = &SOURCE[start..];
        let values = &body[body.find("VALUES").expect("VALUES")..body.find("$$;").expect("end")];
        let listed: Vec<(String, String)> = values
            .split('(')
            .skip(1)
            .map(|row| {
                let quoted: Vec<&str> = row.split('\'').skip(1).step_by(2).collect();
                (quoted[0].to_owned(), quoted[1].to_owned())
            })
            .collect();
        let ours: Vec<(String, String)> = MIGRATION_TOOLS
            .iter()
            .map(|(t, v)| ((*t).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(listed, ours);
        assert_eq!(version_table("sqlx"), Some("_sqlx_migrations"));
        assert_eq!(version_table("rails"), None);
    }
}
