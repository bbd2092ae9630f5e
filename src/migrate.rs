//! Applies the `pglease` schema from `migrations/`, beside (never inside)
//! the host application's own migrations.
//!
//! The migrations are embedded (with the checksums sqlx's migrator
//! computes) and recorded in a table of sqlx's shape, but applied
//! here, all in one transaction that first takes a transaction-level
//! advisory lock: a session-level lock (sqlx's migrator) is not kept by a
//! transaction pooler, which lets concurrent migrators collide, and a lock
//! that ends with the transaction cannot be left behind by a failure.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Instant;

use sqlx::SqlStr;
use sqlx::migrate::{MigrateError, Migration, MigrationType};
use sqlx::{Connection, PgConnection, Row};

use crate::error::{Error, Result};
use crate::manager::LeaseManager;
use crate::schema::Migrated;
use crate::sql;

/// The transaction-level advisory lock that serialises migrators of one
/// database (the bytes of "pglease").
const MIGRATION_LOCK: i64 = 0x0070_676c_6561_7365;

/// Every file of `migrations/`, as sqlx's `migrate!` would embed it:
/// version and description from the file's name, the checksum (SHA-384
/// of the text) computed by sqlx. Written out rather than by that macro,
/// which builds its own copy of sqlx and tokio for the compiler, on the
/// critical path of every build; a unit test checks that the list and the
/// directory agree.
static MIGRATIONS: LazyLock<[Migration; 1]> = LazyLock::new(|| {
    [Migration::new(
        1,
        Cow::Borrowed("schema"),
        MigrationType::Simple,
        SqlStr::from_static(include_str!("../migrations/0001_schema.sql")),
        false,
    )]
});

/// The latest migration this version has.
pub(crate) fn latest_version() -> i64 {
    MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(0)
}

/// What to apply, given the recorded migrations (version, hex checksum,
/// success): the versions this build has and the record lacks, or why
/// nothing may be applied.
fn to_apply(recorded: &[(i64, String, bool)]) -> Result<Vec<i64>> {
    let known: HashMap<i64, String> = MIGRATIONS
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| (m.version, hex(&m.checksum)))
        .collect();
    let latest = latest_version();
    // A migration this version has, recorded with other contents, is a
    // development history (before 0.1 the schema came in seven files,
    // edited in place): said first, since such a record also holds
    // versions this one lacks, which would otherwise read as "newer".
    for (version, checksum, success) in recorded {
        if let Some(ours) = known.get(version) {
            if !success {
                return Err(Error::Migrate(MigrateError::Dirty(*version)));
            }
            if ours != checksum {
                return Err(Error::IncompatibleSchema {
                    version: *version,
                    newer: false,
                });
            }
        }
    }
    if let Some((version, _, _)) = recorded.iter().find(|(v, _, _)| !known.contains_key(v)) {
        return Err(Error::IncompatibleSchema {
            version: *version,
            newer: *version > latest,
        });
    }
    let mut missing: Vec<i64> = known
        .keys()
        .filter(|v| !recorded.iter().any(|(r, _, _)| r == *v))
        .copied()
        .collect();
    missing.sort_unstable();
    Ok(missing)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Applies the missing migrations inside the transaction `prepare` opened.
async fn apply(conn: &mut PgConnection, missing: &[i64]) -> Result<()> {
    for migration in MIGRATIONS.iter().filter(|m| missing.contains(&m.version)) {
        let started = Instant::now();
        sqlx::raw_sql(migration.sql.clone())
            .execute(&mut *conn)
            .await
            .map_err(|e| Error::Migrate(MigrateError::ExecuteMigration(e, migration.version)))?;
        let nanos = i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
        sql::query(sql::record_migration(
            migration.version,
            &migration.description,
            &hex(&migration.checksum),
            nanos,
        ))
        .execute(&mut *conn)
        .await?;
        tracing::info!(version = migration.version, description = %migration.description, "pglease migration applied");
    }
    Ok(())
}

impl LeaseManager {
    /// Creates or upgrades the `pglease` schema. Idempotent, and safe when
    /// many processes start at once, also through a transaction pooler
    /// (PgBouncer in transaction mode): everything happens in one
    /// transaction that first takes a transaction-level advisory lock, so
    /// migrators of one database run one after the other, and a failure
    /// leaves nothing applied and no lock held.
    ///
    /// Runs on a connection of its own that is closed afterwards. Returns
    /// the migrations it applied ([`Migrated`]).
    ///
    /// # Errors
    ///
    /// [`Error::Database`](crate::Error::Database) if the server cannot be
    /// reached; [`Error::Migrate`](crate::Error::Migrate) if a migration
    /// fails (nothing of this run stays applied) or one applied outside
    /// a transaction by another tool failed half-way;
    /// [`Error::IncompatibleSchema`](crate::Error::IncompatibleSchema) if
    /// the database holds a `pglease` schema this version does not know
    /// (applied by a newer version, or by a development version before the
    /// first release), with what to do.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes its connection; the server then rolls
    /// back the migration in progress, if any.
    pub async fn migrate(&self) -> Result<Migrated> {
        let mut conn = PgConnection::connect_with(self.pool().connect_options().as_ref()).await?;
        let outcome = migrate_on(&mut conn).await;
        if outcome.is_err() {
            // Roll back now rather than when the server notices the close.
            let _ = sql::query(sql::ROLLBACK).execute(&mut conn).await;
        }
        let _ = conn.close().await;
        outcome
    }
}

async fn migrate_on(conn: &mut PgConnection) -> Result<Migrated> {
    let rows = sql::query(sql::migration_prepare(MIGRATION_LOCK))
        .fetch_all(&mut *conn)
        .await?;
    // The lock's statement answers one row of one column; the record's
    // rows have three.
    let recorded = rows
        .iter()
        .filter(|row| row.len() == 3)
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect::<std::result::Result<Vec<(i64, String, bool)>, sqlx::Error>>()?;
    let missing = to_apply(&recorded)?;
    if !missing.is_empty() {
        apply(conn, &missing).await?;
    }
    sql::query(sql::COMMIT).execute(&mut *conn).await?;
    Ok(Migrated {
        applied: missing,
        latest: latest_version(),
    })
}

#[cfg(test)]
mod tests {
    use super::MIGRATIONS;

    /// Each file of `migrations/` is embedded, under the version and
    /// description its name gives, and nothing else is.
    #[test]
    fn every_migration_file_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .expect("read migrations/")
            .map(|entry| {
                entry
                    .expect("a directory entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        files.sort();
        let embedded: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{:04}_{}.sql", m.version, m.description.replace(' ', "_")))
            .collect();
        assert_eq!(files, embedded);
        for (m, file) in MIGRATIONS.iter().zip(&embedded) {
            let text = std::fs::read_to_string(dir.join(file)).expect("read the migration");
            assert_eq!(m.sql.as_str(), text);
            assert!(!m.no_tx && !text.starts_with("-- no-transaction"));
        }
    }
}
