//! Session-bound leases (`AcquireOptions::session_bound`): the lease ends
//! with the server session that acquired it. A waiter takes it as soon as
//! that session is gone (a killed holder process, a terminated backend),
//! long before its TTL, with a new token: the old holder's writes are
//! refused and its renewals report the loss. A holder whose session lives
//! keeps its lease, whatever another role does with the session's key.

use std::process::Stdio;
use std::time::Duration;

use crate::common::{TestDb, create_data_table, data_value, fenced_write, poll_until};
use pglease::{AcquireOptions, Error, LeaseManager, LossReason, ManagerOptions, NotHeldReason};
use sqlx::AssertSqlSafe;

/// Every TTL here: a takeover that waited for it would fail the tests.
const TTL: Duration = Duration::from_secs(120);
/// The waiter's limit: far below the TTL.
const WAIT: Duration = Duration::from_secs(20);
const BOUND: Duration = Duration::from_secs(20);

/// The holder, run as a process of its own (this test binary again, with
/// only this otherwise ignored test): acquires `PGLEASE_CHILD_NAME`
/// session-bound, prints `ready TOKEN PID` (PID: its server session), and
/// waits for stdin to close, or for the SIGKILL that the test sends.
async fn holder_process() {
    let Ok(url) = std::env::var("PGLEASE_SESSION_CHILD_URL") else {
        return;
    };
    let name = std::env::var("PGLEASE_CHILD_NAME").expect("PGLEASE_CHILD_NAME");
    let m = LeaseManager::connect(&url).await.expect("connect");
    let lease = m
        .acquire(
            &name,
            AcquireOptions::ttl(TTL).holder("child").session_bound(true),
        )
        .await
        .expect("acquire");
    let status = m.inspect(&name).await.expect("inspect");
    println!(
        "ready {} {}",
        lease.token(),
        status.holder_session.expect("bound to a session")
    );
    let _ = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)
    })
    .await;
}

/// A's session-bound lease on `name` (TTL two minutes).
fn as_a() -> AcquireOptions {
    AcquireOptions::ttl(TTL).holder("A").session_bound(true)
}

/// Starts a waiter for `name` on `m` and returns once it is waiting.
async fn waiter(
    m: &LeaseManager,
    name: &str,
) -> tokio::task::JoinHandle<Result<pglease::Lease, Error>> {
    let task = {
        let (m, name) = (m.clone(), name.to_owned());
        tokio::spawn(async move {
            m.acquire(&name, AcquireOptions::ttl(TTL).holder("B").wait(WAIT))
                .await
        })
    };
    poll_until("the waiter waits", BOUND, || async {
        m.stats().waiting == 1 && m.stats().acquire_attempts >= 1
    })
    .await;
    task
}

/// The process id of the server session lease `name` is bound to.
async fn bound_pid(m: &LeaseManager, name: &str) -> i32 {
    let status = m.inspect(name).await.expect("inspect");
    assert!(status.held, "{name} is held");
    status.holder_session.expect("the lease is session-bound")
}

async fn terminate(db: &TestDb, pid: i32) {
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(db.pool())
        .await
        .expect("terminate");
    assert!(ended, "backend {pid} was running");
}

/// The old holder under `old` can neither write nor renew, and the
/// history says why its term ended.
async fn old_holder_is_fenced_out(db: &TestDb, a: &LeaseManager, lease: &pglease::Lease) {
    let wrote = fenced_write(a, lease.name(), lease.token(), "stale").await;
    assert!(
        matches!(wrote, Err(Error::NotHeld { .. })),
        "a write under the old token: {wrote:?}"
    );
    assert_ne!(data_value(db).await, "stale");
    let renewed = a.renew(lease, TTL).await;
    assert!(
        matches!(renewed, Err(Error::Lost { .. })),
        "a renewal under the old token: {renewed:?}"
    );
}

/// The history's entry for the end of term `token` of `name`.
async fn end_of_term(db: &TestDb, name: &str, token: i64) -> (String, Option<String>) {
    sqlx::query_as(
        "SELECT event::text, detail FROM pglease.history \
          WHERE name = $1 AND token = $2 AND event <> 'acquired'",
    )
    .bind(name)
    .bind(token)
    .fetch_one(db.pool())
    .await
    .expect("the history of the term")
}

async fn terminated_backend_frees_the_lease_at_once() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let a = db
        .manager_with("sb-holder", ManagerOptions::default())
        .await;
    let b = db
        .manager_with("sb-waiter", ManagerOptions::default())
        .await;
    let lease = a.acquire("job", as_a()).await.expect("acquire");
    let pid = bound_pid(&a, "job").await;
    let waiting = waiter(&b, "job").await;
    terminate(&db, pid).await;
    let got = waiting
        .await
        .expect("waiter task")
        .expect("the waiter acquires");
    // Liveness: taken while the old lease had most of its TTL left.
    assert!(got.token() > lease.token());
    assert!(
        got.acquired_at() < lease.expires_at(),
        "taken at {} before the old expiry {}",
        got.acquired_at(),
        lease.expires_at()
    );
    // Safety: the old token is fenced out; the new one writes.
    old_holder_is_fenced_out(&db, &a, &lease).await;
    fenced_write(&b, "job", got.token(), "by B")
        .await
        .expect("the new holder writes");
    assert_eq!(data_value(&db).await, "by B");
    let (event, detail) = end_of_term(&db, "job", lease.token().get()).await;
    assert_eq!(event, "expired");
    assert_eq!(detail.as_deref(), Some("its holder's session ended"));
    // The unbound lease B holds does not end with B's sessions.
    assert_eq!(
        b.inspect("job").await.expect("inspect").holder_session,
        None
    );
}

async fn ended_session_is_lost_before_anyone_takes_it() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let a = db
        .manager_with("sb-holder", ManagerOptions::default())
        .await;
    // Renewed every 2 s, so that its background renewal comes soon.
    let held = a
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_secs(6))
                .holder("A")
                .session_bound(true),
        )
        .await
        .expect("hold");
    let pid = bound_pid(&a, "job").await;
    terminate(&db, pid).await;
    poll_until("the session is gone", BOUND, || async {
        a.inspect("job").await.is_ok_and(|s| s.session_ended)
    })
    .await;
    let status = a.inspect("job").await.expect("inspect");
    assert!(!status.held, "a lease whose session ended is not held");
    // The guard refuses the token at once, and says why.
    let wrote = fenced_write(&a, "job", held.token(), "stale").await;
    assert!(
        matches!(
            wrote,
            Err(Error::NotHeld {
                reason: NotHeldReason::SessionEnded,
                ..
            })
        ),
        "{wrote:?}"
    );
    assert_eq!(data_value(&db).await, "initial");
    // A renewal reports the loss with its reason (the one-statement
    // renewal, and the background one of the held lease).
    let renewed = a.renew(held.lease(), TTL).await;
    assert!(
        matches!(
            renewed,
            Err(Error::Lost {
                reason: LossReason::SessionEnded,
                ..
            })
        ),
        "{renewed:?}"
    );
    let reason = tokio::time::timeout(BOUND, held.lost())
        .await
        .expect("the held lease is reported lost within its renewal period");
    assert_eq!(reason, LossReason::SessionEnded);
    // The manager's next session-bound lease is on a new session.
    let again = a.acquire("job", as_a()).await.expect("acquire again");
    assert!(again.token() > held.token());
    assert_ne!(bound_pid(&a, "job").await, pid);
}

async fn surviving_session_keeps_the_lease() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["sb_other"], &[]).await;
    let a = db
        .manager_with("sb-holder", ManagerOptions::default())
        .await;
    let other = db.manager_as(&roles[0], ManagerOptions::default()).await;
    let lease = a.acquire("job", as_a()).await.expect("acquire");
    let pid = bound_pid(&a, "job").await;
    // Another role cannot take the session's key while the session
    // lives (and a key decides nothing: the session itself is looked up).
    let mut intruder = db.connect_as(&roles[0]).await;
    let (shared, exclusive): (bool, bool) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT pg_try_advisory_lock_shared(1886155618, {pid}), \
                pg_try_advisory_lock(1886155618, {pid})"
    )))
    .fetch_one(&mut intruder)
    .await
    .expect("try the key");
    assert!(
        !shared && !exclusive,
        "shared {shared}, exclusive {exclusive}"
    );
    let refused = other
        .acquire(
            "job",
            AcquireOptions::ttl(TTL)
                .holder("B")
                .wait(Duration::from_millis(300)),
        )
        .await;
    assert!(
        matches!(refused, Err(Error::Held { ref holder, .. }) if holder == "A"),
        "{refused:?}"
    );
    drop(intruder);
    // The holder keeps its lease: it renews, and the other role may not
    // act under its token.
    a.renew(&lease, TTL).await.expect("renew");
    let foreign = other.release(&lease).await;
    assert!(
        matches!(foreign, Err(Error::NotPermitted { .. })),
        "{foreign:?}"
    );
    let status = a.inspect("job").await.expect("inspect");
    assert!(status.held && !status.session_ended);
    assert_eq!(status.token, Some(lease.token()));
    assert!(a.release(&lease).await.expect("release"));
}

async fn killed_holder_process_frees_the_lease_at_once() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let b = db
        .manager_with("sb-waiter", ManagerOptions::default())
        .await;
    let mut child = crate::common::child_test("session_bound::holder_process")
        .env("PGLEASE_SESSION_CHILD_URL", db.url())
        .env("PGLEASE_CHILD_NAME", "job")
        .stdin(Stdio::piped())
        .spawn()
        .expect("start the holder process");
    let lines = crate::common::stdout_lines(&mut child);
    // libtest may print "test holder_process ... " before it.
    let ready = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + BOUND;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = lines.recv_timeout(left).ok()?;
            if let Some(at) = line.find("ready ") {
                return Some(line[at + 6..].trim().to_owned());
            }
        }
    })
    .await
    .expect("reader")
    .expect("the holder process acquires and says so");
    let (token, pid) = ready.split_once(' ').expect("ready TOKEN PID");
    let token: i64 = token.parse().expect("a token");
    let pid: i32 = pid.parse().expect("a pid");
    let status = b.inspect("job").await.expect("inspect");
    assert_eq!(status.holder_session, Some(pid));
    assert_eq!(status.token.map(|t| t.get()), Some(token));
    let old_expiry = status.expires_at.expect("acquired");
    let waiting = waiter(&b, "job").await;
    child.kill().expect("SIGKILL the holder");
    let _ = child.wait();
    let got = waiting
        .await
        .expect("waiter task")
        .expect("the waiter acquires");
    assert!(got.token().get() > token);
    assert!(
        got.acquired_at() < old_expiry,
        "taken at {} before the old expiry {old_expiry}",
        got.acquired_at()
    );
    let old = crate::common::fence("job", token);
    let wrote = fenced_write(&b, "job", old.token(), "stale").await;
    assert!(matches!(wrote, Err(Error::NotHeld { .. })), "{wrote:?}");
    assert_eq!(data_value(&db).await, "initial");
}

pglease_formations::tests![
    terminated_backend_frees_the_lease_at_once(2),
    ended_session_is_lost_before_anyone_takes_it(2),
    surviving_session_keeps_the_lease(2),
    killed_holder_process_frees_the_lease_at_once(2),
    holder_process ignored,
];
