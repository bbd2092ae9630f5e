//! `pglease history` and `pglease force-release` driven as an operator
//! would: a `run` holding a lease while its command writes under the
//! token is forced; the run exits 4 (lost), no write under the old token
//! commits after the force, and the history shows the term and the reason.

use std::process::Stdio;

use crate::common::poll_until;
use crate::common::{
    BOUND, code, command, groups, json, pglease, read, stderr, stdout, wait_bounded,
};
use nix::sys::signal::kill;
use nix::unistd::Pid;

async fn force_release_stops_a_running_holder_and_the_history_says_why() {
    let db = crate::common::new_db().await;
    sqlx::query("CREATE TABLE log (id bigserial PRIMARY KEY, token bigint NOT NULL)")
        .execute(db.pool())
        .await
        .expect("create the log");
    db.manager()
        .admin()
        .protect("log", "job")
        .await
        .expect("protect");
    let outcomes = std::env::temp_dir().join(format!("pglease-force-{}", db.name()));
    let _ = std::fs::remove_file(&outcomes);
    let script = crate::common::fenced_writer(&outcomes);
    let run = command(
        &db,
        &[
            "run", "job", "--ttl", "3s", "--grace", "2s", "--holder", "worker-7", "--", "sh", "-c",
            &script,
        ],
    )
    .stdout(Stdio::null())
    .spawn()
    .expect("start pglease run");
    poll_until("the command's first fenced write", BOUND, || async {
        read(&outcomes).contains("ok")
    })
    .await;
    let token = json(&pglease(&db, &["status", "job", "--json"]))["token"]
        .as_i64()
        .expect("a token");

    // Authority: an application role, even granted EXECUTE, may not force;
    // it is told the grant to ask for and the lease stays held.
    let app = format!("app_{}", db.name());
    db.scratch_roles(&[&app]).await;
    db.execute(&[
        format!("CREATE ROLE {app} LOGIN"),
        format!("GRANT USAGE ON SCHEMA pglease TO {app}"),
        format!("GRANT EXECUTE ON FUNCTION pglease.force_release(text, text) TO {app}"),
    ])
    .await;
    let out = std::process::Command::new(crate::common::BIN)
        .args(["--database-url", &db.url_for(&app, "unused")])
        .args(["force-release", "job", "--reason", "not mine"])
        .output()
        .expect("run pglease");
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("may not force leases")
            && stderr(&out).contains(&format!("GRANT pglease_admin TO \"{app}\"")),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        json(&pglease(&db, &["status", "job", "--json"]))["token"].as_i64(),
        Some(token),
        "a refused force changed nothing"
    );

    let out = pglease(&db, &["force-release", "job", "--reason", "INC-7: stuck"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let forced = std::time::Instant::now();
    let written: i64 = sqlx::query_scalar("SELECT count(*) FROM log")
        .fetch_one(db.pool())
        .await
        .expect("count");
    // The run learns at its next renewal (a third of 3 s at most) and
    // stops its command; meanwhile every write under the old token fails.
    let status = wait_bounded(run).await;
    assert_eq!(status.code(), Some(4), "run reports the lost lease");
    eprintln!("run exited {:?} after the force", forced.elapsed());
    for group in groups(&outcomes) {
        poll_until("the command's group to end", BOUND, || async {
            kill(Pid::from_raw(-group), None).is_err()
        })
        .await;
    }
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM log")
        .fetch_one(db.pool())
        .await
        .expect("count");
    assert_eq!(after, written, "a write under the forced token committed");
    assert!(
        read(&outcomes).contains("rejected"),
        "its writes were refused"
    );

    // Liveness: another holder gets the lease at once.
    let out = pglease(&db, &["acquire", "job", "--ttl", "30s", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(json(&out)["token"].as_i64() > Some(token), "a newer token");
    let taken = json(&out)["token"].to_string();
    pglease(&db, &["release", "job", "--token", &taken]);
    // Nothing left to force; a reason is required.
    assert_eq!(
        code(&pglease(
            &db,
            &["force-release", "job", "--reason", "again"]
        )),
        3
    );
    let out = pglease(&db, &["force-release", "job", "--reason", ""]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));

    let history = json(&pglease(&db, &["history", "job", "--json"]));
    let rows = history.as_array().expect("an array");
    // When the force came while CMD's fenced write was open, ending that
    // session is recorded too ("evicted", just before the force).
    let rows: Vec<&serde_json::Value> = rows.iter().filter(|r| r["event"] != "evicted").collect();
    let events: Vec<&str> = rows.iter().map(|r| r["event"].as_str().unwrap()).collect();
    assert_eq!(
        events,
        ["acquired", "force_released", "acquired", "released"],
        "{history}"
    );
    assert_eq!(rows[1]["token"], token);
    assert_eq!(rows[1]["holder"], "worker-7");
    assert_eq!(rows[1]["detail"], "INC-7: stuck");
    let table = stdout(&pglease(&db, &["history", "job", "--since", "1h"]));
    assert!(table.starts_with("AT"), "{table}");
    assert!(
        table.contains("force_released") && table.contains("INC-7: stuck"),
        "{table}"
    );
    let _ = std::fs::remove_file(&outcomes);
}

/// The demo's scenario played with the command line on lease `job`: A
/// acquires it (TTL 1 s) and opens a fenced transaction, then pauses
/// past its TTL; B waits for it and takes it over, which ends A's
/// fenced session; A's late fenced write under its token is refused; B
/// releases. Returns A's and B's tokens.
pub async fn stale_takeover(db: &crate::common::TestDb) -> (i64, i64) {
    let a: i64 = crate::common::acquired(db, &["job", "--ttl", "1s", "--holder", "A"])
        .parse()
        .expect("a token");
    let mut paused = db.pool().acquire().await.expect("A's connection");
    sqlx::query("BEGIN")
        .execute(&mut *paused)
        .await
        .expect("begin");
    sqlx::query("SELECT pglease.assert_held('job', $1)")
        .bind(a)
        .execute(&mut *paused)
        .await
        .expect("A's fenced transaction");
    let out = pglease(
        db,
        &[
            "acquire", "job", "--ttl", "30s", "--holder", "B", "--wait", "20s", "--json",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let b = json(&out)["token"].as_i64().expect("B's token");
    // A's paused session was ended by the takeover; its late write under
    // its token, on a new connection, is refused.
    assert!(
        sqlx::query("SELECT 1")
            .execute(&mut *paused)
            .await
            .is_err(),
        "A's fenced session outlived the takeover"
    );
    paused.close_on_drop();
    drop(paused);
    let late = sqlx::query("SELECT pglease.assert_held('job', $1)")
        .bind(a)
        .execute(db.pool())
        .await
        .expect_err("A's late write is refused");
    assert!(late.to_string().contains("job"), "{late}");
    let out = pglease(db, &["release", "job", "--token", &b.to_string()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    (a, b)
}

/// `history` lists a lease's transitions in the order they happened:
/// the takeover ends A's fenced session after A's term expired, and
/// records that eviction before it records the expiry (at the time it
/// happened, in the past): oldest first means by time, not by row id.
async fn history_lists_an_expiry_before_the_eviction_that_followed_it() {
    let db = crate::common::new_db().await;
    let (a, b) = stale_takeover(&db).await;
    let history = json(&pglease(&db, &["history", "job", "--json"]));
    let rows = history.as_array().expect("an array");
    let seen: Vec<(&str, i64)> = rows
        .iter()
        .map(|r| {
            (
                r["event"].as_str().expect("an event"),
                r["token"].as_i64().expect("a token"),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("acquired", a),
            ("expired", a),
            ("evicted", a),
            ("acquired", b),
            ("released", b)
        ],
        "{history}"
    );
    let times: Vec<chrono::DateTime<chrono::FixedOffset>> = rows
        .iter()
        .map(|r| {
            chrono::DateTime::parse_from_rfc3339(r["at"].as_str().expect("a time"))
                .expect("an RFC 3339 time")
        })
        .collect();
    assert!(times.is_sorted(), "{history}");
    // The table says the same, in the same order.
    let table = stdout(&pglease(&db, &["history", "job"]));
    let events: Vec<&str> = table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert_eq!(
        events,
        ["acquired", "expired", "evicted", "acquired", "released"],
        "{table}"
    );
}

pglease_formations::tests![
    force_release_stops_a_running_holder_and_the_history_says_why(2),
    history_lists_an_expiry_before_the_eviction_that_followed_it,
];
