//! `pglease run`: its command's status passed through, `--min-hold`,
//! `--limit`, signals, an acquisition held up in the database, and a
//! `run` paused with SIGSTOP past its TTL while another worker takes
//! over, or killed while its lease is bound to its session.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::poll_until;
use crate::common::{BOUND, code, command, json, pglease, stderr, stdout, wait_bounded};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pglease::AcquireOptions;

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

/// SIGTERM to `run` reaches its command, said on stderr; the lease is
/// released.
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
    run_passes_the_status_through_and_releases_at_once,
    min_hold_keeps_a_short_job_from_running_again_too_soon,
    a_run_held_up_in_the_database_past_its_ttl_runs_its_command,
    run_forwards_sigterm_to_the_command_and_releases,
    run_interrupted_while_acquiring_exits_without_its_command,
    a_stopped_run_loses_its_lease_and_its_command_is_fenced_off,
    run_with_a_limit_runs_at_most_that_many_at_once,
    a_killed_session_bound_run_hands_its_lease_over_at_once,
];
