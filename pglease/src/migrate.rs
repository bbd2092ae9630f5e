//! Applies the `pglease` schema from `migrations/`, beside (never inside)
//! the host application's own migrations.

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::PgPoolOptions;

use crate::error::{Error, Result};
use crate::manager::LeaseManager;

/// Where `pglease` records which of its migrations are applied: its own
/// table in its own schema, so it never clashes with the host
/// application's `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "pglease._pglease_migrations";

fn migrator() -> Migrator {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator.create_schema("pglease");
    migrator
}

/// The latest migration this version has.
pub(crate) fn latest_version() -> i64 {
    migrator().iter().map(|m| m.version).max().unwrap_or(0)
}

/// A recorded migration that this version lacks or has with other contents.
fn incompatible(error: MigrateError) -> Error {
    let latest = latest_version();
    match error {
        MigrateError::VersionMissing(version) => Error::IncompatibleSchema {
            version,
            newer: version > latest,
        },
        MigrateError::VersionMismatch(version) => Error::IncompatibleSchema {
            version,
            newer: false,
        },
        error => Error::from(error),
    }
}

impl LeaseManager {
    /// Creates or upgrades the `pglease` schema. Idempotent, and safe when
    /// many processes start at once: `sqlx` serialises migrators with an
    /// advisory lock, so do not call this from inside another migration run
    /// on the same database.
    ///
    /// Runs on a connection of its own that is closed afterwards, so that a
    /// failed migration cannot leave that lock held on a pooled connection.
    ///
    /// # Errors
    ///
    /// [`Error::Database`](crate::Error::Database) if the server cannot be
    /// reached or a migration fails (nothing of a failed migration stays
    /// applied: each runs in a transaction);
    /// [`Error::IncompatibleSchema`](crate::Error::IncompatibleSchema) if
    /// the database holds a `pglease` schema this version does not know
    /// (applied by a newer version, or by a development version before the
    /// first release), with what to do; [`Error::Migrate`](crate::Error::Migrate)
    /// for other failures of the migrator (such as a migration left dirty).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes its connection; the server then rolls
    /// back the migration in progress, if any.
    pub async fn migrate(&self) -> Result<()> {
        let one = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .connect_lazy_with(self.pool().connect_options().as_ref().clone());
        let outcome = migrator().run(&one).await;
        if outcome.is_err() {
            // A failure can leave the migrator's advisory lock held. Free it
            // before returning, not when the server gets round to ending the
            // session after the close below (that happens asynchronously).
            let _ = sqlx::query("SELECT pg_advisory_unlock_all()")
                .execute(&one)
                .await;
        }
        one.close().await;
        outcome.map_err(incompatible)?;
        Ok(())
    }
}
