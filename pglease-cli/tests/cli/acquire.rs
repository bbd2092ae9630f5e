//! `acquire`, `renew`, `release` and `status`: their output and exit
//! statuses, a published value, a token never issued, an interrupted
//! wait, a pinned lease.

use std::process::Stdio;
use std::time::Duration;

use crate::common::{code, command, json, pglease, stderr, stdout, wait_bounded};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pglease::AcquireOptions;

async fn acquire_renew_release_status_and_their_exit_codes() {
    let db = crate::common::new_db().await;
    // Tokens start at 1; one acquisition first, so that "token - 1" below
    // is an issued (stale) token, not an impossible one.
    let m = db.manager();
    let warm_up = m
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_secs(60)).holder("A"),
        )
        .await
        .expect("warm-up");
    m.release(&crate::common::fence("job", warm_up.token()))
        .await
        .expect("release");
    let out = pglease(
        &db,
        &["acquire", "job", "--ttl", "30s", "--holder", "A", "--json"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let lease = json(&out);
    assert_eq!(lease["name"], "job");
    assert_eq!(lease["holder"], "A");
    let token = lease["token"].as_i64().expect("token");
    let expires = lease["expires_at"].as_str().expect("expires_at");
    assert!(
        chrono::DateTime::parse_from_rfc3339(expires).is_ok(),
        "{expires}"
    );

    let held = pglease(&db, &["acquire", "job", "--ttl", "30s", "--holder", "B"]);
    assert_eq!(code(&held), 3);
    assert!(stderr(&held).contains("held by \"A\""), "{}", stderr(&held));

    let t = token.to_string();
    let renewed = pglease(
        &db,
        &["renew", "job", "--token", &t, "--ttl", "1m", "--json"],
    );
    assert_eq!(code(&renewed), 0, "{}", stderr(&renewed));
    assert_eq!(json(&renewed)["token"], token);
    let stale = (token - 1).to_string();
    assert_eq!(
        code(&pglease(
            &db,
            &["renew", "job", "--token", &stale, "--ttl", "1m"]
        )),
        4
    );

    let one = pglease(&db, &["status", "job", "--json"]);
    assert_eq!(code(&one), 0);
    assert_eq!(json(&one)["holder"], "A");
    let never = json(&pglease(&db, &["status", "never", "--json"]));
    assert!(
        never["holder"].is_null() && never["token"].is_null(),
        "{never}"
    );
    let all = json(&pglease(&db, &["status", "--json"]));
    assert_eq!(all.as_array().map(Vec::len), Some(1));
    let table = stdout(&pglease(&db, &["status"]));
    assert!(table.contains("job") && table.contains(" A "), "{table}");

    assert_eq!(code(&pglease(&db, &["release", "job", "--token", &t])), 0);
    assert_eq!(code(&pglease(&db, &["release", "job", "--token", &t])), 4);
    assert!(!db.manager().inspect("job").await.expect("inspect").held);
}

async fn acquire_publishes_a_value_that_status_shows() {
    let db = crate::common::new_db().await;
    let out = pglease(
        &db,
        &[
            "acquire",
            "leader",
            "--ttl",
            "30s",
            "--value",
            "10.0.0.7:8080",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let status = json(&pglease(&db, &["status", "leader", "--json"]));
    assert_eq!(status["value"], "10.0.0.7:8080");
    let status = json(&pglease(&db, &["status", "--json"]));
    assert_eq!(status[0]["value"], "10.0.0.7:8080");
    let never = json(&pglease(&db, &["status", "other", "--json"]));
    assert!(never["value"].is_null(), "{never}");
    let too_long = "x".repeat(pglease::limits::MAX_VALUE_BYTES + 1);
    let out = pglease(&db, &["acquire", "x", "--ttl", "30s", "--value", &too_long]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

/// A token the lease never had is a mistake, said as such (exit 2), not
/// "lost" or "already released"; nothing changes.
async fn a_token_never_issued_exits_2_saying_so() {
    let db = crate::common::new_db().await;
    let out = pglease(&db, &["acquire", "job", "--ttl", "1m", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token = json(&out)["token"].as_i64().expect("a token");
    let unissued = (token + 50).to_string();
    let before = db.state().await;
    for args in [
        &["renew", "job", "--token", &unissued, "--ttl", "1m"][..],
        &["release", "job", "--token", &unissued],
        &["renew", "never-acquired", "--token", "1", "--ttl", "1m"],
    ] {
        let out = pglease(&db, args);
        let said = stderr(&out);
        assert_eq!(code(&out), 2, "{args:?}: {said}");
        assert!(
            said.contains("no such token has been issued") || said.contains("never been acquired"),
            "{args:?}: {said}"
        );
        assert!(
            !said.contains("lost") && !said.contains("already released"),
            "{said}"
        );
    }
    assert_eq!(db.state().await, before);
}

/// `acquire --wait` interrupted while it waits: said on stderr, exit
/// 128 + 2, and the lease is as it was (its holder and token).
async fn acquire_interrupted_while_waiting_says_so() {
    let db = crate::common::new_db().await;
    let out = pglease(
        &db,
        &["acquire", "w", "--ttl", "1m", "--holder", "H", "--json"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token = json(&out)["token"].as_i64().expect("a token");
    let mut child = command(&db, &["acquire", "w", "--ttl", "5s", "--wait", "1m"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pglease acquire");
    let err_pipe = child.stderr.take().expect("stderr is piped");
    // Its first line says it waits.
    let (first, mut rest) = tokio::task::spawn_blocking(move || {
        let mut reader = std::io::BufReader::new(err_pipe);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut reader, &mut line).expect("read stderr");
        (line, reader)
    })
    .await
    .expect("join");
    assert!(first.contains("waiting up to 1m"), "{first}");
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).expect("SIGINT");
    let status = wait_bounded(child).await;
    let mut err = String::new();
    std::io::Read::read_to_string(&mut rest, &mut err).expect("read stderr");
    assert_eq!(status.code(), Some(128 + 2), "{err}");
    assert!(
        err.contains("pglease: interrupted (SIGINT) while waiting for \"w\"; not acquired, an acquisition in flight, if it succeeded, was released"),
        "{err}"
    );
    let lease = db.manager().inspect("w").await.expect("inspect");
    assert_eq!(
        (
            lease.holder.as_deref(),
            lease.token.map(|t| t.get()),
            lease.held
        ),
        (Some("H"), Some(token), true),
        "the lease as it was"
    );
}

/// A lease that has ended but whose row a transaction holds: `acquire`
/// exits 3 saying so with times relative to now (no raw timestamp), and
/// `--json` gives the time itself.
async fn a_pinned_lease_is_said_relative_to_now() {
    let db = crate::common::new_db().await;
    let (_old, blocker) = db.hold_up(&db.manager(), "pin").await;
    let out = pglease(&db, &["acquire", "pin", "--ttl", "5s", "--json"]);
    let said = stderr(&out);
    assert_eq!(code(&out), 3, "{said}");
    assert!(
        said.contains("\"A\"'s lease on \"pin\" expired ")
            && said.contains(" ago, but it cannot be taken yet: "),
        "{said}"
    );
    assert!(!said.contains("+00:00") && !said.contains("UTC"), "{said}");
    assert!(json(&out)["expires_at"].is_string(), "{}", stdout(&out));
    blocker.rollback().await.expect("X gives up");
}

pglease_formations::tests![
    a_token_never_issued_exits_2_saying_so,
    acquire_renew_release_status_and_their_exit_codes,
    acquire_publishes_a_value_that_status_shows,
    acquire_interrupted_while_waiting_says_so,
    a_pinned_lease_is_said_relative_to_now,
];
