//! Output an operator can script against: JSON also on failure, exit
//! statuses, `-q`, escaped names and values, completions and manual
//! pages.

use std::process::Command;
use std::time::Duration;

use crate::common::{BIN, code, json, pglease, stderr, stdout};

/// A holder or value with control characters cannot forge a second line
/// of `leader`'s output: they are escaped, as `status` escapes them.
async fn leader_escapes_control_characters() {
    let db = crate::common::new_db().await;
    sqlx::query(
        "SELECT pglease.set_value('svc', a.token, E'10.0.0.1:80\\nevil\\ttoken 1\\t6.6.6.6:66') \
           FROM pglease.acquire('svc', E'replica-A\\tfake', '1 min') AS a",
    )
    .execute(db.pool())
    .await
    .expect("acquire with control characters");
    let out = pglease(&db, &["leader", "svc"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let said = stdout(&out);
    assert_eq!(said.lines().count(), 1, "{said}");
    let fields: Vec<&str> = said.trim_end().split('\t').collect();
    assert_eq!(fields.len(), 3, "{said}");
    assert_eq!(fields[0], "replica-A\\tfake");
    assert_eq!(fields[2], "10.0.0.1:80\\nevil\\ttoken 1\\t6.6.6.6:66");
}

async fn output_an_operator_can_script_against() {
    let db = crate::common::empty_db().await;
    // --json answers in JSON also on failure: no schema yet, no server.
    let out = pglease(&db, &["status", "--json"]);
    assert_eq!(code(&out), 5);
    let failed = json(&out);
    assert_eq!(failed["status"], 5);
    assert!(
        failed["error"]
            .as_str()
            .is_some_and(|e| e.contains("status failed")),
        "{failed}"
    );
    let out = Command::new(BIN)
        .args([
            "--database-url",
            "postgres://postgres@127.0.0.1:1/x",
            "acquire",
            "job",
        ])
        .args(["--ttl", "5s", "--json"])
        .output()
        .expect("run");
    assert_eq!(code(&out), 5);
    let failed = json(&out);
    assert_eq!(failed["status"], 5);
    assert!(
        failed["error"]
            .as_str()
            .is_some_and(|e| e.contains("127.0.0.1:1") && e.contains("refused")),
        "the server and the cause: {failed}"
    );
    // migrate says what it did.
    let out = pglease(&db, &["migrate"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("created the pglease schema (migration 1)"),
        "{}",
        stderr(&out)
    );
    let out = pglease(&db, &["migrate"]);
    assert!(stderr(&out).contains("up to date"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("created"), "{}", stderr(&out));
    let migrated = json(&pglease(&db, &["migrate", "--json"]));
    assert_eq!(migrated["applied"], serde_json::json!([]));
    assert!(migrated["latest"].as_i64() == Some(1), "{migrated}");
    // Nobody to force or ask: 3, and the object says so.
    for args in [
        &["force-release", "job", "--reason", "test", "--json"][..],
        &["step-down", "job", "--json"],
    ] {
        let out = pglease(&db, args);
        assert_eq!(code(&out), 3, "{args:?}");
        assert!(json(&out)["token"].is_null(), "{args:?}");
    }

    // acquire names the host and what took the lease, not a dead pid.
    let held = json(&pglease(&db, &["acquire", "job", "--ttl", "60s", "--json"]));
    let holder = held["holder"].as_str().expect("holder");
    assert!(holder.ends_with(" (pglease acquire)"), "{holder}");
    let token = held["token"].to_string();

    // Busy: 3, or the status asked for; -q prints nothing then.
    let out = pglease(&db, &["acquire", "job", "--ttl", "60s"]);
    assert_eq!(code(&out), 3);
    let out = pglease(
        &db,
        &[
            "-q",
            "--conflict-exit-code",
            "0",
            "acquire",
            "job",
            "--ttl",
            "60s",
        ],
    );
    assert_eq!(code(&out), 0);
    assert_eq!((stdout(&out).as_str(), stderr(&out).as_str()), ("", ""));
    let out = pglease(
        &db,
        &[
            "--conflict-exit-code",
            "75",
            "run",
            "job",
            "--ttl",
            "5s",
            "--",
            "true",
        ],
    );
    assert_eq!(code(&out), 75, "{}", stderr(&out));

    // status NAME: 0 held, 3 otherwise; filters and a summary; odd names
    // are escaped, one line each.
    assert_eq!(code(&pglease(&db, &["status", "job"])), 0);
    assert_eq!(code(&pglease(&db, &["status", "never"])), 3);
    pglease(&db, &["acquire", "odd\nname", "--ttl", "60s"]);
    pglease(&db, &["acquire", "other", "--ttl", "60s"]);
    let out = pglease(&db, &["status"]);
    let table = stdout(&out);
    assert_eq!(table.lines().count(), 4, "{table}");
    assert!(table.contains("odd\\nname"), "{table}");
    assert!(
        stderr(&out).contains("3 of 3 leases shown: 3 held"),
        "{}",
        stderr(&out)
    );
    let some = json(&pglease(
        &db,
        &["status", "--prefix", "o", "--limit", "1", "--json"],
    ));
    assert_eq!(some.as_array().map(Vec::len), Some(1), "{some}");
    assert_eq!(some[0]["name"], "odd\nname");
    let none = json(&pglease(&db, &["status", "--expired", "--json"]));
    assert_eq!(none.as_array().map(Vec::len), Some(0), "{none}");
    assert_eq!(code(&pglease(&db, &["status", "job", "--held"])), 2);

    // release and renew answer in JSON, also when the token is not held
    // (stale: an earlier term's).
    let earlier = crate::common::acquired(&db, &["gone", "--ttl", "5s"]);
    assert_eq!(
        code(&pglease(&db, &["release", "gone", "--token", &earlier])),
        0
    );
    let again = crate::common::acquired(&db, &["gone", "--ttl", "5s"]);
    let out = pglease(&db, &["release", "gone", "--token", &earlier, "--json"]);
    assert_eq!(code(&out), 4);
    assert_eq!(json(&out)["released"], false);
    let out = pglease(
        &db,
        &[
            "renew", "gone", "--token", &earlier, "--ttl", "5s", "--json",
        ],
    );
    assert_eq!(code(&out), 4);
    let lost = json(&out);
    assert!(lost["token"].is_null() && lost["lost"] == true, "{lost}");
    assert_eq!(lost["current_token"].to_string(), again);
    // A token never issued: a failure, in JSON too.
    let out = pglease(&db, &["release", "gone", "--token", "999999", "--json"]);
    assert_eq!(code(&out), 2);
    assert_eq!(json(&out)["status"], 2);
    let out = pglease(&db, &["release", "job", "--token", &token, "--json"]);
    assert_eq!(code(&out), 0);
    assert_eq!(json(&out)["released"], true);
    assert!(stderr(&out).contains("released"), "{}", stderr(&out));
    let out = pglease(&db, &["-q", "release", "other", "--token", "999"]);
    assert!(!stderr(&out).is_empty(), "errors are printed under -q too");

    // run --timeout: CMD stopped, exit 124, the lease released at once.
    let started = std::time::Instant::now();
    let out = pglease(
        &db,
        &[
            "run",
            "slow",
            "--ttl",
            "5s",
            "--timeout",
            "300ms",
            "--",
            "sleep",
            "30",
        ],
    );
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert!(started.elapsed() < Duration::from_secs(20));
    let slow = json(&pglease(&db, &["status", "slow", "--json"]));
    assert!(slow["holder"].is_null(), "released: {slow}");

    // Completions and the manual page need no database.
    let out = Command::new(BIN)
        .args(["completions", "bash"])
        .output()
        .expect("run");
    assert_eq!(code(&out), 0);
    assert!(
        stdout(&out).contains("force-release"),
        "the subcommands are completed"
    );
    let out = Command::new(BIN).arg("man").output().expect("run");
    assert_eq!(code(&out), 0);
    assert!(stdout(&out).contains(".TH pglease 1"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(".SH \"EXIT STATUS\""),
        "{}",
        stdout(&out)
    );
    assert!(!stdout(&out).contains("pglease\\-help"), "no page for help");
    // A directory that does not exist yet is made.
    let pages = std::env::temp_dir()
        .join(format!("pglease-man-{}", std::process::id()))
        .join("man1");
    let out = Command::new(BIN)
        .args(["man", "--dir"])
        .arg(&pages)
        .output()
        .expect("run");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let run_page = std::fs::read_to_string(pages.join("pglease-run.1")).expect("pglease-run.1");
    assert!(run_page.contains("\\-\\-timeout"), "{run_page}");
    // Each command's page has its own exit statuses.
    assert!(run_page.contains(".SH \"EXIT STATUS\""), "{run_page}");
    assert!(run_page.contains("CMD cannot be started"), "{run_page}");
    let out = Command::new(BIN)
        .args(["step-down", "--help"])
        .output()
        .expect("run");
    assert!(
        stdout(&out).contains("Exit status:") && stdout(&out).contains("held shared or counted"),
        "{}",
        stdout(&out)
    );
    assert!(pages.join("pglease.1").exists());
    assert!(pages.join("pglease-force-release.1").exists());
    assert!(!pages.join("pglease-help.1").exists());
    let _ = std::fs::remove_dir_all(pages.parent().unwrap_or(&pages));
    let out = Command::new(BIN)
        .arg("--help")
        .env("DATABASE_URL", "postgres://u:s3cret@127.0.0.1/x")
        .output()
        .expect("run");
    assert!(stdout(&out).contains("Exit status:"), "{}", stdout(&out));
    assert!(
        !stdout(&out).contains("s3cret"),
        "--help shows the password"
    );
}

pglease_formations::tests![
    leader_escapes_control_characters,
    output_an_operator_can_script_against,
];
