//! `pglease run` with several names: every lease of the set or none, each
//! token handed to the command, the command stopped when any lease is
//! lost and fenced off on every one, names another role was granted
//! refused, and the combinations that cannot work refused before
//! connecting.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{
    BIN, BOUND, TestDb, code, command, fence, pglease, poll_until, read, stderr, stdout,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pglease::{AcquireOptions, Token};

/// The token of `name` as the database has it, and whether it is held.
async fn row(db: &TestDb, name: &str) -> (Option<Token>, bool) {
    let status = db.manager().inspect(name).await.expect("inspect");
    (status.token, status.held)
}

/// Whether a session watches `name` for its release (`pglease.watch`, a
/// shared advisory lock): a waiting acquisition whose first attempt was
/// refused (the library watches only then).
async fn someone_watches(db: &TestDb, name: &str) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_locks \
          WHERE locktype = 'advisory' AND objsubid = 2 AND granted \
            AND classid = 1886156641::oid AND objid = pglease._watch_key($1)::oid)",
    )
    .bind(name)
    .fetch_one(db.pool())
    .await
    .expect("read pg_locks")
}

/// Two names: both taken (in byte order, so "acct:7" draws its token
/// before "acct:9" whatever the order given), handed to CMD in the order
/// given, released when CMD exits. One of them held by another: exit 3
/// naming it, the other untouched; with --wait, the set once it is free.
async fn run_takes_every_lease_or_none_and_hands_each_token_over() {
    let db = crate::common::new_db().await;
    let show = "echo \"$PGLEASE_LEASES $PGLEASE_NAME_1=$PGLEASE_TOKEN_1 \
                $PGLEASE_NAME_2=$PGLEASE_TOKEN_2 ${PGLEASE_NAME-unset} ${PGLEASE_TOKEN-unset}\"";
    let out = pglease(
        &db,
        &[
            "run", "acct:9", "acct:7", "--ttl", "10m", "--", "sh", "-c", show,
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let printed = stdout(&out);
    let fields: Vec<&str> = printed.split_whitespace().collect();
    assert_eq!(fields[0], "2", "{printed}");
    let token_of = |field: &str, name: &str| -> Token {
        let (given, token) = field.split_once('=').expect("NAME=TOKEN");
        assert_eq!(given, name, "{printed}");
        token.parse().expect("a token")
    };
    let (nine, seven) = (token_of(fields[1], "acct:9"), token_of(fields[2], "acct:7"));
    assert!(seven < nine, "taken in byte order: {printed}");
    // With several leases the single-lease variables are unset: a script
    // written for one lease fails instead of fencing on one of them.
    assert_eq!(&fields[3..], ["unset", "unset"], "{printed}");
    assert_eq!(row(&db, "acct:9").await, (Some(nine), false), "released");
    assert_eq!(row(&db, "acct:7").await, (Some(seven), false), "released");

    // One held by another: nothing taken, the holder named.
    let other = db
        .manager()
        .acquire(
            "acct:9",
            AcquireOptions::ttl(Duration::from_secs(600)).holder("other"),
        )
        .await
        .expect("acquire");
    let refused = pglease(
        &db,
        &["run", "acct:7", "acct:9", "--ttl", "1m", "--", "true"],
    );
    assert_eq!(code(&refused), 3, "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("\"acct:9\" is held by \"other\""),
        "{}",
        stderr(&refused)
    );
    assert_eq!(row(&db, "acct:7").await, (Some(seven), false), "untouched");

    // Waiting: granted once the other lets go.
    let waiting = command(
        &db,
        &[
            "run",
            "acct:7",
            "acct:9",
            "--ttl",
            "1m",
            "--wait",
            "30s",
            "--",
            "sh",
            "-c",
            "echo \"$PGLEASE_TOKEN_1 $PGLEASE_TOKEN_2\"",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start pglease run");
    poll_until("the run to wait for acct:9", BOUND, || {
        someone_watches(&db, "acct:9")
    })
    .await;
    db.manager()
        .release(&fence("acct:9", other.token()))
        .await
        .expect("release");
    let status = wait_bounded_output(waiting).await;
    assert_eq!(code(&status), 0, "{}", stderr(&status));
    assert!(
        stderr(&status).contains("\"acct:9\" is held by \"other\"")
            && stderr(&status).contains("waiting up to 30s"),
        "{}",
        stderr(&status)
    );
    let tokens: Vec<Token> = stdout(&status)
        .split_whitespace()
        .map(|t| t.parse().expect("a token"))
        .collect();
    assert!(tokens.iter().all(|t| *t > other.token()), "{tokens:?}");
}

/// A set run paused past its TTL (SIGSTOP) while another worker takes one
/// of its leases: the command's fenced writes (checking both tokens) are
/// refused from the takeover on, the run exits 4 naming the lease it lost
/// once it runs again, and its command's group is gone. Safety: no write
/// lands after the takeover. Liveness: the taker gets the lease after the
/// TTL, whatever the paused run does. Authority: the taker's token is its
/// own; the run cannot release it.
async fn a_set_run_that_loses_one_lease_is_stopped_and_fenced_off_on_all() {
    let db = crate::common::new_db().await;
    let m = db.manager();
    db.execute(&["CREATE TABLE log (token bigint NOT NULL)"])
        .await;
    let outcomes = std::env::temp_dir().join(format!("pglease-cli-set-{}", db.name()));
    let _ = std::fs::remove_file(&outcomes);
    let script = format!(
        "echo pid:$$ >> {f}; \
         while true; do \
           if psql \"$PGLEASE_DATABASE_URL\" -qAt -v ON_ERROR_STOP=1 \
                -c \"BEGIN; SELECT pglease.assert_held('$PGLEASE_NAME_1', $PGLEASE_TOKEN_1); \
                     SELECT pglease.assert_held('$PGLEASE_NAME_2', $PGLEASE_TOKEN_2); \
                     INSERT INTO log (token) VALUES ($PGLEASE_TOKEN_2); COMMIT;\" \
                >/dev/null 2>&1; \
           then echo ok >> {f}; else echo rejected >> {f}; fi; \
           sleep 0.05; \
         done",
        f = outcomes.display()
    );
    let run = command(
        &db,
        &[
            "run", "a", "b", "--ttl", "1s", "--grace", "2s", "--", "sh", "-c", &script,
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start pglease run");
    let pid = Pid::from_raw(i32::try_from(run.id()).expect("a pid"));
    poll_until("the command's first fenced write", BOUND, || async {
        read(&outcomes).contains("ok")
    })
    .await;
    let (old_b, _) = row(&db, "b").await;

    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    let stopped = std::time::Instant::now();
    let taken = loop {
        match m
            .acquire(
                "b",
                AcquireOptions::ttl(Duration::from_secs(600)).holder("B"),
            )
            .await
        {
            Ok(lease) => break lease,
            Err(pglease::Error::Held { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("B's acquire: {e}"),
        }
    };
    println!(
        "B took \"b\" {} ms after the run was paused (TTL 1 s)",
        stopped.elapsed().as_millis()
    );
    assert!(Some(taken.token()) > old_b);
    let written: i64 = sqlx::query_scalar("SELECT count(*) FROM log")
        .fetch_one(db.pool())
        .await
        .expect("count");
    let seen = read(&outcomes).len();
    poll_until(
        "a fenced write after the takeover to be refused",
        BOUND,
        || async { read(&outcomes)[seen..].contains("rejected") },
    )
    .await;

    kill(pid, Signal::SIGCONT).expect("SIGCONT");
    let out = wait_bounded_output(run).await;
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    // Both deadlines have passed by now: the run names the first it finds.
    assert!(
        stderr(&out).contains(") lost: "),
        "names a lease lost: {}",
        stderr(&out)
    );
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
        "a write under an old token landed after the takeover"
    );
    // B keeps "b"; "a" is no longer held by the run.
    assert_eq!(row(&db, "b").await, (Some(taken.token()), true));
    assert!(!row(&db, "a").await.1, "the run left \"a\" held");
    let _ = std::fs::remove_file(&outcomes);
}

/// One lease of a running set ended by an administrator (force-release):
/// the run learns at its next renewal, stops its command, exits 4 naming
/// that lease, and gives back the other one at once instead of leaving it
/// to its TTL.
async fn a_set_run_stops_when_any_one_lease_ends() {
    let db = crate::common::new_db().await;
    let stop = std::env::temp_dir().join(format!("pglease-cli-set-stop-{}", db.name()));
    let script = crate::common::stop_recorder(&stop);
    let run = command(
        &db,
        &[
            "run", "a", "b", "c", "--ttl", "3s", "--", "sh", "-c", &script,
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start pglease run");
    poll_until("the set to be held", BOUND, || async {
        row(&db, "c").await.1
    })
    .await;
    let forced = pglease(&db, &["force-release", "b", "--reason", "test"]);
    assert_eq!(code(&forced), 0, "{}", stderr(&forced));
    let at = chrono::Utc::now();
    let out = wait_bounded_output(run).await;
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("lease \"b\""),
        "names the lease lost: {}",
        stderr(&out)
    );
    let stopped = crate::common::stopped_at(&stop);
    println!(
        "the command was stopped {} ms after \"b\" was forced (TTL 3 s, renewed every 1 s)",
        (stopped - at).num_milliseconds()
    );
    for name in ["a", "b", "c"] {
        assert!(!row(&db, name).await.1, "{name} left held");
    }
    let history = pglease(&db, &["history", "a", "--json"]);
    assert!(
        stdout(&history).contains("released"),
        "{}",
        stdout(&history)
    );
}

/// A name granted to another role refuses the whole set before anything
/// is taken: exit 5 (a privilege is missing), the other name untouched.
async fn a_name_granted_to_another_role_refuses_the_set() {
    let db = crate::common::new_db().await;
    let (app, owner) = (format!("app_{}", db.name()), format!("own_{}", db.name()));
    db.scratch_roles(&[&app, &owner]).await;
    db.execute(&[
        format!("CREATE ROLE {app} LOGIN"),
        format!("CREATE ROLE {owner} LOGIN"),
        format!("GRANT USAGE ON SCHEMA pglease TO {app}"),
        format!("GRANT SELECT ON pglease.status, pglease.history TO {app}"),
        format!("SELECT pglease.grant_names('billing/', '{owner}')"),
    ])
    .await;
    let before = db.state().await;
    let out = Command::new(BIN)
        .args(["--database-url", &db.url_for(&app, "unused")])
        .args(["run", "open", "billing/x", "--ttl", "1m", "--", "true"])
        .output()
        .expect("run pglease");
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(stderr(&out).contains("billing/x"), "{}", stderr(&out));
    assert_eq!(db.state().await, before, "a refused set changed something");
}

/// What cannot work with several names exits 2 before connecting (the
/// URL's port is closed): a name given twice, more than 100 names, and
/// the single-lease options --limit and --session-bound; --fair without
/// --wait; a CMD without its `--` (a hint).
async fn several_names_are_checked_before_connecting() {
    let too_many: Vec<String> = (0..=pglease::limits::MAX_SET_NAMES)
        .map(|i| format!("n{i}"))
        .collect();
    let mut many = vec!["run"];
    many.extend(too_many.iter().map(String::as_str));
    many.extend(["--ttl", "1s", "--", "true"]);
    for (args, says) in [
        (
            &["run", "a", "b", "a", "--ttl", "1s", "--", "true"][..],
            "NAME \"a\" is given twice",
        ),
        (
            &["run", "a", "b", "--limit", "2", "--ttl", "1s", "--", "true"],
            "--limit takes one NAME, not several",
        ),
        (
            &[
                "run",
                "a",
                "b",
                "--session-bound",
                "--ttl",
                "1s",
                "--",
                "true",
            ],
            "--session-bound takes one NAME, not several",
        ),
        (
            &many,
            "101 names given; at most 100 leases are taken at once",
        ),
        (
            &["run", "a", "--fair", "--ttl", "1s", "--", "true"],
            "--fair needs --wait",
        ),
        // The `--` left out: the hint says so.
        (
            &["run", "job", "--ttl", "1s", "./deploy.sh"],
            "hint: put `--` before the command",
        ),
    ] {
        let out = Command::new(BIN)
            .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
            .args(args)
            .output()
            .expect("run");
        let said = stderr(&out);
        assert_eq!(code(&out), 2, "{said}");
        assert!(said.contains(says), "{said}");
        assert!(said.contains("Usage: pglease run"), "{said}");
    }
}

/// `run --fair`: two runs waiting for a held lease are served in the
/// order they joined the line, each told its position on stderr; a third
/// with `--max-waiting 2` exits 3 without joining a line that two wait in.
async fn fair_runs_are_served_in_turn_and_told_their_position() {
    let db = crate::common::new_db().await;
    let m = db.manager();
    let held = m
        .acquire(
            "f",
            AcquireOptions::ttl(Duration::from_secs(60)).holder("H"),
        )
        .await
        .expect("acquire");
    let said = |k: usize| std::env::temp_dir().join(format!("pglease-fair-{k}-{}", db.name()));
    let fair_run = |k: usize| {
        let file = std::fs::File::create(said(k)).expect("a file for stderr");
        command(
            &db,
            &[
                "run",
                "f",
                "--ttl",
                "10s",
                "--wait",
                "30s",
                "--fair",
                "--",
                "sh",
                "-c",
                "echo $PGLEASE_TOKEN",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(file)
        .spawn()
        .expect("start pglease run")
    };
    let told = |k: usize, what: &'static str| {
        let path = said(k);
        async move {
            poll_until(what, BOUND, || async { read(&path).contains(what) }).await;
        }
    };
    let in_line = |n: usize| {
        let m = m.clone();
        async move {
            poll_until(&format!("{n} in line"), BOUND, || async {
                m.line("f").await.expect("line").len() == n
            })
            .await;
        }
    };
    let first = fair_run(1);
    in_line(1).await;
    told(1, "\"f\": 1st of 1 in line").await;
    let second = fair_run(2);
    in_line(2).await;
    told(2, "\"f\": 2nd of 2 in line").await;
    let full = pglease(
        &db,
        &[
            "run",
            "f",
            "--ttl",
            "10s",
            "--wait",
            "30s",
            "--fair",
            "--max-waiting",
            "2",
            "--",
            "true",
        ],
    );
    assert_eq!(code(&full), 3, "{}", stderr(&full));
    assert!(stderr(&full).contains("is full"), "{}", stderr(&full));
    m.release(&held).await.expect("release");
    let (first, second) = (
        wait_bounded_output(first).await,
        wait_bounded_output(second).await,
    );
    assert_eq!((code(&first), code(&second)), (0, 0), "{}", read(&said(2)));
    let token =
        |out: &std::process::Output| -> Token { stdout(out).trim().parse().expect("a token") };
    assert!(token(&first) < token(&second), "served out of turn");
    for k in [1, 2] {
        let _ = std::fs::remove_file(said(k));
    }
    // Free, but someone (alive, never trying again) waits in line for 2 s:
    // a waiting run waits for its turn instead of exiting 3 at once.
    let mut other = db.connect().await.expect("connect");
    sqlx::query("SELECT pglease.enqueue('{f}', 'frozen', '2 s')")
        .execute(&mut other)
        .await
        .expect("enqueue");
    let out = pglease(
        &db,
        &[
            "run", "f", "--ttl", "10s", "--wait", "30s", "--fair", "--", "true",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("wait in line"), "{}", stderr(&out));
}

/// Waits for `child` (its output piped) to exit within [`BOUND`], and
/// returns its output.
async fn wait_bounded_output(child: std::process::Child) -> std::process::Output {
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    let task = tokio::task::spawn_blocking(move || child.wait_with_output());
    match tokio::time::timeout(BOUND, task).await {
        Ok(output) => output.expect("join").expect("wait for pglease"),
        Err(_) => {
            let _ = kill(pid, Signal::SIGKILL);
            panic!("pglease did not exit within {BOUND:?}")
        }
    }
}

/// `set-fair NAME on`: a plain `run --wait` (no `--fair`) takes a place
/// in NAME's line and is served when the holder releases; a setting other
/// than on or off exits 2.
async fn set_fair_makes_plain_runs_wait_in_line() {
    let db = crate::common::new_db().await;
    let out = pglease(&db, &["set-fair", "q", "on"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token = crate::common::acquired(&db, &["q", "--ttl", "1m", "--holder", "H"]);
    let run = crate::common::command(
        &db,
        &[
            "run", "q", "--ttl", "5s", "--wait", "30s", "--holder", "W", "--", "true",
        ],
    )
    .stdout(Stdio::null())
    .spawn()
    .expect("start the run");
    poll_until("W to wait in line", BOUND, || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pglease.line WHERE name = 'q' AND holder = 'W')",
        )
        .fetch_one(db.pool())
        .await
        .expect("read the line")
    })
    .await;
    let out = pglease(&db, &["release", "q", "--token", &token]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let status = crate::common::wait_bounded(run).await;
    assert_eq!(status.code(), Some(0), "W ran in its turn");
    let out = pglease(&db, &["set-fair", "q", "maybe"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

pglease_formations::tests![
    run_takes_every_lease_or_none_and_hands_each_token_over,
    a_set_run_that_loses_one_lease_is_stopped_and_fenced_off_on_all,
    a_set_run_stops_when_any_one_lease_ends,
    a_name_granted_to_another_role_refuses_the_set,
    several_names_are_checked_before_connecting,
    fair_runs_are_served_in_turn_and_told_their_position,
    set_fair_makes_plain_runs_wait_in_line,
];
