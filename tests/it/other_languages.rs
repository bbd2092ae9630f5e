//! A service in another language, on the SQL functions alone: the Python
//! example (`examples/python/lease.py`, psycopg 3) run against the real
//! server as a holder that is frozen, or whose network is, while the test
//! takes the lease with SQL of its own; and `assert_held`'s DETAIL, which
//! docs/other-languages.md documents as stable, read as `key=value`
//! fields the way such a client reads it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pglease_formations::{Forwarder, SetupError, Target};
use sqlx::postgres::PgDatabaseError;

use crate::common::TestDb;

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/python/lease.py");

/// The example's TTL, in seconds, and the fraction of it the example keeps
/// as its safety margin (the library's default: 2 %).
const TTL: f64 = 2.0;
const MARGIN: f64 = 0.02;
/// Time for a process woken at an instant to print its line and for this
/// test to read it, on a machine shared with other builds.
const SLACK: Duration = Duration::from_millis(250);

/// `Err(Unavailable)` unless python3 can import psycopg.
fn psycopg() -> Result<(), SetupError> {
    let found = Command::new("python3")
        .args(["-c", "import psycopg"])
        .output();
    if found.is_ok_and(|o| o.status.success()) {
        return Ok(());
    }
    Err(SetupError::Unavailable(
        "needs python3 with psycopg 3, from PyPI: python3 -m pip install 'psycopg[binary]'"
            .to_owned(),
    ))
}

/// The example running, its lines read as they come, each with the
/// instant this test read it.
struct Holder {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
    seen: Vec<(Instant, String)>,
    /// Where the next search starts: after the line the last one found.
    cursor: usize,
}

impl Holder {
    fn start(conninfo: &str, name: &str, work: f64) -> Holder {
        let mut child = Command::new("python3")
            .args([EXAMPLE, conninfo, name, &TTL.to_string(), &work.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start python3");
        let out = child.stdout.take().expect("its stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Holder {
            child,
            lines,
            seen: Vec::new(),
            cursor: 0,
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("a pid"))
    }

    fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).expect("signal the example");
    }

    /// Waits until it prints a line starting with `what` after the line
    /// found last, and returns it with the instant it was read and its
    /// `key=value` fields.
    async fn next(&mut self, what: &str, within: Duration) -> (Instant, String, Fields) {
        self.find(what, within, false).await
    }

    /// Waits until it prints a line starting with `what`, before or after
    /// the line found last (for one printed once, from another thread).
    async fn any(&mut self, what: &str, within: Duration) -> (Instant, String, Fields) {
        self.find(what, within, true).await
    }

    async fn find(&mut self, what: &str, within: Duration, all: bool) -> (Instant, String, Fields) {
        let deadline = Instant::now() + within;
        loop {
            while let Ok(line) = self.lines.try_recv() {
                self.seen.push(line);
            }
            let from = if all { 0 } else { self.cursor };
            let found = self.seen[from..]
                .iter()
                .position(|(_, l)| l.starts_with(what))
                .map(|i| from + i);
            if let Some(i) = found {
                if !all {
                    self.cursor = i + 1;
                }
                let (at, line) = &self.seen[i];
                return (*at, line.clone(), fields(line));
            }
            let lines: Vec<&str> = self.seen.iter().map(|(_, l)| l.as_str()).collect();
            assert!(
                Instant::now() < deadline,
                "the example did not print {what:?} within {within:?}: {lines:#?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Its exit status, waited for at most `within`.
    async fn exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the example") {
                return status;
            }
            assert!(Instant::now() < deadline, "the example did not exit within {within:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = kill(self.pid(), Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type Fields = BTreeMap<String, String>;

/// The `key=value` words of a line (or of a DETAIL before its `name=`).
fn fields(line: &str) -> Fields {
    line.split(' ')
        .filter_map(|word| word.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn number<T: std::str::FromStr>(fields: &Fields, key: &str) -> T {
    fields
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {key} in {fields:?}"))
}

async fn prepare(db: &TestDb) {
    db.execute(&["CREATE TABLE lease_demo (token bigint NOT NULL, n integer NOT NULL)"])
        .await;
}

async fn rows_of(db: &TestDb, token: i64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM lease_demo WHERE token = $1")
        .bind(token)
        .fetch_one(db.pool())
        .await
        .expect("count the example's rows")
}

/// Acquires `name` as holder B with SQL, attempting every 20 ms for at
/// most `within`: B's token.
async fn acquire_b(db: &TestDb, name: &str, within: Duration) -> i64 {
    let deadline = Instant::now() + within;
    loop {
        let token: Option<i64> =
            sqlx::query_scalar("SELECT token FROM pglease.acquire($1, 'B', '30 seconds')")
                .bind(name)
                .fetch_one(db.pool())
                .await
                .expect("B's acquisition");
        if let Some(token) = token {
            return token;
        }
        assert!(
            Instant::now() < deadline,
            "B did not acquire {name} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn lease_token(db: &TestDb, name: &str) -> (i64, bool) {
    sqlx::query_as("SELECT token, held FROM pglease.status WHERE name = $1")
        .bind(name)
        .fetch_one(db.pool())
        .await
        .expect("the lease's status")
}

/// Holder A, in Python, is frozen (SIGSTOP) in the middle of a unit of
/// work for longer than its TTL; B acquires the lease with SQL; A, woken
/// (SIGCONT), finishes the unit and its fenced write is refused by the
/// database (LE001, `reason=stale`, B's token as `current_token`), and A
/// reports the loss. Nothing under A's token commits after B's
/// acquisition, B acquires within TTL + 1 s of the freeze, and B keeps the
/// lease.
async fn frozen_python_holder_is_refused_and_reports_the_loss() -> Result<(), SetupError> {
    psycopg()?;
    let db = TestDb::new().await;
    prepare(&db).await;
    let name = "py frozen";
    let mut a = Holder::start(&db.url(), name, 1.5);
    let (_, _, acquired) = a.next("acquired ", Duration::from_secs(10)).await;
    let a_token: i64 = number(&acquired, "token");
    a.next("wrote n=1 ", Duration::from_secs(10)).await;
    a.next("working n=2 ", Duration::from_secs(10)).await;
    // Frozen in its work (1.5 s of it), not in a fenced transaction.
    a.signal(Signal::SIGSTOP);
    let frozen = Instant::now();
    let fenced: i64 = sqlx::query_scalar("SELECT count(*) FROM pglease.fenced WHERE name = $1")
        .bind(name)
        .fetch_one(db.pool())
        .await
        .expect("read the fenced sessions");
    assert_eq!(fenced, 0, "A was frozen outside its fenced transactions");

    let b_token = acquire_b(&db, name, Duration::from_secs_f64(TTL + 1.0)).await;
    let took = frozen.elapsed();
    assert!(b_token > a_token, "B's token {b_token} after A's {a_token}");
    let before = rows_of(&db, a_token).await;
    assert!(before >= 1, "A wrote under its token while it held the lease");
    // Frozen past its TTL before it is woken, whatever B's wait was.
    tokio::time::sleep_until((frozen + Duration::from_secs_f64(TTL + 0.5)).into()).await;
    a.signal(Signal::SIGCONT);

    let (_, line, refused) = a.next("refused n=2 ", Duration::from_secs(10)).await;
    assert_eq!(refused.get("reason").map(String::as_str), Some("stale"), "{line}");
    assert_eq!(number::<i64>(&refused, "token"), a_token, "{line}");
    assert_eq!(number::<i64>(&refused, "current_token"), b_token, "{line}");
    a.any("lost ", Duration::from_secs(1)).await;
    let status = a.exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(1), "A stops after the loss");

    assert_eq!(
        rows_of(&db, a_token).await,
        before,
        "a row under A's token committed after B acquired"
    );
    assert_eq!(lease_token(&db, name).await, (b_token, true), "B holds it");
    println!("B acquired {took:?} after A froze (TTL {TTL} s)");
    Ok(())
}

/// Holder A, in Python, reaches the database through a forwarder that
/// freezes (no answer, no close: a network that stops answering). A
/// reports the loss by its local deadline, counted from the send of its
/// last confirmed renewal, with no answer from the database: no later
/// than TTL less its margin after this test read that renewal's line,
/// and no later than the deadline A printed (plus `SLACK` both). B
/// acquires within TTL + 1 s of the freeze; no row under A's token
/// commits after B's acquisition, also once the network answers again.
async fn python_holder_reports_the_loss_by_its_local_deadline() -> Result<(), SetupError> {
    psycopg()?;
    let db = TestDb::new().await;
    prepare(&db).await;
    let name = "py unreachable";
    let server = &db.server().options;
    let network = Forwarder::start(Target::of(server)?).await?;
    let conninfo = format!(
        "host=127.0.0.1 port={} dbname={} user={}",
        network.port(),
        db.name(),
        server.get_username()
    );
    let mut a = Holder::start(&conninfo, name, 0.2);
    let (_, _, acquired) = a.next("acquired ", Duration::from_secs(10)).await;
    let a_token: i64 = number(&acquired, "token");
    a.next("renewed ", Duration::from_secs(10)).await;
    a.next("wrote ", Duration::from_secs(10)).await;
    network.freeze();
    let frozen = Instant::now();

    let (lost_read, line, lost) = a.next("lost ", Duration::from_secs_f64(TTL + 2.0)).await;
    // The last renewal A confirmed: the last line that says so before
    // the loss (none can come after the freeze but one answered on its
    // way through it).
    let (renewal_read, renewal) = a
        .seen
        .iter()
        .rfind(|(at, l)| {
            *at <= lost_read && (l.starts_with("renewed ") || l.starts_with("acquired "))
        })
        .map(|(at, l)| (*at, fields(l)))
        .expect("a confirmed renewal");
    assert_eq!(lost.get("reason").map(String::as_str), Some("deadline"), "{line}");
    let deadline: f64 = number(&renewal, "deadline");
    assert_eq!(number::<f64>(&lost, "deadline"), deadline, "{line}");
    let sent: f64 = number(&renewal, "sent");
    assert!(
        (deadline - sent - TTL * (1.0 - MARGIN)).abs() < 0.002,
        "the deadline is TTL less the margin after the send: {renewal:?}"
    );
    let at: f64 = number(&lost, "at");
    assert!(
        at >= deadline && at <= deadline + SLACK.as_secs_f64(),
        "A reported the loss at {at}, its deadline {deadline}"
    );
    let budget = Duration::from_secs_f64(TTL * (1.0 - MARGIN)) + SLACK;
    let after = lost_read - renewal_read;
    assert!(
        after <= budget,
        "A reported the loss {after:?} after its last renewal's line, more than {budget:?}"
    );

    // TTL + 1 s from the freeze, and the time a renewal already on its
    // way through the forwarder may have added (its answer was held back).
    let limit = frozen + Duration::from_secs_f64(TTL + 1.0) + SLACK;
    let b_token = acquire_b(&db, name, limit.saturating_duration_since(Instant::now())).await;
    let took = frozen.elapsed();
    assert!(b_token > a_token, "B's token {b_token} after A's {a_token}");
    let before = rows_of(&db, a_token).await;
    network.open();
    a.exit(Duration::from_secs_f64(TTL + 5.0)).await;
    assert_eq!(
        rows_of(&db, a_token).await,
        before,
        "a row under A's token committed after B acquired"
    );
    assert_eq!(lease_token(&db, name).await, (b_token, true), "B holds it");
    println!(
        "A said lost {:.0} ms after its deadline, {after:?} after it read its last renewal \
         (TTL {TTL} s); B acquired {took:?} after the freeze",
        (at - deadline) * 1000.0
    );
    Ok(())
}

/// Holder A, in Python, running normally, is forced out by an
/// administrator (`pglease.force_release`): A says `lost` from the
/// database's answer (its renewal answered NULL, or its next write
/// refused as stale), before its local deadline and within a renewal
/// period (TTL / 3) + `SLACK` of the force; B acquires at once; no row
/// under A's token commits after the force.
async fn python_holder_forced_out_says_lost_before_its_deadline() -> Result<(), SetupError> {
    psycopg()?;
    let db = TestDb::new().await;
    prepare(&db).await;
    let name = "py forced";
    let mut a = Holder::start(&db.url(), name, 0.2);
    let (_, _, acquired) = a.next("acquired ", Duration::from_secs(10)).await;
    let a_token: i64 = number(&acquired, "token");
    a.next("renewed ", Duration::from_secs(10)).await;
    a.next("wrote ", Duration::from_secs(10)).await;
    let forced = Instant::now();
    let ended: Option<i64> = sqlx::query_scalar("SELECT pglease.force_release($1, 'test')")
        .bind(name)
        .fetch_one(db.pool())
        .await
        .expect("force_release");
    assert_eq!(ended, Some(a_token), "the force ended A's term");
    let before = rows_of(&db, a_token).await;
    let b_token = acquire_b(&db, name, Duration::ZERO).await;
    assert!(b_token > a_token, "B's token {b_token} after A's {a_token}");

    let (read, line, lost) = a.any("lost ", Duration::from_secs_f64(TTL)).await;
    let reason = lost.get("reason").map(String::as_str);
    assert!(
        matches!(reason, Some("renew_refused" | "write_refused_stale")),
        "told by the database: {line}"
    );
    let (at, deadline): (f64, f64) = (number(&lost, "at"), number(&lost, "deadline"));
    assert!(at < deadline, "before its deadline: {line}");
    let within = Duration::from_secs_f64(TTL / 3.0) + SLACK;
    let after = read - forced;
    assert!(after <= within, "A said lost {after:?} after the force, more than {within:?}");
    assert_eq!(a.exit(Duration::from_secs(10)).await.code(), Some(1));
    assert_eq!(
        rows_of(&db, a_token).await,
        before,
        "a row under A's token committed after the force"
    );
    assert_eq!(lease_token(&db, name).await, (b_token, true), "B holds it");
    println!(
        "A said lost ({}) {after:?} after the force, {:.0} ms before its deadline",
        reason.unwrap_or_default(),
        (deadline - at) * 1000.0
    );
    Ok(())
}

async fn python_holder_releases_on_sigterm() -> Result<(), SetupError> {
    psycopg()?;
    let db = TestDb::new().await;
    prepare(&db).await;
    let name = "py stopped";
    let mut a = Holder::start(&db.url(), name, 0.2);
    let (_, _, acquired) = a.next("acquired ", Duration::from_secs(10)).await;
    let a_token: i64 = number(&acquired, "token");
    a.next("wrote ", Duration::from_secs(10)).await;
    a.signal(Signal::SIGTERM);
    let (_, line, released) = a.any("released ", Duration::from_secs(10)).await;
    assert_eq!(number::<i64>(&released, "token"), a_token, "{line}");
    assert_eq!(released.get("ended").map(String::as_str), Some("True"), "{line}");
    assert_eq!(a.exit(Duration::from_secs(10)).await.code(), Some(0));
    // Liveness: the next holder need not wait for the TTL.
    let b_token = acquire_b(&db, name, Duration::ZERO).await;
    assert!(b_token > a_token, "B's token {b_token} after A's {a_token}");
    Ok(())
}

/// `assert_held`'s LE001 DETAIL, as a client reads it: `key=value`
/// fields separated by spaces, `name=` last and whole (spaces and `=` in
/// it kept), exactly the keys docs/other-languages.md lists for each
/// reason and in its order, times in RFC 3339 UTC.
async fn le001_detail_is_key_value() {
    let db = TestDb::new().await;
    let name = "a name = with spaces";
    let detail = |token: i64| {
        let pool = db.pool().clone();
        async move {
            let err = sqlx::query("SELECT pglease.assert_held($1, $2)")
                .bind(name)
                .bind(token)
                .execute(&pool)
                .await
                .expect_err("refused");
            let db_err = err.as_database_error().expect("a server error");
            assert_eq!(db_err.code().as_deref(), Some("LE001"), "{db_err}");
            let detail = db_err
                .try_downcast_ref::<PgDatabaseError>()
                .and_then(PgDatabaseError::detail)
                .expect("a DETAIL")
                .to_owned();
            let (fields_part, lease) = detail.split_once(" name=").expect("name= last");
            assert_eq!(lease, name, "{detail}");
            let found = fields(fields_part);
            let order: Vec<String> = fields_part
                .split(' ')
                .map(|word| word.split_once('=').map_or("", |(k, _)| k).to_owned())
                .collect();
            assert_eq!(found.len(), order.len(), "every word is key=value: {detail}");
            (found, order)
        }
    };
    let acquire = |holder: &'static str| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_scalar::<_, Option<i64>>(
                "SELECT token FROM pglease.acquire($1, $2, '30 seconds')",
            )
            .bind(name)
            .bind(holder)
            .fetch_one(&pool)
            .await
            .expect("acquire")
            .expect("acquired")
        }
    };

    let (f, order) = detail(7).await;
    assert_eq!(order, ["reason", "token"]);
    assert_eq!((f["reason"].as_str(), f["token"].as_str()), ("never_acquired", "7"));

    let first = acquire("A").await;
    sqlx::query("SELECT pglease.release($1, $2)")
        .bind(name)
        .bind(first)
        .execute(db.pool())
        .await
        .expect("release");
    let (f, order) = detail(first).await;
    assert_eq!(order, ["reason", "token", "at"]);
    assert_eq!(f["reason"], "released");
    assert_eq!(number::<i64>(&f, "token"), first);
    let at = chrono::DateTime::parse_from_rfc3339(&f["at"]).expect("RFC 3339");
    assert!(f["at"].ends_with('Z'), "UTC: {}", f["at"]);
    let released: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT released_at FROM pglease.leases WHERE name = $1")
            .bind(name)
            .fetch_one(db.pool())
            .await
            .expect("released_at");
    assert_eq!(at, released, "the release's database time");

    let second = acquire("B").await;
    let (f, order) = detail(first).await;
    assert_eq!(order, ["reason", "token", "current_token"]);
    assert_eq!(f["reason"], "stale");
    assert_eq!(number::<i64>(&f, "token"), first);
    assert_eq!(number::<i64>(&f, "current_token"), second);

    let (f, order) = detail(second + 100).await;
    assert_eq!(order, ["reason", "token", "current_token"]);
    assert_eq!(f["reason"], "not_issued");
    assert_eq!(number::<i64>(&f, "current_token"), second);

    assert!(
        pglease::testing::expire_now(db.pool(), name)
            .await
            .expect("expire")
    );
    let (f, order) = detail(second).await;
    assert_eq!(order, ["reason", "token", "at"]);
    assert_eq!(f["reason"], "expired");
    assert_eq!(number::<i64>(&f, "token"), second);
    chrono::DateTime::parse_from_rfc3339(&f["at"]).expect("RFC 3339");
}

pglease_formations::tests![
    python_holder_releases_on_sigterm,
    frozen_python_holder_is_refused_and_reports_the_loss,
    python_holder_reports_the_loss_by_its_local_deadline,
    python_holder_forced_out_says_lost_before_its_deadline,
    le001_detail_is_key_value,
];
