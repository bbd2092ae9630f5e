//! The `pglease` binary driven as a user would: every command and exit
//! status, `run`'s handling of its command, and a `run` paused with SIGSTOP
//! past its TTL while another worker takes over.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::poll_until;
use crate::common::{BIN, BOUND, code, command, json, pglease, stderr, stdout, wait_bounded};
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

async fn bad_input_exits_2_and_an_unreachable_database_exits_5() {
    let db = crate::common::new_db().await;
    let before = db.state().await;
    for args in [
        &["acquire", "", "--ttl", "1s"][..],
        &["acquire", "job", "--ttl", "0s"],
        &["acquire", "job", "--ttl", "8days"],
        &["acquire", "job", "--ttl", "soon"],
        &["acquire", "job"],
        &["acquire", "job", "--ttl", "500ns"],
        &["renew", "job", "--token", "x", "--ttl", "1s"],
        &["renew", "job", "--token", "0", "--ttl", "1s"],
        &["release", "job", "--token", "-1"],
        &["run", "job", "--ttl", "1s"],
        &[
            "run",
            "job",
            "--ttl",
            "1s",
            "--min-hold",
            "0s",
            "--",
            "true",
        ],
        &[
            "run",
            "job",
            "--ttl",
            "1s",
            "--min-hold",
            "8days",
            "--",
            "true",
        ],
        &["frobnicate"],
    ] {
        let out = pglease(&db, args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    }
    assert_eq!(db.state().await, before);

    // Nothing listens on port 1: refused, said at once (the default
    // connect timeout is 10 s), with the cause.
    let started = std::time::Instant::now();
    let out = Command::new(BIN)
        .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
        .arg("status")
        .output()
        .expect("run");
    let took = started.elapsed();
    assert_eq!(code(&out), 5);
    assert!(stderr(&out).contains("DATABASE_URL"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("refused"),
        "the cause is named: {}",
        stderr(&out)
    );
    assert!(took < Duration::from_secs(5), "refused after {took:?}");
    // Bad arguments are found before connecting: usage (2), not "cannot
    // connect" (5).
    for args in [
        &["acquire", "", "--ttl", "1s"][..],
        &["status", ""],
        &["acquire", "job", "--ttl", "1s", "--holder", ""],
        &["step-down", "job", "--by", ""],
        &["force-release", "job", "--reason", ""],
    ] {
        let out = Command::new(BIN)
            .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
            .args(args)
            .output()
            .expect("run");
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("connect"), "{}", stderr(&out));
    }
    let long = "n".repeat(pglease::limits::MAX_NAME_BYTES + 1);
    let out = Command::new(BIN)
        .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
        .args(["leader", &long])
        .output()
        .expect("run");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("limit is 255 bytes"),
        "{}",
        stderr(&out)
    );

    // A server that accepts the connection but never answers: the connect
    // timeout applies.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = silent.local_addr().expect("address").port();
    let out = Command::new(BIN)
        .args([
            "--database-url",
            &format!("postgres://nobody@127.0.0.1:{port}/none"),
        ])
        .args(["--connect-timeout", "1s", "status"])
        .output()
        .expect("run");
    assert_eq!(code(&out), 5);
    assert!(stderr(&out).contains("no answer"), "{}", stderr(&out));
    drop(silent);
    let out = Command::new(BIN)
        .args(["--database-url", "not a url", "status"])
        .output()
        .expect("run");
    assert_eq!(code(&out), 2);
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

/// Several hosts, as libpq takes them, in every place a URL is taken: a
/// URL in --database-url, a keyword=value string in DATABASE_URL, PGHOST
/// and PGPORT lists; the host that refuses (port 1) is passed over. Lists
/// that do not fit and attributes that cannot be written exit 2 before
/// anything connects.
async fn several_hosts_are_taken_wherever_a_url_is() {
    let db = crate::common::new_db().await;
    let options = db.options();
    let (host, port, user) = (
        options.get_host(),
        options.get_port(),
        options.get_username(),
    );
    let database = options.get_database().unwrap_or("postgres");
    assert_eq!(code(&pglease(&db, &["acquire", "multi", "--ttl", "1m"])), 0);
    let in_url = host.replace('/', "%2F");
    let url = format!("postgres://{user}@127.0.0.1:1,{in_url}:{port}/{database}");
    let keywords = format!("host=127.0.0.1,{host} port=1,{port} user={user} dbname={database}");
    let runs = [
        Command::new(BIN)
            .args(["--database-url", &url, "status", "multi"])
            .output(),
        Command::new(BIN)
            .env("DATABASE_URL", &keywords)
            .args(["status", "multi"])
            .output(),
        Command::new(BIN)
            .env_remove("DATABASE_URL")
            .env("PGHOST", format!("127.0.0.1,{host}"))
            .env("PGPORT", format!("1,{port}"))
            .env("PGUSER", user)
            .env("PGDATABASE", database)
            .args(["status", "multi"])
            .output(),
        // A URL without a host takes PGHOST's list, as libpq does.
        Command::new(BIN)
            .env("PGHOST", format!("127.0.0.1,{host}"))
            .env("PGPORT", format!("1,{port}"))
            .args(["--database-url", &format!("postgres://{user}@/{database}")])
            .args(["status", "multi"])
            .output(),
    ];
    for out in runs {
        let out = out.expect("run the pglease binary");
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(stdout(&out).contains("multi"), "{}", stdout(&out));
    }
    for (url, said) in [
        (
            "postgres://postgres@127.0.0.1/postgres?target_session_attrs=standby",
            "cannot be written",
        ),
        (
            "postgres://postgres@a,b,c/postgres?port=1,2",
            "3 hosts and 2 ports",
        ),
        ("host=a dbnme=x", "dbnme"),
    ] {
        let out = Command::new(BIN)
            .args(["--database-url", url, "status"])
            .output()
            .expect("run the pglease binary");
        assert_eq!(code(&out), 2, "{url}: {}", stderr(&out));
        assert!(stderr(&out).contains(said), "{url}: {}", stderr(&out));
    }
    let out = Command::new(BIN)
        .env_remove("DATABASE_URL")
        .env("PGHOST", "127.0.0.1,127.0.0.2")
        .env("PGPORT", "1,2,3")
        .arg("status")
        .output()
        .expect("run the pglease binary");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("PGHOST"), "{}", stderr(&out));
}

/// Every argument is checked before anything connects (nothing listens on
/// port 1): every duration with its range in words, a negative one
/// included (not clap's hint to write it after `--`, which would make it
/// part of CMD); a TTL under the minimum, which would draw a token for a
/// lease that expires before it is confirmed; a long value, said by its
/// length and not echoed; tokens and counts in words with their bounds;
/// and clap's own refusals. Every one starts `pglease: ` and says nothing
/// in Rust's idiom (`0 is not in 1..=1000`, `invalid digit`).
async fn every_argument_is_checked_before_connecting_and_said_without_echo() {
    let unreachable = ["--database-url", "postgres://nobody@127.0.0.1:1/none"];
    let long_value = "v".repeat(pglease::limits::MAX_VALUE_BYTES + 1);
    let long_name = "n".repeat(300);
    for (args, says) in [
        (
            &["acquire", "x", "--ttl", "8d"][..],
            "invalid --ttl: must be at most 7days, got 8days",
        ),
        (&["acquire", "x", "--ttl", "10d"], "got 10days"),
        (
            &["acquire", "x", "--ttl", "0s"],
            "invalid --ttl: must be at least 100ms, got 0s",
        ),
        (
            &["acquire", "x", "--ttl", "1ns"],
            "must be at least 100ms, got 1ns",
        ),
        (
            &["acquire", "x", "--ttl", "5ms"],
            "must be at least 100ms, got 5ms",
        ),
        (
            &["acquire", "x", "--ttl", "-5s"],
            "invalid --ttl: must not be negative",
        ),
        (
            &["acquire", "x", "--ttl", "soon"],
            "\"soon\" is not a duration",
        ),
        (
            &["acquire", "x", "--ttl", "1s", "--wait", "8d"],
            "invalid --wait: must be at most 7days",
        ),
        (
            &["renew", "x", "--token", "1", "--ttl", "8d"],
            "invalid --ttl",
        ),
        (&["run", "x", "--ttl", "0s", "--", "true"], "invalid --ttl"),
        (
            &["elect", "x", "--ttl", "1ns", "--", "true"],
            "invalid --ttl",
        ),
        (
            &["run", "x", "--ttl", "1s", "--grace", "2d", "--", "true"],
            "invalid --grace: must be at most 1day",
        ),
        (
            &["run", "x", "--ttl", "1s", "--min-hold", "0s", "--", "true"],
            "invalid --min-hold: must be at least 1us",
        ),
        (
            &["run", "x", "--ttl", "1s", "--timeout", "-1s", "--", "true"],
            "invalid --timeout: must not be negative",
        ),
        (
            &["history", "x", "--since", "-1h"],
            "invalid --since: must not be negative",
        ),
        (
            &["--connect-timeout", "0s", "status"],
            "invalid --connect-timeout: must be greater than zero",
        ),
        (
            &["acquire", "x", "--ttl", "1s", "--value", &long_value],
            "is 8193 bytes long; the limit is 8192 bytes",
        ),
        (
            &["status", &long_name],
            "invalid NAME: is 300 bytes long; the limit is 255 bytes",
        ),
        (
            &["renew", "x", "--token", "abc", "--ttl", "1s"],
            "invalid --token: \"abc\" is not a whole number (digits only)",
        ),
        (
            &["release", "x", "--token", "0"],
            "invalid --token: must be positive, got 0",
        ),
        (
            &["release", "x", "--token", "99999999999999999999"],
            "is larger than any token (at most 9223372036854775807)",
        ),
        (
            &["acquire", "x", "--ttl", "1s", "--limit", "0"],
            "invalid --limit: must be from 1 to 1000, got 0",
        ),
        (
            &["run", "x", "--ttl", "1s", "--limit", "1001", "--", "true"],
            "invalid --limit: must be from 1 to 1000, got 1001",
        ),
        (
            &["acquire", "x", "--ttl", "1s", "--limit", "two"],
            "\"two\" is not a whole number; give one from 1 to 1000",
        ),
        (
            &[
                "run",
                "x",
                "--ttl",
                "1s",
                "--wait",
                "1s",
                "--fair",
                "--max-waiting",
                "0",
                "--",
                "true",
            ],
            "invalid --max-waiting: must be from 1 to 1000, got 0",
        ),
        (
            &["--conflict-exit-code", "256", "acquire", "x", "--ttl", "1s"],
            "invalid --conflict-exit-code: must be from 0 to 255, got 256",
        ),
        (&["frob"], "unrecognized subcommand 'frob'"),
        (
            &["acquire", "x", "--ttl", "1s", "--shared", "--limit", "2"],
            "cannot be used with",
        ),
        (&["acquire", "x"], "--ttl <TTL>"),
    ] {
        let out = Command::new(BIN)
            .args(unreachable)
            .args(args)
            .output()
            .expect("run");
        let said = stderr(&out);
        let shown = &args[..args.len().min(4)];
        assert_eq!(code(&out), 2, "{shown:?}: {said}");
        assert!(said.contains(says), "{shown:?}: {said}");
        assert!(!said.contains("connect to"), "{shown:?}: {said}");
        // One style: every error starts as every other does, in words.
        assert!(said.starts_with("pglease: "), "{shown:?}: {said}");
        for idiom in [
            "error:",
            "..=",
            "invalid digit",
            "ParseIntError",
            "is not in ",
        ] {
            assert!(!said.contains(idiom), "{shown:?} says {idiom:?}: {said}");
        }
        assert!(
            said.len() < 400,
            "{shown:?}: the value echoed ({} bytes)",
            said.len()
        );
    }
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

/// A URL of another database is refused before connecting (exit 2); a
/// server that answers, but not as PostgreSQL (here an HTTP server), is
/// named as such (exit 5).
async fn another_kind_of_server_is_named_as_such() {
    let out = Command::new(BIN)
        .args(["--database-url", "mysql://root@127.0.0.1/x", "status"])
        .output()
        .expect("run");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("mysql://"), "{}", stderr(&out));
    let http = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = http.local_addr().expect("address").port();
    let answering = std::thread::spawn(move || {
        use std::io::{Read, Write};
        if let Ok((mut client, _)) = http.accept() {
            let mut request = [0_u8; 1024];
            let _ = client.read(&mut request);
            let _ = client.write_all(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let out = Command::new(BIN)
        .args([
            "--database-url",
            &format!("postgres://nobody@127.0.0.1:{port}/x"),
            "status",
        ])
        .output()
        .expect("run");
    let said = stderr(&out);
    assert_eq!(code(&out), 5, "{said}");
    assert!(said.contains("PostgreSQL's protocol"), "{said}");
    assert!(!said.contains("1414811696"), "{said}");
    let _ = answering.join();
}

async fn run_passes_the_status_through_and_releases_at_once() {
    let db = crate::common::new_db().await;
    let out = pglease(
        &db,
        &[
            "run",
            "job",
            "--ttl",
            "10m",
            "--holder",
            "cron-host",
            "--",
            "sh",
            "-c",
            "echo \"$PGLEASE_NAME $PGLEASE_TOKEN $PGLEASE_HOLDER\"; exit 7",
        ],
    );
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    let printed = stdout(&out);
    let fields: Vec<&str> = printed.split_whitespace().collect();
    assert_eq!(fields[0], "job");
    let status = db.manager().inspect("job").await.expect("inspect");
    assert_eq!(
        Some(fields[1].parse::<pglease::Token>().expect("token")),
        status.token
    );
    assert_eq!(fields[2], "cron-host");
    // Released when the command exited, not at the end of the 10 min TTL.
    assert!(!status.held);

    let killed = pglease(
        &db,
        &["run", "job", "--ttl", "10m", "--", "sh", "-c", "kill -9 $$"],
    );
    assert_eq!(code(&killed), 128 + 9);
    let missing = pglease(
        &db,
        &["run", "job", "--ttl", "10m", "--", "/no/such/command"],
    );
    assert_eq!(code(&missing), 127);
    assert!(!db.manager().inspect("job").await.expect("inspect").held);

    // Held by someone else: exit 3 without waiting, or after --wait.
    let other = db
        .manager()
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_secs(600)).holder("other"),
        )
        .await
        .expect("acquire");
    assert_eq!(
        code(&pglease(&db, &["run", "job", "--ttl", "1m", "--", "true"])),
        3
    );
    let waited = pglease(
        &db,
        &["run", "job", "--ttl", "1m", "--wait", "300ms", "--", "true"],
    );
    assert_eq!(code(&waited), 3);
    assert!(
        stderr(&waited).contains("waiting up to"),
        "{}",
        stderr(&waited)
    );
    db.manager()
        .release(&crate::common::fence("job", other.token()))
        .await
        .expect("release");
}

/// `--min-hold`: a short job keeps its lease until acquisition + D, so the
/// same job started elsewhere meanwhile exits 3; it then expires (it is
/// not released). A job that runs longer than D releases at exit.
async fn min_hold_keeps_a_short_job_from_running_again_too_soon() {
    let db = crate::common::new_db().await;
    let m = db.manager();
    let first = pglease(
        &db,
        &[
            "run",
            "job",
            "--ttl",
            "10s",
            "--min-hold",
            "2s",
            "--",
            "true",
        ],
    );
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    let status = m.inspect("job").await.expect("inspect");
    assert!(status.held, "released at exit despite --min-hold");
    let token = status.token;
    // Kept until about acquisition + 2 s: not released, and not simply
    // left to run out its 10 s TTL.
    let kept: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM expires_at - acquired_at)::float8 \
           FROM pglease.leases WHERE name = 'job'",
    )
    .fetch_one(db.pool())
    .await
    .expect("read the lease row");
    assert!(
        (2.0..5.0).contains(&kept),
        "kept for {kept} s after acquisition"
    );

    let second = pglease(&db, &["run", "job", "--ttl", "10s", "--", "true"]);
    assert_eq!(code(&second), 3, "{}", stderr(&second));

    // It expires at acquisition + 2 s (not after the 10 s TTL) and then
    // the job may run again.
    let expires_at = status.expires_at.expect("expiry");
    db.wait_until(expires_at).await;
    let status = m.inspect("job").await.expect("inspect");
    assert!(!status.held);
    assert_eq!(status.token, token, "nobody acquired it meanwhile");
    assert!(status.holder.is_some(), "it expired; it was not released");
    let third = pglease(
        &db,
        &[
            "run",
            "job",
            "--ttl",
            "10s",
            "--min-hold",
            "50ms",
            "--",
            "sleep",
            "0.2",
        ],
    );
    assert_eq!(code(&third), 0, "{}", stderr(&third));
    let status = m.inspect("job").await.expect("inspect");
    assert!(
        !status.held,
        "a job longer than --min-hold releases at exit"
    );
    assert!(status.holder.is_none());
}

/// `run` whose acquisition waits in the database for longer than its TTL
/// (behind another acquisition that is slow to commit, then rolls back)
/// confirms the lease with a renewal, runs its command and exits 0.
async fn a_run_held_up_in_the_database_past_its_ttl_runs_its_command() {
    let db = crate::common::new_db().await;
    let (_, blocker) = db.hold_up(&db.manager(), "job").await;
    let child = command(
        &db,
        &[
            "run", "job", "--ttl", "1s", "--wait", "30s", "--", "sh", "-c", "echo ran",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .expect("start pglease run");
    db.until_acquiring(None).await;
    // Longer than the TTL, shorter than the 2 s after which the attempt
    // would give up.
    let since = db.now().await;
    db.wait_until(since + chrono::Duration::milliseconds(1200))
        .await;
    blocker.rollback().await.expect("X gives up");
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("wait");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "ran");
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

/// SIGTERM to `run` reaches its command, said on stderr; the lease is
/// released.
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

async fn run_forwards_sigterm_to_the_command_and_releases() {
    let db = crate::common::new_db().await;
    let mut child = command(&db, &["run", "job", "--ttl", "10m", "--", "sleep", "600"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pglease run");
    let mut err_pipe = child.stderr.take().expect("stderr is piped");
    let m = db.manager();
    poll_until("the lease to be held", BOUND, || async {
        m.inspect("job").await.expect("inspect").held
    })
    .await;
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let status = wait_bounded(child).await;
    let mut err = String::new();
    std::io::Read::read_to_string(&mut err_pipe, &mut err).expect("read stderr");
    // sleep died of the forwarded SIGTERM: 128 + 15; said on stderr.
    assert_eq!(status.code(), Some(143), "{err}");
    assert!(
        err.contains("pglease: SIGTERM sent on to the command; waiting for it to exit"),
        "{err}"
    );
    assert!(!m.inspect("job").await.expect("inspect").held);
}

/// Interrupted while its first attempt is stuck in the database (behind
/// another acquisition that has not committed), `run` exits at once with
/// 128 + 2 and never starts its command; the server abandons the attempt,
/// so the lease is not acquired afterwards for a process that is gone.
async fn run_interrupted_while_acquiring_exits_without_its_command() {
    let db = crate::common::new_db().await;
    let (old, blocker) = db.hold_up(&db.manager(), "job").await;

    let marker = std::env::temp_dir().join(format!("pglease-interrupted-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let touch = format!("touch '{}'", marker.display());
    let mut child = command(
        &db,
        &["run", "job", "--ttl", "5s", "--", "sh", "-c", &touch],
    )
    .stderr(Stdio::piped())
    .spawn()
    .expect("start pglease run");
    // run's first attempt is held up in the database.
    db.until_acquiring(None).await;
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).expect("SIGINT");
    let mut err_pipe = child.stderr.take().expect("stderr is piped");
    // Exits while its attempt is still blocked (killed, failing, otherwise).
    let status = wait_bounded(child).await;
    let mut err = String::new();
    std::io::Read::read_to_string(&mut err_pipe, &mut err).expect("read stderr");
    assert_eq!(status.code(), Some(128 + 2), "{err}");
    assert!(err.contains("did not run"), "{err}");

    // The attempt ends (the server notices that the client is gone, or it
    // gives up by itself); only then does X give up.
    db.until_not_acquiring().await;
    blocker.rollback().await.expect("X gives up");
    let status = db.manager().inspect("job").await.expect("inspect");
    assert_eq!(status.token, Some(old.token()), "nobody acquired it since");
    assert!(!marker.exists(), "the command ran");
}

/// The whole `run` process is stopped (SIGSTOP) past its TTL; another
/// worker takes over. The command, in its own process group, keeps trying
/// fenced writes to a protected table: the database rejects them. On
/// SIGCONT, `run` finds its lease lost, stops the command and exits 4.
async fn a_stopped_run_loses_its_lease_and_its_command_is_fenced_off() {
    let psql_present = Command::new("psql").arg("--version").output().is_ok();
    assert!(
        psql_present,
        "this test drives writes with psql, which is not installed"
    );
    let db = crate::common::new_db().await;
    let m = db.manager();
    sqlx::query(
        "CREATE TABLE log (token bigint NOT NULL, at timestamptz DEFAULT clock_timestamp())",
    )
    .execute(db.pool())
    .await
    .expect("create");
    m.admin().protect("log", "job").await.expect("protect");
    let outcomes = std::env::temp_dir().join(format!(
        "pglease-cli-{}-{}",
        std::process::id(),
        db.url().len()
    ));
    let _ = std::fs::remove_file(&outcomes);
    let script = crate::common::fenced_writer(&outcomes);
    let run = command(
        &db,
        &[
            "run", "job", "--ttl", "1s", "--grace", "2s", "--", "sh", "-c", &script,
        ],
    )
    .stdout(Stdio::null())
    .spawn()
    .expect("start pglease run");
    let pid = Pid::from_raw(run.id() as i32);
    let read = |path: &PathBuf| crate::common::read(path);
    poll_until("the command's first fenced write", BOUND, || async {
        read(&outcomes).contains("ok")
    })
    .await;
    let old = m
        .inspect("job")
        .await
        .expect("inspect")
        .token
        .expect("token");

    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    // Past the expiry on the database clock, another worker takes over.
    let taken = loop {
        match m
            .acquire(
                "job",
                AcquireOptions::ttl(Duration::from_secs(600)).holder("B"),
            )
            .await
        {
            Ok(lease) => break lease,
            Err(pglease::Error::Held { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("B's acquire: {e}"),
        }
    };
    assert!(taken.token() > old);
    let written: i64 = sqlx::query_scalar("SELECT count(*) FROM log")
        .fetch_one(db.pool())
        .await
        .expect("count");
    let seen = read(&outcomes).len();
    poll_until(
        "a fenced write after the takeover to be rejected",
        BOUND,
        || async { read(&outcomes)[seen..].contains("rejected") },
    )
    .await;

    kill(pid, Signal::SIGCONT).expect("SIGCONT");
    let status = wait_bounded(run).await;
    assert_eq!(status.code(), Some(4), "run must report the lost lease");
    // The command's process group is gone: nothing is left to write.
    let group: i32 = read(&outcomes)
        .lines()
        .find_map(|l| l.strip_prefix("pid:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("the command wrote its pid");
    poll_until("the command's process group to end", BOUND, || async {
        kill(Pid::from_raw(-group), None).is_err()
    })
    .await;
    let still: i64 = sqlx::query_scalar("SELECT count(*) FROM log")
        .fetch_one(db.pool())
        .await
        .expect("count");
    assert_eq!(
        still, written,
        "a write under the old token landed after the takeover"
    );
    let _ = std::fs::remove_file(&outcomes);
    m.release(&crate::common::fence("job", taken.token()))
        .await
        .expect("release");
}

/// `run --session-bound` killed with SIGKILL: its session ends with it, so
/// the next acquirer (here `pglease acquire --wait`) holds the lease at
/// once, long before the TTL, with a new token; the command `run` left
/// behind is fenced off. `--session-bound` with `--min-hold` exits 2.
async fn a_killed_session_bound_run_hands_its_lease_over_at_once() {
    let db = crate::common::new_db().await;
    let pidfile = std::env::temp_dir().join(format!("pglease-sb-{}", std::process::id()));
    let _ = std::fs::remove_file(&pidfile);
    let script = format!("echo $$ > '{}'; exec sleep 600", pidfile.display());
    let run = command(
        &db,
        &[
            "run",
            "job",
            "--ttl",
            "10m",
            "--session-bound",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .stdout(Stdio::null())
    .spawn()
    .expect("start pglease run");
    let m = db.manager();
    poll_until("the command to start", BOUND, || async {
        crate::common::read(&pidfile).trim().parse::<i32>().is_ok()
    })
    .await;
    let status = m.inspect("job").await.expect("inspect");
    assert!(status.held && status.holder_session.is_some(), "{status:?}");
    let old = status.token.expect("token");
    kill(Pid::from_raw(run.id() as i32), Signal::SIGKILL).expect("SIGKILL");
    let _ = wait_bounded(run).await;
    let out = pglease(
        &db,
        &["acquire", "job", "--ttl", "10m", "--wait", "20s", "--json"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token: i64 = json(&out)["token"].as_i64().expect("a token");
    assert!(token > old.get());
    let stale = crate::common::fence("job", old);
    assert!(
        !m.release(&stale).await.expect("release"),
        "the old token is dead"
    );
    // The command `run` could not stop: ended here.
    let cmd: i32 = crate::common::read(&pidfile).trim().parse().expect("pid");
    let _ = kill(Pid::from_raw(cmd), Signal::SIGKILL);
    let _ = std::fs::remove_file(&pidfile);

    let both = pglease(
        &db,
        &[
            "run",
            "job2",
            "--ttl",
            "1m",
            "--session-bound",
            "--min-hold",
            "1m",
            "--",
            "true",
        ],
    );
    assert_eq!(code(&both), 2, "{}", stderr(&both));
    assert!(stderr(&both).contains("--min-hold"), "{}", stderr(&both));
}

async fn demo_runs_in_a_scratch_database_and_exits_0() {
    let db = crate::common::new_db().await;
    let out = pglease(&db, &["demo"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("REJECTED by PostgreSQL (LE001)"), "{text}");
    assert!(text.contains("| lease + fencing |"), "{text}");
    // Lines fit a terminal of 100 columns, and durations read as a person
    // says them (not `382.175464ms`).
    for line in text.lines() {
        assert!(
            line.chars().count() <= 100,
            "{} columns: {line}",
            line.chars().count()
        );
        assert!(
            !line
                .split(|c: char| !(c.is_ascii_digit() || c == '.'))
                .any(|number| number
                    .split_once('.')
                    .is_some_and(|(_, decimals)| decimals.len() > 2)),
            "a raw float: {line}"
        );
    }
    // Its scratch database is gone.
    let scratch = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("pglease demo in scratch database "))
        .and_then(|l| l.split_whitespace().next())
        .expect("the demo names its scratch database");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = $1")
        .bind(scratch)
        .fetch_one(db.pool())
        .await
        .expect("count");
    assert_eq!(left, 0, "{scratch} was left behind");
}

async fn demo_without_a_server_runs_on_a_throwaway_cluster_and_removes_it() {
    // PostgreSQL installed but not answering where the libpq defaults
    // point, and no DATABASE_URL: the demo starts a cluster of its own.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let child = Command::new(BIN)
        .arg("demo")
        .env_remove("DATABASE_URL")
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", dead.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the demo");
    let pid = child.id();
    let out = child.wait_with_output().expect("the demo");
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("pglease demo on a throwaway cluster (PostgreSQL "),
        "{text}"
    );
    assert!(text.contains("REJECTED by PostgreSQL (LE001)"), "{text}");
    // Its directory goes once the demo has exited.
    let prefix = format!("pglease-cluster-{pid}-");
    let left = || {
        std::fs::read_dir(std::env::temp_dir())
            .map(|d| {
                d.filter_map(Result::ok)
                    .any(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            })
            .unwrap_or(false)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while left() {
        assert!(
            std::time::Instant::now() < deadline,
            "{prefix}* left behind"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

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

async fn run_with_a_limit_runs_at_most_that_many_at_once() {
    let db = crate::common::new_db().await;
    let started = std::env::temp_dir().join(format!("pglease-limit-{}", db.name()));
    let _ = std::fs::remove_file(&started);
    let script = format!(
        "echo \"$PGLEASE_NAME $PGLEASE_TOKEN\" >> {}; sleep 2",
        started.display()
    );
    let run = || {
        command(
            &db,
            &[
                "run", "jobs", "--ttl", "5s", "--limit", "2", "--", "sh", "-c", &script,
            ],
        )
        .stdout(Stdio::null())
        .spawn()
        .expect("start a run")
    };
    let (first, second) = (run(), run());
    poll_until("two runs started", BOUND, || async {
        crate::common::read(&started).lines().count() == 2
    })
    .await;
    // A third finds both slots held.
    let out = pglease(
        &db,
        &["run", "jobs", "--ttl", "5s", "--limit", "2", "--", "true"],
    );
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert_eq!(wait_bounded(first).await.code(), Some(0));
    assert_eq!(wait_bounded(second).await.code(), Some(0));
    let mut slots: Vec<String> = crate::common::read(&started)
        .lines()
        .map(|l| l.split(' ').next().unwrap_or_default().to_owned())
        .collect();
    slots.sort();
    assert_eq!(slots, ["jobs#1", "jobs#2"]);
    // Both released at exit: a run gets a slot at once.
    let out = pglease(
        &db,
        &["run", "jobs", "--ttl", "5s", "--limit", "2", "--", "true"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = pglease(
        &db,
        &["acquire", "jobs", "--ttl", "5s", "--limit", "2", "--json"],
    );
    assert_eq!(json(&out)["name"], "jobs#1");
    pglease(&db, &["acquire", "jobs", "--ttl", "9s", "--limit", "2"]);
    // Full: the refusal names the slot that expires first.
    let out = pglease(
        &db,
        &["acquire", "jobs", "--ttl", "5s", "--limit", "2", "--json"],
    );
    assert_eq!(code(&out), 3);
    assert_eq!(json(&out)["name"], "jobs#1");
    assert!(
        stderr(&out).contains("2 of 2 slots of \"jobs\" are held; the first to end, \"jobs#1\""),
        "{}",
        stderr(&out)
    );
    // Output to a reader that went away is no failure.
    let mut piped = command(&db, &["status", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start status");
    drop(piped.stdout.take());
    assert_eq!(wait_bounded(piped).await.code(), Some(0));
    let _ = std::fs::remove_file(&started);
}

pglease_formations::tests![
    every_argument_is_checked_before_connecting_and_said_without_echo,
    a_token_never_issued_exits_2_saying_so,
    another_kind_of_server_is_named_as_such,
    acquire_renew_release_status_and_their_exit_codes,
    bad_input_exits_2_and_an_unreachable_database_exits_5,
    acquire_publishes_a_value_that_status_shows,
    several_hosts_are_taken_wherever_a_url_is,
    run_passes_the_status_through_and_releases_at_once,
    min_hold_keeps_a_short_job_from_running_again_too_soon,
    a_run_held_up_in_the_database_past_its_ttl_runs_its_command,
    run_forwards_sigterm_to_the_command_and_releases,
    acquire_interrupted_while_waiting_says_so,
    a_pinned_lease_is_said_relative_to_now,
    run_interrupted_while_acquiring_exits_without_its_command,
    a_stopped_run_loses_its_lease_and_its_command_is_fenced_off,
    demo_runs_in_a_scratch_database_and_exits_0,
    demo_without_a_server_runs_on_a_throwaway_cluster_and_removes_it,
    migrate_creates_the_schema_and_the_url_may_follow_the_command,
    migrate_names_the_grant_an_owner_without_pg_signal_backend_lacks,
    doctor_exits_0_when_all_is_well_and_1_otherwise,
    leader_escapes_control_characters,
    output_an_operator_can_script_against,
    run_with_a_limit_runs_at_most_that_many_at_once,
    a_killed_session_bound_run_hands_its_lease_over_at_once,
];
