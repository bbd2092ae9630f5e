//! What the command-line tests share: a test database (the library's
//! test kit, `pglease::testing`), and running the `pglease` binary against
//! it, its output, and a bounded wait for it to exit.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

pub use pglease::testing::{TestDatabase as TestDb, poll_until};

/// A new test database with the `pglease` schema applied, dropped when the
/// value is dropped.
pub async fn new_db() -> TestDb {
    TestDb::new().await.unwrap_or_else(|e| panic!("{e}"))
}

/// A new test database without the schema.
pub async fn empty_db() -> TestDb {
    TestDb::empty().await.unwrap_or_else(|e| panic!("{e}"))
}

/// The fence of lease `name` under `token`, for operations on a lease this
/// test did not acquire through the library (or with a made-up token).
pub fn fence(name: &str, token: impl Into<i64>) -> pglease::Fence {
    let token = pglease::Token::new(token.into()).expect("a valid token");
    pglease::Fence::new(name, token).expect("a valid fence")
}

pub const BIN: &str = env!("CARGO_BIN_EXE_pglease");
pub const BOUND: Duration = Duration::from_secs(30);

/// `pglease --database-url <db> ARGS`, not started yet.
pub fn command(db: &TestDb, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command.arg("--database-url").arg(db.url()).args(args);
    command
}

/// Runs `pglease --database-url <db> ARGS` to completion.
pub fn pglease(db: &TestDb, args: &[&str]) -> Output {
    command(db, args).output().expect("run the pglease binary")
}

pub fn code(output: &Output) -> i32 {
    output.status.code().expect("exited normally")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(output)))
}

/// Runs `pglease acquire ARGS --json`, which must grant the lease, and
/// returns the token it printed, as the command line takes it back.
pub fn acquired(db: &TestDb, args: &[&str]) -> String {
    let mut all = vec!["acquire"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = pglease(db, &all);
    assert_eq!(code(&out), 0, "{all:?}: {}", stderr(&out));
    json(&out)["token"]
        .as_i64()
        .unwrap_or_else(|| panic!("{all:?} printed no token: {}", stdout(&out)))
        .to_string()
}

/// Waits for `child` to exit, killing it and failing after [`BOUND`].
pub async fn wait_bounded(mut child: std::process::Child) -> std::process::ExitStatus {
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if tokio::time::Instant::now() >= deadline {
            let _ = child.kill();
            panic!("pglease did not exit within {BOUND:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A shell script for CMD that writes its pid (`pid:N`) to `outcomes`,
/// then makes a fenced write of its token into table `log` every 50 ms
/// (with psql, from the environment `run` and `elect` give it), and
/// appends `ok` or `rejected` to `outcomes` for each.
pub fn fenced_writer(outcomes: &Path) -> String {
    format!(
        "echo pid:$$ >> {f}; \
         while true; do \
           if psql \"$PGLEASE_DATABASE_URL\" -qAt -v ON_ERROR_STOP=1 \
                -c \"BEGIN; SELECT pglease.assert_held('$PGLEASE_NAME', $PGLEASE_TOKEN); \
                     INSERT INTO log (token) VALUES ($PGLEASE_TOKEN); COMMIT;\" \
                >/dev/null 2>&1; \
           then echo ok >> {f}; else echo rejected >> {f}; fi; \
           sleep 0.05; \
         done",
        f = outcomes.display()
    )
}

/// The text of `path`, or nothing if it does not exist yet.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The process-group ids CMDs wrote to `outcomes` (`pid:N` lines).
pub fn groups(outcomes: &Path) -> Vec<i32> {
    read(outcomes)
        .lines()
        .filter_map(|l| l.strip_prefix("pid:"))
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

/// A script for `sh -c` that runs until told to stop (SIGTERM), then
/// writes the wall-clock time of that moment (nanoseconds) to `path` and
/// exits 0; read it back with [`stopped_at`].
pub fn stop_recorder(path: &Path) -> String {
    let _ = std::fs::remove_file(path);
    format!(
        "trap 'date +%s%N > {}; exit 0' TERM; while :; do sleep 0.05; done",
        path.display()
    )
}

/// When the command of [`stop_recorder`]`(path)` was told to stop (the
/// file is removed).
pub fn stopped_at(path: &Path) -> chrono::DateTime<chrono::Utc> {
    let nanos: i64 = std::fs::read_to_string(path)
        .expect("the command recorded when it was stopped")
        .trim()
        .parse()
        .expect("a time in nanoseconds");
    let _ = std::fs::remove_file(path);
    chrono::DateTime::from_timestamp_nanos(nanos)
}

/// `pglease ARGS...` with `DATABASE_URL` set to `url` (a formation's
/// multi-host URL), run to its end.
pub fn pglease_on(url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", url)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run pglease")
}
