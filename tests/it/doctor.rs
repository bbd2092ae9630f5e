//! `Admin::doctor` on the test server: all is well on a migrated
//! database; a missing or outdated schema is a problem, said with what to
//! do. (Standbys: `failover.rs`.)

use crate::common::TestDb;
use pglease::doctor::{Diagnosis, Verdict};
use pglease::schema::MIGRATIONS_TABLE;

fn check<'a>(diagnosis: &'a Diagnosis, name: &str) -> &'a pglease::doctor::Check {
    diagnosis
        .checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no {name} check in {diagnosis:?}"))
}

async fn a_migrated_database_on_this_server_is_all_well() {
    let db = TestDb::new().await;
    let diagnosis = db
        .manager()
        .admin()
        .doctor(&pglease::doctor::DoctorOptions::default())
        .await
        .expect("doctor");
    let mut names: Vec<&str> = diagnosis.checks.iter().map(|c| c.name).collect();
    // The security posture is a check per finding.
    names.dedup();
    assert_eq!(
        names,
        [
            "schema",
            "primary",
            "pooler",
            "durability",
            "replication",
            "timeline",
            "takeover",
            "security",
            "server_version",
            "privileges",
            "connection"
        ]
    );
    assert_eq!(diagnosis.verdict(), Verdict::Ok, "{diagnosis:#?}");
    let timeline = check(&diagnosis, "timeline");
    assert!(
        timeline.detail.contains("the one the schema was made on"),
        "{}",
        timeline.detail
    );
    let pooler = check(&diagnosis, "pooler");
    assert!(
        pooler.detail.contains("no transaction pooler"),
        "{}",
        pooler.detail
    );
}

async fn a_missing_or_outdated_schema_is_a_problem() {
    let db = TestDb::empty().await;
    let m = db.manager();
    let diagnosis = m
        .admin()
        .doctor(&pglease::doctor::DoctorOptions::default())
        .await
        .expect("doctor");
    let schema = check(&diagnosis, "schema");
    assert_eq!(schema.verdict, Verdict::Problem);
    assert!(
        schema.detail.contains("pglease migrate"),
        "{}",
        schema.detail
    );
    assert_eq!(check(&diagnosis, "takeover").verdict, Verdict::Warning);

    m.migrate().await.expect("migrate");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE FROM {MIGRATIONS_TABLE} WHERE version = (SELECT max(version) FROM {MIGRATIONS_TABLE})"
    )))
    .execute(db.pool())
    .await
    .expect("forget the latest migration");
    let schema = m
        .admin()
        .doctor(&pglease::doctor::DoctorOptions::default())
        .await
        .expect("doctor")
        .checks
        .remove(0);
    assert_eq!(schema.verdict, Verdict::Problem, "{schema:?}");
    assert!(schema.detail.contains("needs"), "{}", schema.detail);
}

/// An application role may not read the migrations table: the schema
/// check says so instead of failing the whole diagnosis.
async fn an_application_role_gets_findings_not_an_error() {
    let role = format!("pglease_doctor_{}", std::process::id());
    let db = &TestDb::new().await;
    db.scratch_roles(&[&role]).await;
    db.execute(&[
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT USAGE ON SCHEMA pglease TO {role}"),
    ])
    .await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(db.options().username(&role))
        .await
        .expect("connect as the application role");
    let diagnosis = pglease::LeaseManager::new(pool.clone())
        .admin()
        .doctor(&pglease::doctor::DoctorOptions::default())
        .await
        .expect("doctor as an application role");
    let schema = check(&diagnosis, "schema");
    assert_eq!(schema.verdict, Verdict::Warning, "{schema:?}");
    assert!(schema.detail.contains("owner"), "{}", schema.detail);
    // Not granted the timelines: said, with the grant.
    let timeline = check(&diagnosis, "timeline");
    assert_eq!(timeline.verdict, Verdict::Warning, "{timeline:?}");
    assert!(
        timeline
            .detail
            .contains("GRANT SELECT ON pglease.timelines"),
        "{}",
        timeline.detail
    );
    // Not granted the views: said, with the grant.
    let privileges = check(&diagnosis, "privileges");
    assert_eq!(privileges.verdict, Verdict::Warning, "{privileges:?}");
    assert!(
        privileges.detail.ends_with(&format!(
            "GRANT SELECT ON pglease.status, pglease.history, pglease.shared TO \"{role}\";"
        )),
        "{}",
        privileges.detail
    );
    pool.close().await;

    // A role granted nothing (CONNECT only): findings, each missing
    // privilege with its grant, not an error.
    let bare = format!("pglease_doctor_bare_{}", std::process::id());
    db.scratch_roles(&[&bare]).await;
    db.execute(&[format!("CREATE ROLE {bare} LOGIN")]).await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(db.options().username(&bare))
        .await
        .expect("connect as a role granted nothing");
    let diagnosis = pglease::LeaseManager::new(pool.clone())
        .admin()
        .doctor(&pglease::doctor::DoctorOptions::default())
        .await
        .expect("doctor as a role granted nothing");
    assert_eq!(diagnosis.verdict(), Verdict::Problem);
    let usage = check(&diagnosis, "privileges");
    assert_eq!(usage.verdict, Verdict::Problem, "{usage:?}");
    assert!(
        usage
            .detail
            .ends_with(&format!("GRANT USAGE ON SCHEMA pglease TO \"{bare}\";")),
        "{}",
        usage.detail
    );
    let takeover = check(&diagnosis, "takeover");
    assert!(
        takeover.detail.contains("cannot tell"),
        "{}",
        takeover.detail
    );
    pool.close().await;
}

pglease_formations::tests![
    a_migrated_database_on_this_server_is_all_well,
    a_missing_or_outdated_schema_is_a_problem,
    an_application_role_gets_findings_not_an_error,
];
