//! `pglease leader`, `observe`, `step-down` and `elect` driven as a user
//! would, several `elect` processes campaigning for one name: a step-down
//! request hands over; a leader killed with SIGKILL is replaced within the
//! TTL and the takeover bound while its orphaned command's writes are
//! refused; a leader stopped with SIGSTOP loses, its command's writes are
//! refused, and once resumed it stops its command and campaigns again; a
//! signal stops the command and resigns; a failing command is restarted a
//! bounded number of times. Every test checks, in commit order, that no
//! term wrote after a later one began.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::{
    BOUND, code, command, groups, json, pglease, read, stderr, stdout, wait_bounded,
};
use crate::common::{TestDb, poll_until};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pglease::AcquireOptions;

const TTL: &str = "1s";

/// A log table that only the holder of lease `svc` may write.
async fn create_log(db: &TestDb) {
    sqlx::query(
        "CREATE TABLE log (id bigserial PRIMARY KEY, token bigint NOT NULL, \
                           at timestamptz DEFAULT clock_timestamp())",
    )
    .execute(db.pool())
    .await
    .expect("create the log");
    db.manager()
        .admin()
        .protect("log", "svc")
        .await
        .expect("protect");
}

/// In commit order (ids are drawn inside the fenced transactions), tokens
/// never go back: no term wrote after a later one began.
async fn assert_terms_in_order(db: &TestDb) {
    let tokens: Vec<i64> = sqlx::query_scalar("SELECT token FROM log ORDER BY id")
        .fetch_all(db.pool())
        .await
        .expect("read the log");
    assert!(tokens.windows(2).all(|w| w[0] <= w[1]), "{tokens:?}");
}

/// A file for one candidate's command to report to.
fn outcomes(db: &TestDb, who: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("pglease-elect-{}-{who}", db.name()));
    let _ = std::fs::remove_file(&path);
    path
}

/// `pglease elect svc --holder WHO` running the fenced writer.
fn elect(db: &TestDb, who: &str, outcomes: &Path) -> Child {
    let script = crate::common::fenced_writer(outcomes);
    let mut args = vec![
        "elect", "svc", "--ttl", TTL, "--grace", "2s", "--holder", who, "--value",
    ];
    let value = format!("{who}.internal:8080");
    args.push(&value);
    args.extend_from_slice(&["--", "sh", "-c", &script]);
    command(db, &args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pglease elect")
}

/// Who leads `svc` now, as `pglease leader --json` says.
fn leader(db: &TestDb) -> Option<String> {
    let out = pglease(db, &["leader", "svc", "--json"]);
    match code(&out) {
        0 => json(&out)["holder"].as_str().map(str::to_owned),
        3 => None,
        other => panic!("leader exited {other}: {}", stderr(&out)),
    }
}

async fn until_leader(db: &TestDb, what: &str, is: impl Fn(&str) -> bool) -> String {
    let mut found = String::new();
    poll_until(what, BOUND, || {
        let now = leader(db);
        let ok = now.as_deref().is_some_and(&is);
        if ok {
            found = now.unwrap_or_default();
        }
        async move { ok }
    })
    .await;
    found
}

/// Waits until every process group a command reported is gone.
async fn until_commands_gone(outcomes: &Path) {
    for group in groups(outcomes) {
        poll_until("a command's process group to end", BOUND, || async {
            kill(Pid::from_raw(-group), None).is_err()
        })
        .await;
    }
}

fn kill_commands(outcomes: &Path) {
    for group in groups(outcomes) {
        let _ = kill(Pid::from_raw(-group), Signal::SIGKILL);
    }
}

async fn leader_observe_and_step_down_commands_and_the_value_round_trip() {
    let db = crate::common::new_db().await;
    // Nobody leads: exit 3, also for a step-down request.
    let out = pglease(&db, &["leader", "svc"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    let out = pglease(&db, &["step-down", "svc"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));

    let mut observer = command(&db, &["observe", "svc"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start pglease observe");
    let (lines, events) = std::sync::mpsc::channel::<serde_json::Value>();
    let reader = BufReader::new(observer.stdout.take().expect("stdout"));
    std::thread::spawn(move || {
        for line in reader.lines().map_while(Result::ok) {
            let _ = lines.send(serde_json::from_str(&line).expect("a JSON line"));
        }
    });
    let next = || {
        events
            .recv_timeout(BOUND)
            .expect("an event within the bound")
    };
    assert_eq!(next()["event"], "current");

    // A value set in SQL is read by the command line and by Rust.
    let token: i64 = sqlx::query_scalar(
        "SELECT a.token FROM pglease.acquire('svc', 'sql-holder', '30s') AS a, \
                LATERAL pglease.set_value('svc', a.token, '10.1.1.1:5000') AS p",
    )
    .fetch_one(db.pool())
    .await
    .expect("acquire and set_value in SQL");
    let out = pglease(&db, &["leader", "svc"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!("sql-holder\ttoken {token}\t10.1.1.1:5000\n")
    );
    let status = json(&pglease(&db, &["leader", "svc", "--json"]));
    assert_eq!(status["value"], "10.1.1.1:5000");
    assert_eq!(
        db.manager().inspect("svc").await.unwrap().value.as_deref(),
        Some("10.1.1.1:5000")
    );
    let out = pglease(&db, &["step-down", "svc", "--by", "ops"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let status = json(&pglease(&db, &["leader", "svc", "--json"]));
    assert_eq!(status["step_down_requested_by"], "ops");
    let released: bool = sqlx::query_scalar("SELECT pglease.release('svc', $1)")
        .bind(token)
        .fetch_one(db.pool())
        .await
        .expect("release");
    assert!(released);

    // A value set by the command line is read in SQL.
    let out = pglease(
        &db,
        &[
            "acquire",
            "svc",
            "--ttl",
            "30s",
            "--holder",
            "cli",
            "--value",
            "10.2.2.2:6000",
            "--json",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let second = json(&out)["token"].as_i64().expect("a token");
    let value: Option<String> =
        sqlx::query_scalar("SELECT value FROM pglease.status WHERE name = 'svc'")
            .fetch_one(db.pool())
            .await
            .expect("read the value in SQL");
    assert_eq!(value.as_deref(), Some("10.2.2.2:6000"));

    // The observer saw all of it, in order.
    let expected = [
        ("acquired", token),
        ("value", token),
        ("step_down_requested", token),
        ("released", token),
        ("acquired", second),
        ("value", second),
    ];
    for (event, token) in expected {
        let got = next();
        assert_eq!(
            (got["event"].as_str(), got["token"].as_i64()),
            (Some(event), Some(token)),
            "{got}"
        );
        if event == "value" && token == second {
            assert_eq!(got["value"], "10.2.2.2:6000");
        }
    }
    kill(Pid::from_raw(observer.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    assert_eq!(wait_bounded(observer).await.code(), Some(0));
}

async fn elect_hands_over_on_request_on_sigkill_and_resigns_on_sigterm() {
    let db = crate::common::new_db().await;
    create_log(&db).await;
    let files = [outcomes(&db, "e0"), outcomes(&db, "e1")];
    let mut electors = [
        Some(elect(&db, "e0", &files[0])),
        Some(elect(&db, "e1", &files[1])),
    ];
    let first = until_leader(&db, "a leader", |_| true).await;
    let i = usize::from(first == "e1");
    poll_until("the leader's first fenced write", BOUND, || async {
        read(&files[i]).contains("ok")
    })
    .await;

    // Asked to step down, the leader stops its command and the other
    // leads.
    let out = pglease(&db, &["step-down", "svc", "--by", "deploy"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let second = until_leader(&db, "the other to lead", |h| h != first).await;
    until_commands_gone(&files[i]).await;
    let j = 1 - i;
    assert_eq!(second, format!("e{j}"));
    let status = json(&pglease(&db, &["leader", "svc", "--json"]));
    assert_eq!(status["value"], format!("e{j}.internal:8080"));
    assert!(status["step_down_requested_by"].is_null(), "{status}");

    // SIGKILL the leader: its command is orphaned and goes on writing,
    // refused once the term has expired; the other leads within the TTL
    // and the takeover bound.
    poll_until("the second leader's first fenced write", BOUND, || async {
        read(&files[j]).contains("ok")
    })
    .await;
    let killed = Instant::now();
    let leader = electors[j].take().expect("the leader runs");
    kill(Pid::from_raw(leader.id() as i32), Signal::SIGKILL).expect("SIGKILL");
    let _ = wait_bounded(leader).await;
    until_leader(&db, "a new leader after SIGKILL", |h| h == first).await;
    let took = killed.elapsed();
    eprintln!("new leader {took:?} after SIGKILL (TTL {TTL})");
    assert!(took < Duration::from_secs(1 + 2 + 5), "took {took:?}");
    let seen = read(&files[j]).len();
    poll_until("the orphan's write to be refused", BOUND, || async {
        read(&files[j])[seen..].contains("rejected")
    })
    .await;
    kill_commands(&files[j]);
    until_commands_gone(&files[j]).await;

    // SIGTERM: the command stops, the lease is released at once, exit
    // 128 + 15.
    let last = electors[i].take().expect("the new leader runs");
    kill(Pid::from_raw(last.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    assert_eq!(wait_bounded(last).await.code(), Some(143));
    until_commands_gone(&files[i]).await;
    let status = json(&pglease(&db, &["status", "svc", "--json"]));
    assert_eq!(status["held"], false, "{status}");
    assert!(
        status["holder"].is_null(),
        "released, not expired: {status}"
    );
    assert_terms_in_order(&db).await;
    for file in &files {
        let _ = std::fs::remove_file(file);
    }
}

/// `elect --prefer e1`: e0 leads alone; once e1 campaigns, e0 hands its
/// term over within about a second (its command stopped, e1's started
/// under a new token); no term wrote after a later one began.
async fn elect_hands_over_to_the_preferred_candidate() {
    let db = crate::common::new_db().await;
    create_log(&db).await;
    let files = [outcomes(&db, "p0"), outcomes(&db, "p1")];
    let prefer = |who: &str, file: &Path| {
        let script = crate::common::fenced_writer(file);
        command(
            &db,
            &[
                "elect", "svc", "--ttl", "5s", "--grace", "2s", "--holder", who, "--prefer", "p1",
                "--", "sh", "-c", &script,
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pglease elect")
    };
    let first = prefer("p0", &files[0]);
    until_leader(&db, "p0 to lead", |h| h == "p0").await;
    poll_until("p0's first fenced write", BOUND, || async {
        read(&files[0]).contains("ok")
    })
    .await;
    let joined = Instant::now();
    let second = prefer("p1", &files[1]);
    until_leader(&db, "the preferred p1 to lead", |h| h == "p1").await;
    let took = joined.elapsed();
    eprintln!("the preferred candidate led {took:?} after it started");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    until_commands_gone(&files[0]).await;
    poll_until("p1's first fenced write", BOUND, || async {
        read(&files[1]).contains("ok")
    })
    .await;
    for elector in [first, second] {
        kill(Pid::from_raw(elector.id() as i32), Signal::SIGTERM).expect("SIGTERM");
        let _ = wait_bounded(elector).await;
    }
    until_commands_gone(&files[1]).await;
    assert_terms_in_order(&db).await;
    for file in &files {
        let _ = std::fs::remove_file(file);
    }
}

async fn a_stopped_leader_loses_its_writes_are_refused_and_it_campaigns_again() {
    let db = crate::common::new_db().await;
    create_log(&db).await;
    let files = [outcomes(&db, "e0"), outcomes(&db, "e1")];
    let mut electors = [elect(&db, "e0", &files[0]), elect(&db, "e1", &files[1])];
    let first = until_leader(&db, "a leader", |_| true).await;
    let i = usize::from(first == "e1");
    poll_until("the leader's first fenced write", BOUND, || async {
        read(&files[i]).contains("ok")
    })
    .await;
    let stopped = Pid::from_raw(electors[i].id() as i32);
    kill(stopped, Signal::SIGSTOP).expect("SIGSTOP");
    until_leader(&db, "the other to lead", |h| h != first).await;
    // The stopped leader's command runs on, and its writes are refused.
    let seen = read(&files[i]).len();
    poll_until(
        "the stopped leader's write to be refused",
        BOUND,
        || async { read(&files[i])[seen..].contains("rejected") },
    )
    .await;
    // Resumed, it learns that it lost, stops its command, and campaigns.
    kill(stopped, Signal::SIGCONT).expect("SIGCONT");
    until_commands_gone(&files[i]).await;
    assert!(
        electors[i].try_wait().expect("try_wait").is_none(),
        "it campaigns again"
    );
    // It leads again once the other resigns.
    kill(Pid::from_raw(electors[1 - i].id() as i32), Signal::SIGTERM).expect("SIGTERM");
    until_leader(&db, "the first to lead again", |h| h == first).await;
    for elector in &mut electors {
        let _ = kill(Pid::from_raw(elector.id() as i32), Signal::SIGTERM);
    }
    for elector in electors {
        let _ = wait_bounded(elector).await;
    }
    for file in &files {
        until_commands_gone(file).await;
        let _ = std::fs::remove_file(file);
    }
    assert_terms_in_order(&db).await;
}

async fn elect_without_the_schema_exits_5_and_a_bad_requester_exits_2() {
    let db = crate::common::empty_db().await;
    let out = pglease(&db, &["elect", "svc", "--ttl", "5s", "--", "true"]);
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("schema is missing or out of date")
            && stderr(&out).contains("run `pglease migrate` first")
            // Which database, on which server.
            && stderr(&out).contains(&format!("(database \"{}\" on ", db.name())),
        "{}",
        stderr(&out)
    );
    let out = pglease(&db, &["step-down", "svc", "--by", ""]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("--by"), "{}", stderr(&out));
}

async fn a_failing_command_is_restarted_a_bounded_number_of_times() {
    let db = crate::common::new_db().await;
    let runs = outcomes(&db, "restarts");
    let script = format!("echo run >> {}; exit 7", runs.display());
    let out = pglease(
        &db,
        &[
            "elect",
            "svc",
            "--ttl",
            "5s",
            "--max-restarts",
            "2",
            "--restart-delay",
            "10ms",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert_eq!(
        read(&runs).lines().count(),
        3,
        "the first run and two restarts"
    );
    // It resigned: the lease is free at once.
    let lease = db
        .manager()
        .acquire("svc", AcquireOptions::ttl(Duration::from_secs(5)))
        .await;
    assert!(lease.is_ok(), "{lease:?}");
    // A command that succeeds ends the election with status 0.
    let out = pglease(&db, &["elect", "job", "--ttl", "5s", "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let _ = std::fs::remove_file(&runs);
}

pglease_formations::tests![
    leader_observe_and_step_down_commands_and_the_value_round_trip(2),
    elect_hands_over_on_request_on_sigkill_and_resigns_on_sigterm(2),
    a_stopped_leader_loses_its_writes_are_refused_and_it_campaigns_again(2),
    elect_without_the_schema_exits_5_and_a_bad_requester_exits_2,
    a_failing_command_is_restarted_a_bounded_number_of_times(2),
    elect_hands_over_to_the_preferred_candidate(2),
];
