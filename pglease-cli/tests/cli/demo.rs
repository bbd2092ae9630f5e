//! `pglease demo`, in a scratch database of the server, and on a
//! throwaway cluster when no server answers.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{BIN, code, pglease, stderr, stdout};

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
    // Scenario (a)'s history is saved, to be drawn without the database:
    // A's term expired, A unaware until B took over, B's term.
    let saved = text
        .split_whitespace()
        .skip_while(|w| *w != "--from")
        .nth(1)
        .expect("the demo says how to draw its timeline");
    let out = pglease(&db, &["history", "--from", saved, "--svg", "-"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let drawn = stdout(&out);
    for part in [
        "class=\"term expired\"",
        "class=\"unaware-term\"",
        "class=\"marker takeover\"",
        "class=\"term released\"",
    ] {
        assert!(drawn.contains(part), "{part}: {drawn}");
    }
    let _ = std::fs::remove_file(saved);
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

pglease_formations::tests![
    demo_runs_in_a_scratch_database_and_exits_0,
    demo_without_a_server_runs_on_a_throwaway_cluster_and_removes_it,
];
