//! `pglease share`: members of a lease group each running one command per
//! partition they own, a member stopped by SIGTERM handing its partitions
//! over, `status --group` showing who owns what, a command that exits by
//! itself started again, and bad input refused before connecting.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::{
    BOUND, TestDb, code, command, json, pglease, poll_until, read, stderr, stdout, wait_bounded,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const GROUP: &str = "work";

/// A file of its own for one test's commands to write to, removed first.
fn scratch(tag: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("pglease-share-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// CMD for `share`: records `start K TOKEN MEMBER` in `log`, runs until
/// SIGTERM, then records `term K TOKEN MEMBER` and exits 0. It also ends
/// when its `share` is gone (a test that failed half-way leaves nothing
/// running).
fn recorder(log: &Path) -> String {
    let log = log.display();
    format!(
        "line=\"$PGLEASE_PARTITION $PGLEASE_TOKEN $PGLEASE_MEMBER\"; \
         trap 'echo \"term $line\" >> {log}; exit 0' TERM; \
         echo \"start $line\" >> {log}; \
         while kill -0 $PPID 2>/dev/null; do sleep 0.05; done"
    )
}

/// Starts `share GROUP --partitions 4` as member `member`, with CMD
/// [`recorder`]; stderr piped.
fn start_member(db: &TestDb, member: &str, log: &Path) -> Member {
    let script = recorder(log);
    command(
        db,
        &[
            "share",
            GROUP,
            "--partitions",
            "4",
            "--ttl",
            "10s",
            "--grace",
            "5s",
            "--member",
            member,
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .map(|child| Member(Some(child)))
    .expect("start pglease share")
}

/// A partition's CMD as the log has it: partition, token, member.
type Run = (u32, i64, String);

/// The CMDs running now by the log (started, not yet told to stop).
fn running(log: &Path) -> BTreeSet<Run> {
    let mut started = BTreeSet::new();
    let mut ended = BTreeSet::new();
    for line in read(log).lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [what, k, token, member] = words[..] else {
            continue;
        };
        let (Ok(k), Ok(token)) = (k.parse(), token.parse()) else {
            continue;
        };
        let run = (k, token, member.to_owned());
        match what {
            "start" => started.insert(run),
            _ => ended.insert(run),
        };
    }
    started.difference(&ended).cloned().collect()
}

/// Each partition's owner now, by the database: partition to (member,
/// token); only partitions with a valid owner that has picked them up
/// (none before the group exists).
async fn owners(db: &TestDb) -> BTreeMap<u32, (String, i64)> {
    let Ok(status) = db.manager().group(GROUP).await else {
        return BTreeMap::new();
    };
    status
        .owners
        .iter()
        .enumerate()
        .filter_map(|(k, o)| {
            o.as_ref()
                .filter(|o| !o.handed)
                .map(|o| (k as u32, (o.member.clone(), o.token.get())))
        })
        .collect()
}

/// Whether the running CMDs are exactly one per partition, each under
/// its owner's token, as the database has it, with `expected` as the
/// owners' names.
async fn settled(db: &TestDb, log: &Path, expected: &[(&str, usize)]) -> bool {
    let owners = owners(db).await;
    if owners.len() != expected.iter().map(|(_, n)| n).sum::<usize>() {
        return false;
    }
    for (member, count) in expected {
        if owners.values().filter(|(m, _)| m == member).count() != *count {
            return false;
        }
    }
    let wanted: BTreeSet<Run> = owners
        .iter()
        .map(|(k, (member, token))| (*k, *token, member.clone()))
        .collect();
    running(log) == wanted
}

/// Waits for a `share` to exit (bounded); its status and its stderr.
async fn exited(mut child: Child) -> (std::process::ExitStatus, String) {
    let pipe = child.stderr.take();
    let status = wait_bounded(child).await;
    let mut err = String::new();
    if let Some(mut pipe) = pipe {
        std::io::Read::read_to_string(&mut pipe, &mut err).expect("read stderr");
    }
    (status, err)
}

/// A running `share`, sent SIGTERM if the test ends before it does.
struct Member(Option<Child>);

impl Member {
    fn pid(&self) -> Pid {
        Pid::from_raw(self.0.as_ref().map_or(0, |c| c.id() as i32))
    }

    fn take(mut self) -> Child {
        self.0.take().expect("running")
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let _ = child.wait();
        }
    }
}

async fn two_members_share_four_partitions_and_sigterm_hands_over() {
    let db = crate::common::new_db().await;
    let log = scratch("two");
    let a = start_member(&db, "a", &log);
    poll_until("a to run all 4 partitions", BOUND, || {
        settled(&db, &log, &[("a", 4)])
    })
    .await;
    let b = start_member(&db, "b", &log);
    poll_until("a and b to run 2 partitions each", BOUND, || {
        settled(&db, &log, &[("a", 2), ("b", 2)])
    })
    .await;
    let now = running(&log);
    let of = |member: &str| -> BTreeMap<u32, i64> {
        now.iter()
            .filter(|(_, _, m)| m == member)
            .map(|(k, t, _)| (*k, *t))
            .collect()
    };
    let (a_runs, b_runs) = (of("a"), of("b"));
    assert_eq!(a_runs.len(), 2, "{now:?}");
    assert_eq!(b_runs.len(), 2, "{now:?}");
    assert!(
        a_runs.keys().all(|k| !b_runs.contains_key(k)),
        "a partition runs twice: {now:?}"
    );

    // status --group: a line per member with its partitions, and the free.
    let shown = pglease(&db, &["status", "--group", GROUP]);
    assert_eq!(code(&shown), 0, "{}", stderr(&shown));
    let text = stdout(&shown);
    assert!(text.starts_with("MEMBER"), "{text}");
    for member in ["a", "b"] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{member} "))),
            "{member} not shown: {text}"
        );
    }
    assert!(
        text.lines().any(|l| l.starts_with("(free)") && l.ends_with('-')),
        "{text}"
    );
    let shown = pglease(&db, &["status", "--group", GROUP, "--json"]);
    assert_eq!(code(&shown), 0, "{}", stderr(&shown));
    let value = json(&shown);
    assert_eq!(value["partitions"], 4, "{value}");
    let members: Vec<&str> = value["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert_eq!(members, ["a", "b"], "{value}");
    let owners = value["owners"].as_array().expect("owners");
    assert_eq!(owners.len(), 4, "{value}");
    for (k, token) in a_runs.iter().chain(&b_runs) {
        let owner = &owners[*k as usize];
        assert_eq!(owner["token"], *token, "{value}");
        assert_eq!(owner["name"], format!("{GROUP}/{k}"), "{value}");
    }
    assert_eq!(value["free"], serde_json::json!([]), "{value}");
    // The overview lists the group after the leases.
    let overview = stdout(&pglease(&db, &["status"]));
    assert!(
        overview
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == [GROUP, "4", "2", "4"]),
        "{overview}"
    );

    // A member name in use: exit 3, no command run.
    let again = pglease(
        &db,
        &[
            "share",
            GROUP,
            "--partitions",
            "4",
            "--ttl",
            "5s",
            "--member",
            "a",
            "--",
            "sh",
            "-c",
            "exit 9",
        ],
    );
    assert_eq!(code(&again), 3, "{}", stderr(&again));
    assert!(stderr(&again).contains("work/members/a"), "{}", stderr(&again));

    // SIGTERM to a: its commands get SIGTERM, it leaves and exits 0, and b
    // takes over all four partitions, a's under new, larger tokens.
    let sent = Instant::now();
    kill(a.pid(), Signal::SIGTERM).expect("SIGTERM");
    poll_until("b to run all 4 partitions", BOUND, || {
        settled(&db, &log, &[("b", 4)])
    })
    .await;
    let takeover = sent.elapsed();
    let (status, err) = exited(a.take()).await;
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains("left group \"work\""), "{err}");
    let record = read(&log);
    for (k, token) in &a_runs {
        assert!(
            record.contains(&format!("term {k} {token} a")),
            "a's command of partition {k} got no SIGTERM: {record}"
        );
    }
    let after = running(&log);
    for (k, token) in &a_runs {
        assert!(
            after.iter().any(|(pk, t, m)| pk == k && t > token && m == "b"),
            "partition {k} not taken over under a larger token: {after:?}"
        );
    }
    println!("b ran all 4 partitions {takeover:?} after the SIGTERM to a");
    // Handed over, not left to expire: well within the 10 s TTL.
    assert!(takeover < Duration::from_secs(5), "{takeover:?}");

    kill(b.pid(), Signal::SIGINT).expect("SIGINT");
    let (status, err) = exited(b.take()).await;
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(running(&log).is_empty(), "{}", read(&log));
    let left = db.manager().group(GROUP).await.expect("read the group");
    assert!(left.members.is_empty(), "{left:?}");
    let _ = std::fs::remove_file(&log);
}

/// A partition whose lease is lost (forced by an administrator) has its
/// command stopped; `share` goes on, takes the partition again under a new
/// token and starts a command for it once the old one has exited.
async fn a_lost_partition_stops_its_command_and_share_goes_on() {
    let db = crate::common::new_db().await;
    let log = scratch("lost");
    let a = start_member(&db, "a", &log);
    poll_until("a to run all 4 partitions", BOUND, || {
        settled(&db, &log, &[("a", 4)])
    })
    .await;
    let old = running(&log)
        .into_iter()
        .find(|(k, _, _)| *k == 1)
        .map(|(_, token, _)| token)
        .expect("partition 1 runs");
    let forced = pglease(
        &db,
        &["force-release", "work/1", "--reason", "share test"],
    );
    assert_eq!(code(&forced), 0, "{}", stderr(&forced));
    poll_until("partition 1 to run again under a new token", BOUND, || async {
        settled(&db, &log, &[("a", 4)]).await
            && running(&log).iter().any(|(k, t, _)| *k == 1 && *t > old)
    })
    .await;
    let record = read(&log);
    assert!(
        record.contains(&format!("term 1 {old} a")),
        "the lost partition's command got no SIGTERM: {record}"
    );
    // The old command had ended before the new one started.
    let lines: Vec<&str> = record.lines().collect();
    let ended = lines.iter().position(|l| *l == format!("term 1 {old} a"));
    let restarted = lines
        .iter()
        .position(|l| l.starts_with("start 1 ") && !l.starts_with(&format!("start 1 {old} ")));
    match (ended, restarted) {
        (Some(ended), Some(restarted)) => assert!(restarted > ended, "{record}"),
        _ => panic!("no stop and restart of partition 1: {record}"),
    }
    kill(a.pid(), Signal::SIGTERM).expect("SIGTERM");
    let (status, err) = exited(a.take()).await;
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains(&format!("lost partition 1 (token {old})")), "{err}");
    assert!(running(&log).is_empty(), "{}", read(&log));
    let _ = std::fs::remove_file(&log);
}

/// A command that exits by itself is started again after
/// `--restart-delay`, under the same token; a command that cannot be
/// started ends `share` with 127, after leaving the group.
async fn a_command_that_exits_is_started_again_and_one_that_cannot_start_exits_127() {
    let db = crate::common::new_db().await;
    let log = scratch("restart");
    let script = format!(
        "echo \"$PGLEASE_PARTITION $PGLEASE_TOKEN\" >> {}; exit 3",
        log.display()
    );
    let child = command(
        &db,
        &[
            "share",
            "once",
            "--partitions",
            "1",
            "--ttl",
            "5s",
            "--restart-delay",
            "50ms",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .stdin(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .map(|child| Member(Some(child)))
    .expect("start pglease share");
    poll_until("the command to run 3 times", BOUND, || async {
        read(&log).lines().count() >= 3
    })
    .await;
    kill(child.pid(), Signal::SIGTERM).expect("SIGTERM");
    let (status, err) = exited(child.take()).await;
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        err.contains("partition 0: the command exited with status 3; starting it again in 50ms (restart 2)"),
        "{err}"
    );
    let runs: BTreeSet<String> = read(&log).lines().map(str::to_owned).collect();
    assert_eq!(runs.len(), 1, "one token for every start: {runs:?}");

    let missing = pglease(
        &db,
        &[
            "share",
            "none",
            "--partitions",
            "2",
            "--ttl",
            "5s",
            "--",
            "/no/such/command",
        ],
    );
    assert_eq!(code(&missing), 127, "{}", stderr(&missing));
    let left = db.manager().group("none").await.expect("read the group");
    assert!(left.members.is_empty(), "{left:?}");
    let _ = std::fs::remove_file(&log);
}

/// Bad input exits 2 before anything connects (the URL leads nowhere).
async fn bad_share_input_exits_2_before_connecting() {
    // GROUP/9 is 256 bytes long.
    let long = "g".repeat(254);
    let cases: [&[&str]; 8] = [
        &["share", "g", "--partitions", "0", "--ttl", "5s", "--", "true"],
        &["share", "g", "--partitions", "x", "--ttl", "5s", "--", "true"],
        &["share", "g", "--partitions", "100001", "--ttl", "5s", "--", "true"],
        &["share", "g", "--partitions", "4", "--ttl", "5s"],
        &["share", "g", "--partitions", "4", "--ttl", "5", "--", "true"],
        &["share", "g", "--partitions", "4", "--ttl", "5s", "--grace", "0s", "--", "true"],
        &["share", &long, "--partitions", "10", "--ttl", "5s", "--", "true"],
        &["status", "job", "--group", "g"],
    ];
    for args in cases {
        let out = std::process::Command::new(crate::common::BIN)
            .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
            .args(args)
            .output()
            .expect("run pglease");
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).starts_with("pglease: "), "{args:?}: {}", stderr(&out));
    }
}

pglease_formations::tests![
    two_members_share_four_partitions_and_sigterm_hands_over,
    a_lost_partition_stops_its_command_and_share_goes_on,
    a_command_that_exits_is_started_again_and_one_that_cannot_start_exits_127,
    bad_share_input_exits_2_before_connecting,
];
