//! `pglease hand-over`: a holder moves its lease to a `run --fair` that
//! waits in line under the successor's name, which starts at once with the
//! new token; the old token is refused from then on; a successor that
//! does not wait keeps the lease unless `--or-release` (exit 3 either way).

use std::process::Stdio;
use std::time::Instant;

use crate::common::{BOUND, TestDb, code, command, json, pglease, poll_until, stderr, stdout};

/// Whether `holder` waits in line for `name`.
async fn waiting(db: &TestDb, name: &str, holder: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pglease.line WHERE name = $1 AND holder = $2)")
        .bind(name)
        .bind(holder)
        .fetch_one(db.pool())
        .await
        .expect("read the line")
}

/// `pglease hand-over job --token TOKEN --to SUCCESSOR --ttl 10s EXTRA`.
fn hand_over(db: &TestDb, token: &str, successor: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "hand-over",
        "job",
        "--token",
        token,
        "--to",
        successor,
        "--ttl",
        "10s",
    ];
    args.extend_from_slice(extra);
    pglease(db, &args)
}

/// `pglease acquire job --holder HOLDER`: its token.
fn acquired(db: &TestDb, holder: &str) -> String {
    crate::common::acquired(db, &["job", "--ttl", "1m", "--holder", holder])
}

async fn hand_over_to_a_waiting_run_and_to_nobody() {
    let db = crate::common::new_db().await;
    let old = acquired(&db, "A");
    let successor = command(
        &db,
        &[
            "run",
            "job",
            "--ttl",
            "10s",
            "--wait",
            "30s",
            "--fair",
            "--holder",
            "B",
            "--",
            "sh",
            "-c",
            "echo $PGLEASE_TOKEN",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .expect("start the successor's run");
    poll_until("B to wait in line", BOUND, || waiting(&db, "job", "B")).await;

    let handed = Instant::now();
    let out = hand_over(&db, &old, "B", &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let new = stdout(&out).trim().to_owned();
    let ran = successor.wait_with_output().expect("the successor's run");
    println!(
        "the successor's run ended {:?} after the handover began",
        handed.elapsed()
    );
    assert_eq!(
        ran.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&ran.stdout).trim(),
        new,
        "CMD ran under the new token"
    );
    assert!(new.parse::<i64>().expect("a token") > old.parse::<i64>().expect("a token"));

    // The old token is refused from the move on.
    let again = hand_over(&db, &old, "B", &[]);
    assert_eq!(code(&again), 4, "{}", stderr(&again));
    let renew = pglease(&db, &["renew", "job", "--token", &old, "--ttl", "1m"]);
    assert_ne!(code(&renew), 0, "{}", stderr(&renew));

    // Nobody waits under the name given (a typo): the lease is kept,
    // valid under its token (exit 3, nothing changed).
    let token = acquired(&db, "C");
    let out = hand_over(&db, &token, "Z", &["--json"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert_eq!(json(&out)["released"], false);
    assert_eq!(json(&out)["handed_over"], false);
    assert!(
        stderr(&out).contains("the lease is kept"),
        "{}",
        stderr(&out)
    );
    let renew = pglease(&db, &["renew", "job", "--token", &token, "--ttl", "1m"]);
    assert_eq!(
        code(&renew),
        0,
        "still held under its token: {}",
        stderr(&renew)
    );

    // With --or-release, the lease is released instead (exit 3).
    let out = hand_over(&db, &token, "Z", &["--json", "--or-release"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert_eq!(json(&out)["released"], true);
    let status = pglease(&db, &["status", "job"]);
    assert_eq!(code(&status), 3, "released: {}", stdout(&status));
}

pglease_formations::tests![hand_over_to_a_waiting_run_and_to_nobody];
