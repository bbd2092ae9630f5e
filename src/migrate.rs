//! Applies the `pglease` schema from `migrations/`, beside (never inside)
//! the host application's own migrations.

use sqlx::migrate::Migrator;
use sqlx::{Connection, PgConnection};

use crate::error::Result;
use crate::lease::LeaseManager;

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

impl LeaseManager {
    /// Creates or upgrades the `pglease` schema. Idempotent, and safe when
    /// many processes start at once: `sqlx` serialises migrators with an
    /// advisory lock, so do not call this from inside another migration run
    /// on the same database.
    ///
    /// Runs on a dedicated connection that is closed afterwards, so that a
    /// failed migration cannot leave that lock held on a pooled connection.
    pub async fn migrate(&self) -> Result<()> {
        let options = self.pool().connect_options();
        let mut conn = PgConnection::connect_with(&options).await?;
        // `run_direct` on a plain connection keeps this future `Send`
        // (`Migrator::run` over `Acquire` is not, for a borrowed connection).
        let outcome = migrator().run_direct(None, &mut conn, false).await;
        if outcome.is_err() {
            // A failure can leave the migrator's advisory lock held. Free it
            // before returning, not when the server gets round to ending the
            // session after the close below (that happens asynchronously).
            let _ = sqlx::query("SELECT pg_advisory_unlock_all()")
                .execute(&mut conn)
                .await;
        }
        let _ = conn.close().await;
        outcome?;
        Ok(())
    }
}
