//! Every argument checked before anything connects, and said in words
//! (exit 2); an unreachable database (exit 5).

use std::process::Command;
use std::time::Duration;

use crate::common::{BIN, code, pglease, stderr};

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

pglease_formations::tests![
    every_argument_is_checked_before_connecting_and_said_without_echo,
    bad_input_exits_2_and_an_unreachable_database_exits_5,
];
