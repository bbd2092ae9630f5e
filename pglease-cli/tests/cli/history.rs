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
use pglease_formations::SetupError;

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
    // The command's own attempts after the force (none if the run stopped
    // it first: it may learn of the force before the next one) were
    // refused; a write under that token is refused, whoever sends it.
    eprintln!(
        "the command's writes refused after the force: {}",
        read(&outcomes).matches("rejected").count()
    );
    let stale = sqlx::query("SELECT pglease.assert_held('job', $1)")
        .bind(token)
        .execute(db.pool())
        .await;
    assert!(
        matches!(&stale, Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(pglease::sqlstate::NOT_HELD)),
        "{stale:?}"
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

/// `history --html/--svg` draws what `history --json` prints: from the
/// database, or from that JSON saved (`--from`, no database: the URL
/// given points at a closed port); a missing or malformed file, or
/// `--from` with nothing to draw, is refused before connecting.
async fn history_draws_the_same_timeline_from_the_database_and_from_a_saved_file() {
    let db = crate::common::new_db().await;
    let (a, b) = stale_takeover(&db).await;
    let dir = std::env::temp_dir().join(format!("pglease-drawn-{}", db.name()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let file = |f: &str| dir.join(f).display().to_string();
    let saved = pglease(&db, &["history", "job", "--json"]);
    assert_eq!(code(&saved), 0, "{}", stderr(&saved));
    std::fs::write(file("saved.json"), &saved.stdout).expect("save");
    let out = pglease(
        &db,
        &[
            "history",
            "job",
            "--html",
            &file("db.html"),
            "--svg",
            &file("db.svg"),
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let nowhere = "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=1";
    let out = crate::common::pglease_on(
        nowhere,
        &["history", "--from", &file("saved.json"), "--html", &file("saved.html")],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let page = read(&dir.join("db.html"));
    assert_eq!(page, read(&dir.join("saved.html")));
    assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
    for token in [a, b] {
        assert!(page.contains(&format!(">#{token}</text>")), "{page}");
    }
    let out = crate::common::pglease_on(
        nowhere,
        &["history", "job", "--from", &file("saved.json"), "--svg", "-"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), read(&dir.join("db.svg")));
    assert!(stdout(&out).starts_with("<svg "), "{}", stdout(&out));
    // Another lease's rows: none of these.
    let out = crate::common::pglease_on(
        nowhere,
        &["history", "other", "--from", &file("saved.json"), "--svg", "-"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("no recorded transitions"));

    std::fs::write(file("bad.json"), "[{\"event\": \"acquired\"}").expect("write");
    std::fs::write(file("rows.json"), "[{\"event\": \"acquired\"}]").expect("write");
    let refused: [(&[&str], &str); 5] = [
        (
            &["--from", &file("missing.json"), "--html", &file("x.html")],
            "cannot read --from",
        ),
        (
            &["--from", &file("bad.json"), "--html", &file("x.html")],
            "is not a history saved with `pglease history NAME --json`: not JSON",
        ),
        (
            &["--from", &file("rows.json"), "--html", &file("x.html")],
            "row 1: no \"at\"",
        ),
        (
            &["--from", &file("saved.json")],
            "give --html FILE or --svg FILE",
        ),
        (
            &["job", "--html", "-", "--svg", "-"],
            "would both write to stdout",
        ),
    ];
    for (args, why) in refused {
        let mut all = vec!["history"];
        all.extend_from_slice(args);
        let out = crate::common::pglease_on(nowhere, &all);
        assert_eq!(code(&out), 2, "{all:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(why), "{all:?}: {}", stderr(&out));
    }
    assert!(!dir.join("x.html").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `chromium --headless ARGS` (as root it needs --no-sandbox) with a
/// profile of its own, bounded; its output.
pub(crate) async fn chromium(profile: &std::path::Path, args: &[&str]) -> std::process::Output {
    let run = tokio::process::Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(BOUND, run)
        .await
        .expect("chromium within the bound")
        .expect("run chromium");
    assert!(out.status.success(), "chromium: {}", stderr(&out));
    out
}

/// The page `history --html` draws, as a real browser lays it out: the
/// test loads it in headless Chromium with a script of its own appended
/// (measuring each holder's row, term and marker) and reads the measures
/// from the DOM the browser dumps; then a screenshot, whose pixels show
/// the terms' and the eviction's colours. Reported ignored without
/// chromium.
async fn history_html_is_laid_out_by_a_headless_browser() -> Result<(), SetupError> {
    needs_chromium()?;
    let db = crate::common::new_db().await;
    let (a, b) = stale_takeover(&db).await;
    let dir = std::env::temp_dir().join(format!("pglease-browser-{}", db.name()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let page = dir.join("job.html");
    let out = pglease(&db, &["history", "job", "--html", &page.display().to_string()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let history = json(&pglease(&db, &["history", "job", "--json"]));

    let measured = dir.join("measured.html");
    std::fs::write(
        &measured,
        read(&page).replace("</body>", &format!("<script>{MEASURE}</script></body>")),
    )
    .expect("write");
    let out = chromium(
        &dir.join("profile"),
        &["--dump-dom", &format!("file://{}", measured.display())],
    )
    .await;
    let dom = stdout(&out);
    let lines = measures(&dom);
    let find = |what: &str, holder: &str| -> [f64; 3] {
        let l = lines
            .iter()
            .find(|l| l[0] == what && l[1] == holder)
            .unwrap_or_else(|| panic!("no {what} of {holder}: {lines:?}"));
        [4, 5, 6].map(|i| l[i].parse().expect("a number"))
    };
    // A row per holder, A's above B's.
    assert_eq!(lines.iter().filter(|l| l[0] == "row").count(), 2, "{lines:?}");
    assert!(find("row", "A")[1] < find("row", "B")[1], "{lines:?}");
    // A's term (its token, expired), then B's (its token, released), on
    // their rows.
    let term = |holder: &str, token: i64, end: &str| {
        let l = lines
            .iter()
            .find(|l| l[0] == "term" && l[1] == holder)
            .unwrap_or_else(|| panic!("no term of {holder}: {lines:?}"));
        assert_eq!((l[2].as_str(), l[3].as_str()), (token.to_string().as_str(), end), "{lines:?}");
        find("term", holder)
    };
    let [a_left, a_top, a_width] = term("A", a, "expired");
    let [b_left, b_top, b_width] = term("B", b, "released");
    assert!(a_width > 100.0 && b_width > 0.0, "{lines:?}");
    assert!(a_top < b_top && a_left + a_width <= b_left, "{lines:?}");
    // A unaware after its expiry, the eviction of its session, B's
    // takeover: in that order, right of A's term.
    let [unaware_left, _, unaware_width] = find("unaware-term", "A");
    let [evicted_left, evicted_top, evicted_width] = find("marker-evicted", "A");
    let [takeover_left, _, _] = find("marker-takeover", "B");
    assert!(unaware_width > 0.0 && evicted_width > 0.0, "{lines:?}");
    assert!((unaware_left - (a_left + a_width)).abs() <= 1.0, "{lines:?}");
    assert!(evicted_left + evicted_width / 2.0 >= a_left + a_width, "{lines:?}");
    assert!(evicted_top < b_top, "{lines:?}");
    assert!(takeover_left < b_left, "{lines:?}");
    // Every row in the table; nothing fetched.
    let count = |what: &str| lines.iter().find(|l| l[0] == what).map(|l| l[1].as_str());
    assert_eq!(count("transitions"), Some("5"), "{lines:?}");
    assert_eq!(count("fetched"), Some("0"), "{lines:?}");
    // The hover titles give the exact times the history recorded.
    for row in history.as_array().expect("an array") {
        let at = chrono::DateTime::parse_from_rfc3339(row["at"].as_str().expect("a time"))
            .expect("RFC 3339")
            .to_utc()
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        assert!(dom.contains(&at), "{at} in {dom}");
    }

    // The screenshot: the page drawn, A's bar and the eviction's red.
    let shot = dir.join("job.png");
    chromium(
        &dir.join("profile"),
        &[
            "--window-size=1000,600",
            &format!("--screenshot={}", shot.display()),
            &format!("file://{}", page.display()),
        ],
    )
    .await;
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(&shot).expect("the screenshot"),
    ));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut pixels = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut pixels).expect("a frame");
    assert_eq!((info.width, info.height), (1000, 600));
    let channels = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("a screenshot in {other:?}"),
    };
    let near = |p: &[u8], c: [u8; 3]| (0..3).all(|i| p[i].abs_diff(c[i]) <= 8);
    let of = |c: [u8; 3]| {
        pixels[..info.line_size * info.height as usize]
            .chunks(channels)
            .filter(|p| near(p, c))
            .count()
    };
    let white = of([255, 255, 255]);
    let total = (info.width * info.height) as usize;
    eprintln!(
        "screenshot: {} bytes, {white} of {total} pixels white, {} held-blue, {} eviction-red",
        std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0),
        of([0x4a, 0x7f, 0xb5]),
        of([0xc6, 0x28, 0x28])
    );
    assert!(white < total * 95 / 100, "a blank screenshot");
    assert!(of([0x4a, 0x7f, 0xb5]) > 2_000, "A's term is not drawn");
    assert!(of([0xc6, 0x28, 0x28]) > 10, "the eviction is not drawn");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Unavailable where chromium is not installed.
pub(crate) fn needs_chromium() -> Result<(), SetupError> {
    match std::process::Command::new("chromium").arg("--version").output() {
        Ok(_) => Ok(()),
        Err(_) => Err(SetupError::Unavailable(
            "needs chromium, which is not installed here (apt-get install chromium)".to_owned(),
        )),
    }
}

/// Each line of the measures [`MEASURE`] wrote into the DOM, split at
/// spaces.
pub(crate) fn measures(dom: &str) -> Vec<Vec<String>> {
    dom.split_once("<pre id=\"measured\">")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        .unwrap_or_else(|| panic!("no measures in the DOM: {dom}"))
        .0
        .lines()
        .map(|l| l.split(' ').map(str::to_owned).collect())
        .collect()
}

/// The test's own script, appended to the page `history --html` wrote:
/// each row's, term's and marker's box as the browser laid it out
/// (`KIND HOLDER TOKEN END LEFT TOP WIDTH`), the number of table rows and
/// of resources fetched, into `<pre id="measured">`.
pub(crate) const MEASURE: &str = r#"
const lines = [];
const box = (kind, g, el) => {
  const r = el.getBoundingClientRect();
  lines.push([kind, g.dataset.holder || '-', g.dataset.token || '-', g.dataset.end || '-',
              Math.round(r.left), Math.round(r.top), Math.round(r.width)].join(' '));
};
for (const g of document.querySelectorAll('svg g.row')) box('row', g, g.querySelector('text'));
for (const g of document.querySelectorAll('svg g.term')) box('term', g, g.querySelector('rect'));
for (const g of document.querySelectorAll('svg g.unaware-term')) box('unaware-term', g, g);
for (const g of document.querySelectorAll('svg g.pause')) box('pause', g, g.querySelector('rect'));
for (const g of document.querySelectorAll('svg g.marker')) {
  box(g.getAttribute('class').replace(' ', '-'), g, g);
}
lines.push('transitions ' + document.querySelectorAll('table.transitions tbody tr').length);
lines.push('fetched ' + performance.getEntriesByType('resource').length);
const pre = document.createElement('pre');
pre.id = 'measured';
pre.textContent = lines.join('\n');
document.body.appendChild(pre);
"#;

pglease_formations::tests![
    force_release_stops_a_running_holder_and_the_history_says_why(2),
    history_lists_an_expiry_before_the_eviction_that_followed_it,
    history_draws_the_same_timeline_from_the_database_and_from_a_saved_file,
    history_html_is_laid_out_by_a_headless_browser,
];
