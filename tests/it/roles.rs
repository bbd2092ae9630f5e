//! An application role can use leases through the functions but cannot
//! write the leases table directly (docs/design.md's grants, "Roles and grants").

use crate::common::TestDb;
use sqlx::{AssertSqlSafe, Connection};

async fn application_role_calls_functions_but_cannot_update_leases() {
    let role = format!("pglease_app_{}", std::process::id());
    let db = &TestDb::new().await;
    db.scratch_roles(&[&role]).await;
    db.execute(&[
        format!("CREATE ROLE {role} NOLOGIN"),
        format!("GRANT USAGE ON SCHEMA pglease TO {role}"),
        format!("GRANT SELECT ON pglease.status TO {role}"),
    ])
    .await;
    let mut conn = db.connect().await;
    let mut tx = conn.begin().await.expect("begin");
    sqlx::query(AssertSqlSafe(format!("SET LOCAL ROLE {role}")))
        .execute(&mut *tx)
        .await
        .expect("become the application role");
    let token: Option<i64> =
        sqlx::query_scalar("SELECT token FROM pglease.acquire('job', 'app', '1 min')")
            .fetch_one(&mut *tx)
            .await
            .expect("the application role acquires");
    let token = token.expect("acquired");
    sqlx::query("SELECT pglease.assert_held('job', $1)")
        .bind(token)
        .execute(&mut *tx)
        .await
        .expect("the application role checks its token");
    let watched: (bool, bool) =
        sqlx::query_as("SELECT pglease.watch('job'), pglease.unwatch('job')")
            .fetch_one(&mut *tx)
            .await
            .expect("the application role watches and unwatches");
    assert_eq!(watched, (true, true));
    let held: bool = sqlx::query_scalar("SELECT held FROM pglease.status WHERE name = 'job'")
        .fetch_one(&mut *tx)
        .await
        .expect("the application role reads the status view");
    assert!(held);
    let err = sqlx::query("UPDATE pglease.leases SET expires_at = 'infinity'")
        .execute(&mut *tx)
        .await
        .expect_err("direct update must be refused");
    let code = err
        .as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned());
    assert_eq!(
        code.as_deref(),
        Some("42501"),
        "insufficient_privilege: {err}"
    );
    drop(tx);
    sqlx::query(AssertSqlSafe(format!("DROP OWNED BY {role}")))
        .execute(db.pool())
        .await
        .expect("drop grants");
    sqlx::query(AssertSqlSafe(format!("DROP ROLE {role}")))
        .execute(db.pool())
        .await
        .expect("drop role");
}

pglease_formations::tests![application_role_calls_functions_but_cannot_update_leases,];
