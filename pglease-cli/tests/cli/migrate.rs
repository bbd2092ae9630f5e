//! `pglease migrate`: the schema made, the URL after the command, and
//! the GRANT an owner without `pg_signal_backend` lacks.

use std::process::Command;

use crate::common::{BIN, code, json, pglease, stderr};

async fn migrate_creates_the_schema_and_the_url_may_follow_the_command() {
    let db = crate::common::empty_db().await;
    // Before the schema exists: a database failure with a hint.
    let missing = pglease(&db, &["status"]);
    assert_eq!(code(&missing), 5);
    assert!(
        stderr(&missing).contains("pglease migrate"),
        "{}",
        stderr(&missing)
    );
    let out = Command::new(BIN)
        .args(["migrate", "--database-url", &db.url()])
        .output()
        .expect("run");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(code(&pglease(&db, &["migrate"])), 0, "idempotent");
    let out = pglease(&db, &["status", "--json"]);
    assert_eq!(code(&out), 0);
    assert_eq!(json(&out), serde_json::json!([]));
}

/// A schema owner that may not end other roles' sessions cannot take over
/// a lease frozen inside a fenced transaction: `migrate` says so, with the
/// exact GRANT, and still succeeds.
async fn migrate_names_the_grant_an_owner_without_pg_signal_backend_lacks() {
    let owner = format!("pglease_cli_owner_{}", std::process::id());
    let db = &crate::common::empty_db().await;
    db.scratch_roles(&[&owner]).await;
    db.execute(&[
        format!("CREATE ROLE {owner} LOGIN PASSWORD 'pw'"),
        format!("GRANT CREATE ON DATABASE {} TO {owner}", db.name()),
    ])
    .await;
    let out = Command::new(BIN)
        .args(["--database-url", &db.url_for(&owner, "pw"), "migrate"])
        .output()
        .expect("run pglease migrate");
    let said = stderr(&out);
    assert_eq!(code(&out), 0, "{said}");
    assert!(
        said.contains(&format!("GRANT pg_signal_backend TO {owner}")),
        "{said}"
    );
}

pglease_formations::tests![
    migrate_creates_the_schema_and_the_url_may_follow_the_command,
    migrate_names_the_grant_an_owner_without_pg_signal_backend_lacks,
];
