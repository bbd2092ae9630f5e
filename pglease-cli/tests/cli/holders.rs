//! Every kind of holder on every surface: a name held only by shared
//! holders, or only through the slots of a counted lease, is shown held
//! by `status NAME` (exit 0), `status --held` and `status --json`;
//! `force-release` ends them all and the name is acquirable at once;
//! `step-down` says why it asks nobody; a refused counted acquisition
//! says how many slots are held.

use crate::common::{TestDb, code, json, pglease, stderr, stdout};

/// Whether shared token `token` of `name` can still be checked in a
/// transaction (`assert_shared`).
async fn shared_valid(db: &TestDb, name: &str, token: i64) -> bool {
    let mut tx = db.pool().begin().await.expect("begin");
    let valid = sqlx::query("SELECT pglease.assert_shared($1, $2)")
        .bind(name)
        .bind(token)
        .execute(&mut *tx)
        .await
        .is_ok();
    tx.rollback().await.expect("rollback");
    valid
}

/// The token `pglease acquire ARGS --json` printed, after exit 0.
fn token_of(db: &TestDb, args: &[&str]) -> i64 {
    let mut all = args.to_vec();
    all.push("--json");
    let out = pglease(db, &all);
    assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
    json(&out)["token"].as_i64().expect("a token")
}

/// Shared holders: shown, forced together, and the name free at once.
async fn shared_holders_are_shown_and_forced() {
    let db = crate::common::new_db().await;
    let shared = |holder| {
        [
            "acquire", "sh1", "--ttl", "10m", "--shared", "--holder", holder,
        ]
    };
    let (a, b) = (token_of(&db, &shared("A")), token_of(&db, &shared("B")));

    let status = pglease(&db, &["status", "sh1"]);
    assert_eq!(code(&status), 0, "held shared: {}", stderr(&status));
    assert!(
        stdout(&status).contains("2 shared holders"),
        "{}",
        stdout(&status)
    );
    let one = json(&pglease(&db, &["status", "sh1", "--json"]));
    assert_eq!(one["kind"], "shared");
    assert_eq!(one["readers"], 2);
    assert!(one["readers_until"].is_string(), "{one}");
    let holders: Vec<(i64, String)> = one["holders"]
        .as_array()
        .expect("each holder")
        .iter()
        .map(|h| (h["token"].as_i64().expect("token"), h["holder"].to_string()))
        .collect();
    assert_eq!(holders, [(a, "\"A\"".into()), (b, "\"B\"".into())]);
    let held = json(&pglease(&db, &["status", "--held", "--json"]));
    let names: Vec<&str> = held
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["sh1"], "--held keeps a name held shared");

    // An exclusive acquisition's refusal says how many hold it shared and
    // for how long (the lease's 10 minutes, not the database's 2 s).
    let refused = pglease(&db, &["acquire", "sh1", "--ttl", "5s"]);
    assert_eq!(code(&refused), 3, "{}", stderr(&refused));
    assert!(
        stderr(&refused)
            .contains("\"sh1\" is held shared by 2 holder(s), the last for another 9m "),
        "{}",
        stderr(&refused)
    );

    // step-down addresses an exclusive holder only, and says so.
    let asked = pglease(&db, &["step-down", "sh1"]);
    assert_eq!(code(&asked), 2, "{}", stderr(&asked));
    assert!(stderr(&asked).contains("held shared by 2 holder(s)"));

    // force-release ends both (safety: neither token checks any more),
    // and an exclusive acquisition is granted at once (liveness).
    let forced = pglease(&db, &["force-release", "sh1", "--reason", "test"]);
    assert_eq!(code(&forced), 0, "{}", stderr(&forced));
    assert!(
        stderr(&forced).contains("its 2 shared holder(s) ended"),
        "{}",
        stderr(&forced)
    );
    assert!(!shared_valid(&db, "sh1", a).await && !shared_valid(&db, "sh1", b).await);
    let after = pglease(&db, &["status", "sh1"]);
    assert_eq!(code(&after), 3, "nobody holds it: {}", stdout(&after));
    let exclusive = token_of(&db, &["acquire", "sh1", "--ttl", "10s"]);
    assert!(exclusive > b, "a new token above every shared one");
    let forced_rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pglease.history WHERE name = 'sh1' AND event = 'force_released'",
    )
    .fetch_one(db.pool())
    .await
    .expect("history");
    assert_eq!(forced_rows, 2, "each shared holder's end recorded");
}

/// A counted lease: its slots shown as "k of n", a full refusal says so,
/// force-release ends every slot.
async fn counted_slots_are_shown_and_forced() {
    let db = crate::common::new_db().await;
    let slot = |holder| {
        [
            "acquire", "jobs", "--ttl", "10m", "--limit", "2", "--holder", holder,
        ]
    };
    let first = token_of(&db, &slot("A"));
    token_of(&db, &slot("B"));
    let refused = pglease(&db, &slot("C"));
    assert_eq!(code(&refused), 3, "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("2 of 2 slots of \"jobs\" are held")
            && stderr(&refused).contains("for another "),
        "{}",
        stderr(&refused)
    );

    let status = pglease(&db, &["status", "jobs"]);
    assert_eq!(code(&status), 0, "{}", stderr(&status));
    assert!(
        stdout(&status).contains("2 of 2 slots held"),
        "{}",
        stdout(&status)
    );
    let one = json(&pglease(&db, &["status", "jobs", "--json"]));
    assert_eq!(
        (one["kind"].as_str(), one["slots"].as_i64()),
        (Some("counted"), Some(2))
    );
    assert_eq!(one["slots_held"], 2);
    let slots: Vec<&str> = one["slot_leases"]
        .as_array()
        .expect("each slot")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(slots, ["jobs#1", "jobs#2"]);

    let asked = pglease(&db, &["step-down", "jobs"]);
    assert_eq!(code(&asked), 2, "{}", stderr(&asked));
    assert!(
        stderr(&asked).contains("step-down jobs#K"),
        "{}",
        stderr(&asked)
    );

    let forced = pglease(&db, &["force-release", "jobs", "--reason", "test"]);
    assert_eq!(code(&forced), 0, "{}", stderr(&forced));
    assert!(stderr(&forced).contains("its 2 held slot(s) ended"));
    let renew = pglease(
        &db,
        &[
            "renew",
            "jobs#1",
            "--token",
            &first.to_string(),
            "--ttl",
            "10m",
        ],
    );
    assert_eq!(
        code(&renew),
        4,
        "the slot's old token is lost: {}",
        stderr(&renew)
    );
    let after = pglease(&db, &["status", "jobs"]);
    assert_eq!(code(&after), 3, "{}", stdout(&after));
    token_of(&db, &slot("C"));
}

/// A name longer than the NAME column is shortened in the table, which
/// keeps its columns; `--json` has it whole.
async fn long_names_keep_the_columns() {
    let db = crate::common::new_db().await;
    let long = format!("jobs/{}", "x".repeat(80));
    token_of(&db, &["acquire", &long, "--ttl", "10m", "--holder", "A"]);
    token_of(&db, &["acquire", "short", "--ttl", "10m", "--holder", "A"]);
    let table = stdout(&pglease(&db, &["status"]));
    let columns: Vec<usize> = table
        .lines()
        .skip(1)
        .map(|line| line.chars().position(|c| c == 'A').unwrap_or(0))
        .collect();
    assert_eq!(columns.len(), 2, "{table}");
    assert_eq!(columns[0], columns[1], "HOLDER in one column:\n{table}");
    assert!(table.contains('…'), "{table}");
    let listed = json(&pglease(&db, &["status", "--json"]));
    assert_eq!(listed[0]["name"], long.as_str());
}

pglease_formations::tests![
    shared_holders_are_shown_and_forced,
    counted_slots_are_shown_and_forced,
    long_names_keep_the_columns,
];
