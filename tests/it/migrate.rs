//! Migrations: idempotent, safe when many processes start at once, and
//! recorded in pglease's own table beside the host application's.

use std::time::Duration;

use crate::common::TestDb;
use pglease::schema::MIGRATIONS_TABLE;
use pglease::{AcquireOptions, Error, LeaseManager};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, Row};

async fn migrate_is_idempotent() {
    let db = TestDb::new().await;
    db.manager().migrate().await.expect("second migrate");
    db.manager().migrate().await.expect("third migrate");
    let applied: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {MIGRATIONS_TABLE}"
    )))
    .fetch_one(db.pool())
    .await
    .expect("count applied migrations");
    let files = std::fs::read_dir("migrations")
        .expect("migrations dir")
        .count() as i64;
    assert_eq!(applied, files);
}

async fn concurrent_migrations_from_many_processes_all_succeed() {
    let db = TestDb::empty().await;
    // Separate pools stand for separate processes starting at once.
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let options = db.options();
        tasks.push(tokio::spawn(async move {
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await
                .expect("connect");
            LeaseManager::new(pool).migrate().await
        }));
    }
    for task in tasks {
        task.await
            .expect("migrate task")
            .expect("concurrent migrate");
    }
    let lease = db
        .manager()
        .acquire(
            "after",
            AcquireOptions::ttl(Duration::from_secs(5)).holder("A"),
        )
        .await
        .expect("schema usable");
    assert!(lease.token() > 0);
}

async fn host_application_migrations_do_not_clash() {
    let db = TestDb::empty().await;
    // The host application has its own migration with the same version
    // number as pglease's first one, in sqlx's default table.
    let dir = std::env::temp_dir().join(format!("pglease-host-migrations-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("0001_app.sql"), "CREATE TABLE app_data (id int);").expect("write");
    let host = sqlx::migrate::Migrator::new(dir.clone())
        .await
        .expect("host migrator");
    host.run(db.pool()).await.expect("host migrations");
    db.manager().migrate().await.expect("pglease migrations");
    host.run(db.pool()).await.expect("host migrations again");
    let _ = std::fs::remove_dir_all(&dir);

    let tables: Vec<String> = sqlx::query(
        "SELECT schemaname || '.' || tablename FROM pg_tables \
          WHERE tablename LIKE '%migrations' ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await
    .expect("list migration tables")
    .iter()
    .map(|r| r.get(0))
    .collect();
    assert_eq!(
        tables,
        vec![
            MIGRATIONS_TABLE.to_owned(),
            "public._sqlx_migrations".to_owned()
        ]
    );
}

async fn failed_migration_leaves_no_lock_on_the_pool() {
    let db = TestDb::empty().await;
    // A conflicting object makes pglease's migration fail.
    sqlx::raw_sql("CREATE SCHEMA pglease; CREATE TABLE pglease.leases (x int)")
        .execute(db.pool())
        .await
        .expect("create a conflicting table");
    assert!(db.manager().migrate().await.is_err());
    // No advisory lock is left behind in this database (other tests run
    // their migrations at the same time in theirs), so the next migrator
    // does not hang.
    let locks: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(db.pool())
    .await
    .expect("count advisory locks");
    assert_eq!(locks, 0);
    sqlx::query("DROP TABLE pglease.leases")
        .execute(db.pool())
        .await
        .expect("drop");
    tokio::time::timeout(Duration::from_secs(30), db.manager().migrate())
        .await
        .expect("migrate does not hang")
        .expect("migrate succeeds once the conflict is gone");
}

/// A schema this version cannot use is refused, with what to do, and
/// nothing is changed: one migrated by a newer version, and one made by a
/// development version's seven files (before 0.1), whose one-time fix the
/// message names and which then works.
async fn a_schema_from_another_history_or_a_newer_version_is_refused_with_what_to_do() {
    let db = TestDb::new().await;
    let table = MIGRATIONS_TABLE;
    let before = db.state().await;
    // A newer version applied a migration this one does not have.
    db.execute(&[format!(
        "INSERT INTO {table} (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', true, '\\x00'::bytea, 0)"
    )])
    .await;
    match db.manager().migrate().await {
        Err(
            e @ Error::IncompatibleSchema {
                version: 9999,
                newer: true,
            },
        ) => {
            assert!(e.to_string().contains("newer pglease"), "{e}");
        }
        other => panic!("expected a newer schema, got {other:?}"),
    }
    assert_eq!(db.state().await, before);

    // The record a development version's seven migration files left:
    // versions 1 to 7, the first with other contents.
    let mut development = vec![
        format!("DELETE FROM {table}"),
        format!(
            "INSERT INTO {table} (version, description, success, checksum, execution_time) \
             VALUES (1, 'schema', true, '\\x01'::bytea, 0)"
        ),
    ];
    for (version, description) in [
        (2, "leases"),
        (3, "fencing"),
        (4, "values"),
        (5, "changes"),
        (6, "history"),
        (7, "counted"),
    ] {
        development.push(format!(
            "INSERT INTO {table} (version, description, success, checksum, execution_time) \
             VALUES ({version}, '{description}', true, '\\x01'::bytea, 0)"
        ));
    }
    db.execute(&development).await;
    let fix = "DROP SCHEMA pglease CASCADE";
    match db.manager().migrate().await {
        Err(
            e @ Error::IncompatibleSchema {
                version: 1,
                newer: false,
            },
        ) => {
            let said = e.to_string();
            assert!(said.contains("development version"), "{said}");
            assert!(said.contains(fix), "{said}");
            assert!(said.contains("nothing was changed"), "{said}");
        }
        other => panic!("expected a development schema, got {other:?}"),
    }
    // Nothing else changed: the leases and functions are as they were.
    assert_eq!(db.state().await, before);
    // The one-time fix the message names works.
    db.execute(&[fix]).await;
    let migrated = db.manager().migrate().await.expect("migrate after the fix");
    assert_eq!(migrated.applied, vec![1]);
    db.manager()
        .acquire("job", pglease::AcquireOptions::ttl(Duration::from_secs(5)))
        .await
        .expect("acquire on the new schema");
}

/// An acquisition and a renewal commit durably even when the session
/// asked for asynchronous commit (a crash must never let a token be issued
/// twice, or end a lease before the expiry its holder was told); a failed
/// attempt keeps the session's setting.
async fn acquisition_and_renewal_force_synchronous_commit() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    sqlx::query("SET synchronous_commit = off")
        .execute(&mut conn)
        .await
        .expect("set");
    let mut tx = conn.begin().await.expect("begin");
    let token: Option<i64> =
        sqlx::query_scalar("SELECT token FROM pglease.acquire('d', 'A', '1 min')")
            .fetch_one(&mut *tx)
            .await
            .expect("acquire");
    assert!(token.is_some());
    assert_eq!(synchronous_commit(&mut tx).await, "on");
    tx.commit().await.expect("commit");

    // A failed attempt (read-only) keeps the session's setting; a renewal
    // raises it.
    let mut tx = conn.begin().await.expect("begin");
    let failed: Option<i64> =
        sqlx::query_scalar("SELECT token FROM pglease.acquire('d', 'B', '1 min')")
            .fetch_one(&mut *tx)
            .await
            .expect("failed acquire");
    assert_eq!(failed, None);
    assert_eq!(synchronous_commit(&mut tx).await, "off");
    let renewed: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT pglease.renew('d', $1, '1 min')")
            .bind(token)
            .fetch_one(&mut *tx)
            .await
            .expect("renew");
    assert!(renewed.is_some());
    assert_eq!(synchronous_commit(&mut tx).await, "on");
    tx.commit().await.expect("commit");

    // So does a batch renewal that renews something, and only then.
    let mut tx = conn.begin().await.expect("begin");
    let none: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pglease.renew_many('{d}', ARRAY[$1 + 1000], '{1 min}') WHERE renewed",
    )
    .bind(token)
    .fetch_one(&mut *tx)
    .await
    .expect("renew_many of a token never issued");
    assert_eq!(none, 0);
    assert_eq!(synchronous_commit(&mut tx).await, "off");
    let one: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pglease.renew_many('{d}', ARRAY[$1], '{1 min}') WHERE renewed",
    )
    .bind(token)
    .fetch_one(&mut *tx)
    .await
    .expect("renew_many");
    assert_eq!(one, 1);
    assert_eq!(synchronous_commit(&mut tx).await, "on");
    tx.commit().await.expect("commit");
}

/// Without the schema, or with the schema but not its functions, an
/// operation fails as `SchemaMissing` (3F000, then 42883), saying the
/// schema is missing; a caller's own missing table stays a database error
/// (see `protect`'s test).
async fn an_unmigrated_database_is_told_as_the_schema_missing() {
    let db = TestDb::empty().await;
    let m = db.manager();
    let options = AcquireOptions::ttl(Duration::from_secs(5));
    let no_schema = m
        .acquire("job", options.clone())
        .await
        .expect_err("no schema");
    assert!(
        matches!(no_schema, Error::SchemaMissing(_)),
        "{no_schema:?}"
    );
    assert_eq!(no_schema.sqlstate(), Some("3F000"));
    let said = no_schema.to_string();
    assert!(said.contains("schema is missing or out of date"), "{said}");
    db.execute(&["CREATE SCHEMA pglease".to_owned()]).await;
    let no_function = m.acquire("job", options).await.expect_err("no function");
    assert!(
        matches!(no_function, Error::SchemaMissing(_)),
        "{no_function:?}"
    );
    assert_eq!(no_function.sqlstate(), Some("42883"));
    assert!(
        no_function
            .to_string()
            .contains("schema is missing or out of date"),
        "{no_function}"
    );
}

async fn synchronous_commit(conn: &mut sqlx::PgConnection) -> String {
    sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
        .fetch_one(conn)
        .await
        .expect("read synchronous_commit")
}

pglease_formations::tests![
    migrate_is_idempotent,
    concurrent_migrations_from_many_processes_all_succeed(4),
    host_application_migrations_do_not_clash,
    failed_migration_leaves_no_lock_on_the_pool,
    a_schema_from_another_history_or_a_newer_version_is_refused_with_what_to_do,
    acquisition_and_renewal_force_synchronous_commit,
    an_unmigrated_database_is_told_as_the_schema_missing,
];
