//! `pglease doctor`: exit 0 when all is well, 1 otherwise.

use crate::common::{code, json, pglease, stderr, stdout};

async fn doctor_exits_0_when_all_is_well_and_1_otherwise() {
    let db = crate::common::new_db().await;
    let out = pglease(&db, &["doctor"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    // Ten checks, the security posture one line per finding (six on a
    // fresh database: schema, administrators, takeover, names, fences (the
    // DDL fence is off), history).
    let said = stdout(&out);
    assert_eq!(said.lines().count(), 16, "{said}");
    assert!(
        said.contains("timeline 1, the one the schema was made on"),
        "{said}"
    );
    assert_eq!(
        said.lines().filter(|l| l.contains(" security ")).count(),
        6,
        "{said}"
    );
    assert!(
        said.contains("administrators: superusers, members of"),
        "{said}"
    );
    let out = pglease(&db, &["doctor", "--json"]);
    assert_eq!(code(&out), 0);
    let report = json(&out);
    assert_eq!(report["verdict"], "ok");
    assert_eq!(report["checks"].as_array().map(Vec::len), Some(16));

    let empty = crate::common::empty_db().await;
    let out = pglease(&empty, &["doctor", "--json"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["verdict"], "problem");
    assert_eq!(report["checks"][0]["name"], "schema");
    assert_eq!(report["checks"][0]["verdict"], "problem");
}

pglease_formations::tests![
    doctor_exits_0_when_all_is_well_and_1_otherwise,
];
