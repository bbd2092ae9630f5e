//! `pglease demo`, in a scratch database of the server, and on a
//! throwaway cluster when no server answers.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{BIN, code, pglease, stderr, stdout};
use pglease_formations::SetupError;

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
        "class=\"pause\"",
        "class=\"marker refused\"",
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

/// The timeline of the demo's paused holder, laid out by headless
/// Chromium: A's term, A's pause over its expiry, B's takeover after it,
/// and A's refused write after that, on A's row. Reported ignored without
/// chromium.
async fn the_demos_timeline_shows_the_pause_the_takeover_and_the_refused_write()
-> Result<(), SetupError> {
    crate::history::needs_chromium()?;
    let db = crate::common::new_db().await;
    let out = pglease(&db, &["demo"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let saved = text
        .split_whitespace()
        .skip_while(|w| *w != "--from")
        .nth(1)
        .expect("the demo says how to draw its timeline")
        .to_owned();
    let dir = std::env::temp_dir().join(format!("pglease-demo-page-{}", db.name()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let page = dir.join("demo.html");
    let out = pglease(
        &db,
        &["history", "--from", &saved, "--html", &page.display().to_string()],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let _ = std::fs::remove_file(&saved);
    let measured = dir.join("measured.html");
    let html = std::fs::read_to_string(&page).expect("the page");
    std::fs::write(
        &measured,
        html.replace(
            "</body>",
            &format!("<script>{}</script></body>", crate::history::MEASURE),
        ),
    )
    .expect("write");
    let out = crate::history::chromium(
        &dir.join("profile"),
        &["--dump-dom", &format!("file://{}", measured.display())],
    )
    .await;
    let lines = crate::history::measures(&stdout(&out));
    let find = |what: &str, holder: &str| -> (Vec<String>, [f64; 3]) {
        let l = lines
            .iter()
            .find(|l| l[0] == what && l[1] == holder)
            .unwrap_or_else(|| panic!("no {what} of {holder}: {lines:?}"));
        (l.clone(), [4, 5, 6].map(|i| l[i].parse().expect("a number")))
    };
    let (a_term, [a_left, a_top, a_width]) = find("term", "A");
    assert_eq!((a_term[2].as_str(), a_term[3].as_str()), ("1", "expired"));
    let (_, [pause_left, pause_top, pause_width]) = find("pause", "A");
    let (_, [takeover_left, takeover_top, _]) = find("marker-takeover", "B");
    let (_, [refused_left, refused_top, _]) = find("marker-refused", "A");
    let (b_term, [b_left, _, _]) = find("term", "B");
    assert_eq!(b_term[2], "2", "{lines:?}");
    let a_end = a_left + a_width;
    // The pause starts inside A's term and lasts past its expiry, past
    // B's takeover; the refused write comes after the takeover, on A's row
    // (above B's).
    assert!(pause_left > a_left && pause_left < a_end, "{lines:?}");
    assert!(pause_left + pause_width > b_left, "{lines:?}");
    assert!(takeover_left < b_left && b_left >= a_end, "{lines:?}");
    assert!(refused_left > b_left, "{lines:?}");
    assert!(pause_top < takeover_top && refused_top < takeover_top && a_top < takeover_top);
    assert!((pause_top - a_top).abs() < 20.0, "{lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

pglease_formations::tests![
    demo_runs_in_a_scratch_database_and_exits_0,
    the_demos_timeline_shows_the_pause_the_takeover_and_the_refused_write,
    demo_without_a_server_runs_on_a_throwaway_cluster_and_removes_it,
];
