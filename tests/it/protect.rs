//! Protected tables reject writers that ignore the lease (LE002) and
//! writers whose declared token is stale or expired at the write (LE001).

use std::time::Duration;

use crate::common::{TestDb, create_data_table, data_value};
use pglease::sqlstate::{NOT_DECLARED, NOT_HELD};
use pglease::{AcquireOptions, Error};
use sqlx::Connection;

const LONG: Duration = Duration::from_secs(600);

/// The SQLSTATE `sql` fails with, run in its own transaction after
/// `declare` (which may be empty).
async fn rejection(db: &TestDb, declare: &str, sql: &str) -> Option<String> {
    let mut conn = db.connect().await;
    let mut tx = conn.begin().await.expect("begin");
    if !declare.is_empty() {
        sqlx::raw_sql(sqlx::AssertSqlSafe(declare.to_owned()))
            .execute(&mut *tx)
            .await
            .expect("declare");
    }
    let outcome = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut *tx)
        .await;
    match outcome {
        Ok(_) => {
            tx.commit().await.expect("commit");
            None
        }
        Err(e) => Some(
            e.as_database_error()
                .and_then(|d| d.code())
                .map(|c| c.into_owned())
                .unwrap_or_else(|| panic!("{sql}: not a database error: {e}")),
        ),
    }
}

const WRITES: [&str; 8] = [
    "INSERT INTO data VALUES (2, 'inserted', NULL)",
    "UPDATE data SET value = 'updated' WHERE id = 1",
    "DELETE FROM data WHERE id = 1",
    "TRUNCATE data",
    "COPY data FROM PROGRAM 'echo 3,copied,' WITH (FORMAT csv)",
    "INSERT INTO data VALUES (1, 'x', NULL) ON CONFLICT (id) DO UPDATE SET value = 'upserted'",
    "MERGE INTO data AS d USING (SELECT 1 AS id) AS s ON d.id = s.id \
       WHEN MATCHED THEN UPDATE SET value = 'merged'",
    "WITH w AS (UPDATE data SET value = 'cte' WHERE id = 1 RETURNING 1) SELECT count(*) FROM w",
];

async fn writers_that_ignore_the_lease_are_rejected() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    m.admin()
        .protect("data", "data-lease")
        .await
        .expect("protect");
    let lease = m
        .acquire("data-lease", AcquireOptions::ttl(LONG).holder("A"))
        .await
        .expect("acquire");
    let other = m
        .acquire("other", AcquireOptions::ttl(LONG).holder("A"))
        .await
        .expect("other");

    for sql in WRITES {
        assert_eq!(
            rejection(&db, "", sql).await.as_deref(),
            Some(NOT_DECLARED),
            "{sql} without a declaration"
        );
        // A declaration for another lease does not count.
        let declare = format!("SELECT pglease.assert_held('other', {})", other.token());
        assert_eq!(
            rejection(&db, &declare, sql).await.as_deref(),
            Some(NOT_DECLARED),
            "{sql} under another lease"
        );
    }
    assert_eq!(data_value(&db).await, "initial");

    // The holder's fenced transaction writes.
    let mut tx = m
        .begin_fenced(&crate::common::fence("data-lease", lease.token()))
        .await
        .expect("fenced");
    sqlx::query("UPDATE data SET value = 'by the holder' WHERE id = 1")
        .execute(&mut *tx)
        .await
        .expect("declared write");
    tx.commit().await.expect("commit");
    assert_eq!(data_value(&db).await, "by the holder");
}

async fn each_write_rechecks_the_declared_token() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    m.admin()
        .protect("data", "data-lease")
        .await
        .expect("protect");
    let lease = m
        .acquire(
            "data-lease",
            AcquireOptions::ttl(Duration::from_millis(300)).holder("A"),
        )
        .await
        .expect("acquire");

    // Declared while valid; the lease expires before the write.
    let mut tx = m
        .begin_fenced(&crate::common::fence("data-lease", lease.token()))
        .await
        .expect("fenced");
    db.wait_until(lease.expires_at()).await;
    match sqlx::query("UPDATE data SET value = 'late' WHERE id = 1")
        .execute(&mut *tx)
        .await
        .map_err(Error::from)
    {
        Err(Error::NotHeld { reason, .. }) => assert!(
            matches!(reason, pglease::NotHeldReason::Expired { .. }),
            "{reason:?}"
        ),
        other => panic!("a write after expiry must fail with LE001, got {other:?}"),
    }
    drop(tx);

    // A forged declaration of a stale token is checked like a real one ...
    let newer = m
        .acquire("data-lease", AcquireOptions::ttl(LONG).holder("B"))
        .await
        .expect("B acquires");
    let forged_stale = format!(
        "SET LOCAL pglease.declared = '{{\"data-lease\": {}}}'",
        lease.token()
    );
    for sql in WRITES {
        assert_eq!(
            rejection(&db, &forged_stale, sql).await.as_deref(),
            Some(NOT_HELD),
            "{sql} with a forged stale token"
        );
    }
    assert_eq!(data_value(&db).await, "initial");

    // ... and a forged current token is as good as a declaration: the
    // token is a fence, not a secret (keeping code out is for grants).
    let forged_current = format!(
        "SET LOCAL pglease.declared = '{{\"data-lease\": {}}}'",
        newer.token()
    );
    assert_eq!(
        rejection(
            &db,
            &forged_current,
            "UPDATE data SET value = 'B' WHERE id = 1"
        )
        .await,
        None
    );
    assert_eq!(data_value(&db).await, "B");
}

async fn unprotect_lifts_the_protection_and_bad_input_is_rejected() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    sqlx::query("CREATE VIEW data_view AS SELECT * FROM data")
        .execute(db.pool())
        .await
        .expect("view");
    assert!(matches!(
        m.admin().protect("data", "").await,
        Err(Error::InvalidInput {
            argument: "name",
            ..
        })
    ));
    sqlx::raw_sql(
        "CREATE TABLE parted (id int) PARTITION BY RANGE (id); \
         CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (10); \
         CREATE TABLE base (id int); CREATE TABLE child () INHERITS (base);",
    )
    .execute(db.pool())
    .await
    .expect("partition and inheritance trees");
    let before = db.state().await;
    for bad in [
        "SELECT pglease.protect(NULL, 'x')",
        "SELECT pglease.protect('data', NULL)",
        "SELECT pglease.protect('data_view', 'x')",
        // Statement triggers are not inherited: half a tree would be open.
        "SELECT pglease.protect('parted', 'x')",
        "SELECT pglease.protect('parted_1', 'x')",
        "SELECT pglease.protect('base', 'x')",
        "SELECT pglease.protect('child', 'x')",
        "SELECT pglease.unprotect(NULL)",
    ] {
        let e = sqlx::query(bad)
            .execute(db.pool())
            .await
            .expect_err("rejected");
        assert_eq!(
            e.as_database_error().and_then(|d| d.code()).as_deref(),
            Some("22023"),
            "{bad}"
        );
    }
    assert!(matches!(
        m.admin().protect("no_such_table", "x").await,
        Err(Error::Database(_))
    ));
    assert_eq!(db.state().await, before);

    m.admin()
        .protect("data", "data-lease")
        .await
        .expect("protect");
    let listed: Vec<(String, String)> =
        sqlx::query_as("SELECT tbl::text, name FROM pglease.protected")
            .fetch_all(db.pool())
            .await
            .expect("list");
    assert_eq!(listed, vec![("data".to_owned(), "data-lease".to_owned())]);
    assert_eq!(
        rejection(&db, "", WRITES[1]).await.as_deref(),
        Some(NOT_DECLARED)
    );
    assert!(m.admin().unprotect("data").await.expect("unprotect"));
    assert!(!m.admin().unprotect("data").await.expect("unprotect twice"));
    assert_eq!(rejection(&db, "", WRITES[1]).await, None);
    assert_eq!(data_value(&db).await, "updated");
}

/// A role granted every privilege on a table (TRIGGER included) may not
/// point its protection at a lease it controls, nor lift it; a member of
/// the owning role may.
async fn only_the_table_owner_may_protect_or_unprotect_it() {
    let db = TestDb::new().await;
    let suffix = std::process::id();
    let (app, owners) = (
        format!("pglease_granted_{suffix}"),
        format!("pglease_owners_{suffix}"),
    );
    let setup = [
        format!("DROP ROLE IF EXISTS {app}"),
        format!("DROP ROLE IF EXISTS {owners}"),
        format!("CREATE ROLE {app} NOLOGIN"),
        format!("CREATE ROLE {owners} NOLOGIN"),
        "CREATE TABLE ledger (id int PRIMARY KEY)".to_owned(),
        format!("GRANT ALL ON ledger TO {app}"),
        format!("GRANT USAGE ON SCHEMA pglease TO {app}"),
    ];
    for sql in setup {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(db.pool())
            .await
            .expect("set up");
    }
    db.manager()
        .admin()
        .protect("ledger", "ledger-lease")
        .await
        .expect("the owner protects");
    let set_role = format!("SET LOCAL ROLE {app}");
    assert_eq!(
        rejection(&db, &set_role, "SELECT pglease.protect('ledger', 'other')")
            .await
            .as_deref(),
        Some("42501")
    );
    assert_eq!(
        rejection(&db, &set_role, "SELECT pglease.unprotect('ledger')")
            .await
            .as_deref(),
        Some("42501")
    );
    let name: String =
        sqlx::query_scalar("SELECT name FROM pglease.protected WHERE tbl = 'ledger'::regclass")
            .fetch_one(db.pool())
            .await
            .expect("still protected");
    assert_eq!(name, "ledger-lease", "the fence was re-pointed");

    // Ownership through a role the caller belongs to is enough.
    for sql in [
        format!("ALTER TABLE ledger OWNER TO {owners}"),
        format!("GRANT {owners} TO {app}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(db.pool())
            .await
            .expect("owning role");
    }
    assert_eq!(
        rejection(&db, &set_role, "SELECT pglease.unprotect('ledger')").await,
        None
    );

    for sql in [
        "DROP TABLE ledger".to_owned(),
        format!("DROP OWNED BY {app}"),
        format!("DROP ROLE {app}"),
        format!("DROP ROLE {owners}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(db.pool())
            .await
            .expect("clean up");
    }
}

pglease_formations::tests![
    writers_that_ignore_the_lease_are_rejected,
    each_write_rechecks_the_declared_token,
    unprotect_lifts_the_protection_and_bad_input_is_rejected,
    only_the_table_owner_may_protect_or_unprotect_it,
];
