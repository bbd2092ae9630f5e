//! Bounded takeover: a holder process frozen (SIGSTOP) inside a fenced
//! transaction, idle or in the middle of a long statement, loses its lease
//! at expiry. The next acquisition succeeds within the grace while the
//! holder is still stopped, the stale transaction never commits, and
//! nothing else is touched. Without the privilege to end sessions, the
//! lease is reported pinned, at once.

use std::io::Write;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{TestDb, poll_until};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pglease::{AcquireOptions, Error, LeaseManager};
use sqlx::{AssertSqlSafe, Connection};

const BOUND: Duration = Duration::from_secs(30);
const LONG: Duration = Duration::from_secs(600);
/// The holder's TTL.
const TTL: Duration = Duration::from_secs(1);

/// How the frozen holder spends its fenced transaction.
const IDLE: &str = "idle";
const IN_STATEMENT: &str = "statement";

/// The holder, run as a process of its own: this test binary started again
/// with only this (otherwise ignored) test, configured by the environment.
/// It holds lease `PGLEASE_CHILD_NAME` with background renewal, opens a
/// fenced transaction, writes, says `ready`, and then either waits idle in
/// the transaction for a line on stdin or runs a long statement in it;
/// finally it writes once more, tries to commit, and says how that went.
async fn holder_process() {
    let Ok(mode) = std::env::var("PGLEASE_CHILD_MODE") else {
        return;
    };
    let url = std::env::var("PGLEASE_CHILD_URL").expect("PGLEASE_CHILD_URL");
    let name = std::env::var("PGLEASE_CHILD_NAME").expect("PGLEASE_CHILD_NAME");
    let m = LeaseManager::connect(&url).await.expect("connect");
    let held = m
        .hold(&name, AcquireOptions::ttl(TTL).holder("A"))
        .await
        .expect("hold");
    let mut tx = held.begin_fenced().await.expect("fenced");
    let insert = "INSERT INTO log (who, token) VALUES ('A', $1)";
    sqlx::query(insert)
        .bind(held.token())
        .execute(&mut *tx)
        .await
        .expect("first write");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .expect("pid");
    println!("ready {} {pid}", held.token());
    if mode == IN_STATEMENT {
        let slept = sqlx::query("SELECT pg_sleep(600)").execute(&mut *tx).await;
        println!("statement: {}", outcome(slept.map(|_| ())));
    } else {
        // Off the runtime's thread, so that renewal goes on until SIGSTOP.
        let _ = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line)
        })
        .await;
    }
    let wrote = sqlx::query(insert)
        .bind(held.token())
        .execute(&mut *tx)
        .await;
    println!("write: {}", outcome(wrote.map(|_| ())));
    println!("commit: {}", outcome(tx.commit().await));
    println!("lost: {:?}", held.loss_reason());
}

fn outcome<E: std::fmt::Display>(result: Result<(), E>) -> String {
    match result {
        Ok(()) => "ok".to_owned(),
        Err(e) => format!("failed: {e}"),
    }
}

/// The holder process and the lines it prints.
struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Holder {
    fn start(db: &TestDb, name: &str, mode: &str) -> Holder {
        let mut child = crate::common::child_test("takeover::holder_process")
            .env("PGLEASE_CHILD_MODE", mode)
            .env("PGLEASE_CHILD_URL", db.url())
            .env("PGLEASE_CHILD_NAME", name)
            .stdin(Stdio::piped())
            .spawn()
            .expect("start the holder process");
        let lines = crate::common::stdout_lines(&mut child);
        Holder {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// The next line that starts with `prefix`, without it.
    async fn line(&self, prefix: &str) -> String {
        let deadline = tokio::time::Instant::now() + BOUND;
        loop {
            match self.lines.try_recv() {
                // libtest may print "test holder_process ... " before it.
                Ok(line) => {
                    if let Some(at) = line.find(prefix) {
                        return line[at + prefix.len()..].trim().to_owned();
                    }
                }
                Err(mpsc::TryRecvError::Empty) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "the holder did not print {prefix:?} within {BOUND:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(mpsc::TryRecvError::Disconnected) => {
                    panic!("the holder exited before printing {prefix:?}")
                }
            }
        }
    }

    /// Whether the process is stopped (state T in /proc).
    fn stopped(&self) -> bool {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // The state follows the command name, which is in parentheses.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = kill(self.pid(), Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn create_log(db: &TestDb) {
    sqlx::query("CREATE TABLE log (who text NOT NULL, token bigint NOT NULL)")
        .execute(db.pool())
        .await
        .expect("create log");
}

async fn rows_of(db: &TestDb, who: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM log WHERE who = $1")
        .bind(who)
        .fetch_one(db.pool())
        .await
        .expect("count")
}

/// Waits until lease `name` has expired on the database clock and stays
/// so (the stopped holder's last renewal may still land once); returns its
/// final expiry.
async fn final_expiry(db: &TestDb, m: &LeaseManager, name: &str) -> chrono::DateTime<chrono::Utc> {
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let status = m.inspect(name).await.expect("inspect");
        let expires_at = status.expires_at.expect("acquired");
        if !status.held {
            return expires_at;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stopped holder's lease did not expire"
        );
        db.wait_until(expires_at).await;
    }
}

/// The scenario for one way of being frozen: see the file's comment.
async fn frozen_holder_is_taken_over(mode: &str) {
    let db = TestDb::new().await;
    create_log(&db).await;
    let m = db.manager();
    let holder = Holder::start(&db, "job", mode);
    let ready = holder.line("ready ").await;
    let (token, backend) = ready.split_once(' ').expect("token and pid");
    let token: i64 = token.parse().expect("token");
    let backend: i32 = backend.parse().expect("pid");

    // Unrelated work that must survive the takeover: a fenced transaction
    // on another, valid lease, and a plain open transaction.
    let other = m
        .acquire("other", AcquireOptions::ttl(LONG).holder("C"))
        .await
        .expect("other");
    let mut other_tx = m
        .begin_fenced(&crate::common::fence("other", other.token()))
        .await
        .expect("fenced on other");
    sqlx::query("INSERT INTO log (who, token) VALUES ('C', $1)")
        .bind(other.token())
        .execute(&mut *other_tx)
        .await
        .expect("C writes");
    let mut plain = db.connect().await;
    let mut plain_tx = plain.begin().await.expect("begin");
    sqlx::query("INSERT INTO log (who, token) VALUES ('D', 0)")
        .execute(&mut *plain_tx)
        .await
        .expect("D writes");

    if mode == IN_STATEMENT {
        poll_until("the holder's statement to run", BOUND, || async {
            sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
                  WHERE pid = $1 AND state = 'active' AND query LIKE '%pg_sleep%')",
            )
            .bind(backend)
            .fetch_one(db.pool())
            .await
            .expect("read pg_stat_activity")
        })
        .await;
    }
    kill(holder.pid(), Signal::SIGSTOP).expect("SIGSTOP");
    let expired = final_expiry(&db, &m, "job").await;

    // Liveness: one attempt, while the holder is still stopped.
    let b = tokio::time::timeout(
        BOUND,
        m.acquire("job", AcquireOptions::ttl(LONG).holder("B")),
    )
    .await
    .expect("B's acquisition must not wait for the frozen holder")
    .expect("B acquires while A is frozen");
    assert!(holder.stopped(), "the holder was resumed too early");
    assert!(b.token() > token);
    let after = (b.acquired_at() - expired).num_milliseconds();
    println!("{mode}: taken over {after} ms after the expiry (database clock)");
    poll_until("the frozen holder's session to end", BOUND, || async {
        sqlx::query_scalar("SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
            .bind(backend)
            .fetch_one(db.pool())
            .await
            .expect("read pg_stat_activity")
    })
    .await;

    // Nothing else was touched.
    other_tx
        .commit()
        .await
        .expect("C's fenced transaction commits");
    plain_tx.commit().await.expect("D's transaction commits");
    assert_eq!(rows_of(&db, "C").await, 1);
    assert_eq!(rows_of(&db, "D").await, 1);

    // Safety: the frozen holder resumes; none of its writes commits.
    kill(holder.pid(), Signal::SIGCONT).expect("SIGCONT");
    if let Some(mut stdin) = holder.stdin.as_ref() {
        let _ = stdin.write_all(b"go on\n");
    }
    let commit = holder.line("commit: ").await;
    assert!(commit.starts_with("failed"), "A's commit: {commit}");
    let lost = holder.line("lost: ").await;
    assert!(lost.starts_with("Some("), "A's lease: {lost}");
    assert_eq!(rows_of(&db, "A").await, 0, "a write under the stale token");
    m.release(&crate::common::fence("job", b.token()))
        .await
        .expect("release");
    m.release(&crate::common::fence("other", other.token()))
        .await
        .expect("release");
}

async fn a_holder_frozen_idle_in_its_fenced_transaction_is_taken_over() {
    frozen_holder_is_taken_over(IDLE).await;
}

async fn a_holder_frozen_in_a_long_fenced_statement_is_taken_over() {
    frozen_holder_is_taken_over(IN_STATEMENT).await;
}

/// The schema owned by a role that is not a superuser: without
/// pg_signal_backend it cannot end another role's stale session, and the
/// lease is reported pinned at once (not a hang). Granted pg_signal_backend, the same acquisition goes through.
async fn without_the_privilege_an_ended_lease_is_reported_pinned() {
    let suffix = std::process::id();
    let (owner, app) = (
        format!("pglease_owner_{suffix}"),
        format!("pglease_app2_{suffix}"),
    );
    let db = &TestDb::empty().await;
    db.scratch_roles(&[&owner, &app]).await;
    db.execute(&[
        format!("CREATE ROLE {owner} LOGIN PASSWORD 'pw'"),
        format!("CREATE ROLE {app} LOGIN PASSWORD 'pw'"),
        format!("GRANT CREATE ON DATABASE {} TO {owner}", db.name()),
        format!("GRANT CREATE ON SCHEMA public TO {owner}"),
    ])
    .await;
    let as_owner = LeaseManager::connect(&db.url_for(&owner, "pw"))
        .await
        .expect("connect as the owner");
    as_owner.migrate().await.expect("migrate as the owner");
    assert!(
        !as_owner
            .admin()
            .can_end_stale_transactions()
            .await
            .expect("check")
    );
    for sql in [
        format!("GRANT USAGE ON SCHEMA pglease TO {app}"),
        format!("GRANT SELECT ON pglease.status TO {app}"),
        "CREATE TABLE log (who text NOT NULL, token bigint NOT NULL)".to_owned(),
        format!("GRANT SELECT, INSERT ON log TO {app}"),
    ] {
        sqlx::query(AssertSqlSafe(sql))
            .execute(as_owner.pool())
            .await
            .expect("set up as the owner");
    }
    let as_app = LeaseManager::connect(&db.url_for(&app, "pw"))
        .await
        .expect("connect as the application");
    let old = as_app
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_secs(1)).holder("A"),
        )
        .await
        .expect("A acquires");
    let mut tx = as_app
        .begin_fenced(&crate::common::fence("job", old.token()))
        .await
        .expect("A checks");
    sqlx::query("INSERT INTO log (who, token) VALUES ('A', $1)")
        .bind(old.token())
        .execute(&mut *tx)
        .await
        .expect("A writes");
    db.wait_until(old.expires_at()).await;

    let b = LeaseManager::new(as_app.pool().clone());
    match tokio::time::timeout(
        BOUND,
        b.acquire("job", AcquireOptions::ttl(LONG).holder("B")),
    )
    .await
    {
        Ok(Err(Error::Pinned {
            name,
            holder,
            reason,
            ..
        })) => {
            assert_eq!(name, "job");
            assert_eq!(holder.as_deref(), Some("A"));
            // The answer itself says what is missing, for callers who
            // cannot read the server's log.
            assert!(
                reason.contains(&format!("GRANT pg_signal_backend TO {owner}")),
                "{reason}"
            );
        }
        other => panic!("expected Pinned at once, got {other:?}"),
    }
    // A waiting acquisition gives up at its bound with the same answer.
    assert!(matches!(
        b.acquire(
            "job",
            AcquireOptions::ttl(LONG)
                .holder("B")
                .wait(Duration::from_millis(300))
        )
        .await,
        Err(Error::Pinned { .. })
    ));

    db.execute(&[format!("GRANT pg_signal_backend TO {owner}")])
        .await;
    assert!(
        as_owner
            .admin()
            .can_end_stale_transactions()
            .await
            .expect("check")
    );
    let taken = tokio::time::timeout(
        BOUND,
        b.acquire("job", AcquireOptions::ttl(LONG).holder("B")),
    )
    .await
    .expect("bounded")
    .expect("B acquires once the owner may end the stale session");
    assert!(taken.token() > old.token());
    assert!(
        tx.commit().await.is_err(),
        "A's stale transaction committed"
    );
    assert_eq!(rows_of(db, "A").await, 0);
    as_app.pool().close().await;
    as_owner.pool().close().await;
}

/// Every connection of a holder's pool is in a fenced transaction when
/// a takeover ends their sessions: each commit fails at once and says the
/// lease was lost (its read of the lease must not wait for a connection
/// of that pool, which the failing transactions would all be holding).
async fn fenced_transactions_holding_every_connection_each_hear_their_loss() {
    let db = TestDb::new().await;
    create_log(&db).await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&db.url())
        .await
        .expect("a pool of two");
    let holder = LeaseManager::new(pool);
    let held = holder
        .hold("busy", AcquireOptions::ttl(TTL).holder("A"))
        .await
        .expect("hold");
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut tx = held.begin_fenced().await.expect("a fenced transaction");
        sqlx::query("INSERT INTO log (who, token) VALUES ('A', $1)")
            .bind(held.token())
            .execute(&mut *tx)
            .await
            .expect("the write");
        open.push(tx);
    }
    holder.faults().pause_renewals();
    let other = db.manager();
    poll_until("B takes over", BOUND, || async {
        other
            .acquire("busy", AcquireOptions::ttl(TTL).holder("B"))
            .await
            .is_ok()
    })
    .await;
    let started = std::time::Instant::now();
    let commits = futures_join(open).await;
    println!("both commits answered in {:?}", started.elapsed());
    for outcome in commits {
        assert!(matches!(outcome, Err(Error::Lost { .. })), "{outcome:?}");
    }
    assert_eq!(rows_of(&db, "A").await, 0);
}

/// Commits every transaction at once.
async fn futures_join(open: Vec<pglease::FencedTransaction>) -> Vec<Result<(), Error>> {
    let tasks: Vec<_> = open.into_iter().map(|tx| tokio::spawn(tx.commit())).collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("the commit task"));
    }
    outcomes
}

pglease_formations::tests![
    holder_process ignored,
    a_holder_frozen_idle_in_its_fenced_transaction_is_taken_over,
    a_holder_frozen_in_a_long_fenced_statement_is_taken_over,
    without_the_privilege_an_ended_lease_is_reported_pinned,
    fenced_transactions_holding_every_connection_each_hear_their_loss,
];
