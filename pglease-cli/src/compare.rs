//! The article's failure scenarios, run live against the database for a
//! lease with fencing, a session-level advisory lock and a
//! transaction-level advisory lock. Every outcome is measured, not
//! assumed: whether a stale write landed, whether another worker could take
//! over without the old holder's cooperation, and how long that took.
//!
//! Used by the test suite and by `pglease demo`.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

use pglease::{Acquire, Error, Fence, LeaseManager, Result, SessionLock, Token, XactLock};

/// A way of guarding a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// A pglease lease with fenced (database-checked) writes.
    Lease,
    /// A session-level advisory lock (`pg_try_advisory_lock`).
    SessionLock,
    /// A transaction-level advisory lock (`pg_try_advisory_xact_lock`),
    /// with the writes in the same transaction.
    XactLock,
}

impl Variant {
    /// All variants, in table order.
    pub const ALL: [Variant; 3] = [Variant::Lease, Variant::SessionLock, Variant::XactLock];

    /// A short label.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Lease => "lease + fencing",
            Variant::SessionLock => "session advisory lock",
            Variant::XactLock => "transaction advisory lock",
        }
    }
}

/// A failure scenario from the article.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// (a) The holder pauses past the TTL, another worker takes over and
    /// writes, then the first holder's delayed write arrives.
    PausedHolder,
    /// (b) The holder's connection is killed, another worker takes over,
    /// then the first holder writes through a fresh connection.
    KilledConnection,
    /// (c) The holder process dies without releasing.
    DeadHolder,
    /// (d) A delayed duplicate release arrives after the same holder
    /// acquired again.
    DuplicateRelease,
    /// (e) The holder's own renewal (or liveness check) gets no answer:
    /// does anything stop it from starting new work?
    RenewalTimeout,
}

impl Scenario {
    /// All scenarios, in table order.
    pub const ALL: [Scenario; 5] = [
        Scenario::PausedHolder,
        Scenario::KilledConnection,
        Scenario::DeadHolder,
        Scenario::DuplicateRelease,
        Scenario::RenewalTimeout,
    ];

    /// A short label.
    pub fn label(self) -> &'static str {
        match self {
            Scenario::PausedHolder => "(a) holder pauses past the TTL",
            Scenario::KilledConnection => "(b) holder's connection killed",
            Scenario::DeadHolder => "(c) holder dies without releasing",
            Scenario::DuplicateRelease => "(d) delayed duplicate release",
            Scenario::RenewalTimeout => "(e) holder's renewal gets no answer",
        }
    }
}

/// What one scenario did to one variant, as measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The scenario.
    pub scenario: Scenario,
    /// The variant.
    pub variant: Variant,
    /// No write from a holder that had lost its right landed, and no two
    /// workers could act as holders at once.
    pub safe: bool,
    /// How long until another worker held the resource without the old
    /// holder's cooperation; `None` if it could not within the scenario.
    pub took_over: Option<Duration>,
    /// What happened, in one sentence with the measured figures.
    pub detail: String,
}

/// Runs every scenario against every variant, reporting each outcome as it
/// is measured. `unit` scales the scenario (a lease's TTL is two units);
/// the whole run takes about 25 units. Creates a table of its own for the
/// guarded data and drops it afterwards; lease and lock names carry the
/// process id.
pub async fn run(
    manager: &LeaseManager,
    unit: Duration,
    mut report: impl FnMut(&Outcome),
) -> Result<Vec<Outcome>> {
    let tag = format!("{}_{}", std::process::id(), unique());
    let table = format!("pglease_compare_{tag}");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id int PRIMARY KEY, value text NOT NULL)"
    )))
    .execute(manager.pool())
    .await?;
    let h = Harness {
        m: manager.clone(),
        table: table.clone(),
        tag,
        unit,
    };
    let mut outcomes = Vec::new();
    let mut failure = None;
    'all: for scenario in Scenario::ALL {
        for variant in Variant::ALL {
            match h.run(scenario, variant).await {
                Ok(outcome) => {
                    report(&outcome);
                    outcomes.push(outcome);
                }
                Err(e) => {
                    failure = Some(e);
                    break 'all;
                }
            }
        }
    }
    let dropped = sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
        .execute(manager.pool())
        .await;
    if let Some(e) = failure {
        return Err(e);
    }
    dropped?;
    Ok(outcomes)
}

/// The outcomes as a Markdown table: one row per scenario, one column per
/// variant; each cell says "safe" or "UNSAFE" and the time to takeover.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut out = String::from("| scenario |");
    for v in Variant::ALL {
        out.push_str(&format!(" {} |", v.label()));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(Variant::ALL.len()));
    for s in Scenario::ALL {
        out.push_str(&format!("\n| {} |", s.label()));
        for v in Variant::ALL {
            let cell = match outcomes.iter().find(|o| o.scenario == s && o.variant == v) {
                Some(o) => {
                    let verdict = if o.safe { "safe" } else { "UNSAFE" };
                    match o.took_over {
                        Some(t) => format!("{verdict}; taken over after {} ms", t.as_millis()),
                        None => format!("{verdict}; no takeover"),
                    }
                }
                None => "not run".to_owned(),
            };
            out.push_str(&format!(" {cell} |"));
        }
    }
    out
}

fn unique() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

struct Harness {
    m: LeaseManager,
    table: String,
    tag: String,
    unit: Duration,
}

impl Harness {
    async fn run(&self, scenario: Scenario, variant: Variant) -> Result<Outcome> {
        let name = format!("compare-{}-{:?}-{:?}", self.tag, scenario, variant);
        self.reset().await?;
        let (safe, took_over, detail) = match (scenario, variant) {
            (Scenario::PausedHolder, Variant::Lease) => self.paused_lease(&name).await?,
            (Scenario::PausedHolder, _) => self.paused_lock(&name, variant).await?,
            (Scenario::KilledConnection, Variant::Lease) => self.killed_lease(&name).await?,
            (Scenario::KilledConnection, Variant::SessionLock) => {
                self.killed_session(&name).await?
            }
            (Scenario::KilledConnection, Variant::XactLock) => self.killed_xact(&name).await?,
            (Scenario::DeadHolder, Variant::Lease) => self.dead_lease(&name).await?,
            (Scenario::DeadHolder, _) => self.dead_lock(&name, variant).await?,
            (Scenario::DuplicateRelease, Variant::Lease) => self.duplicate_lease(&name).await?,
            (Scenario::DuplicateRelease, Variant::SessionLock) => {
                self.duplicate_session(&name).await?
            }
            (Scenario::DuplicateRelease, Variant::XactLock) => self.duplicate_xact(&name).await?,
            (Scenario::RenewalTimeout, Variant::Lease) => self.timeout_lease(&name).await?,
            (Scenario::RenewalTimeout, Variant::SessionLock) => self.timeout_session(&name).await?,
            (Scenario::RenewalTimeout, Variant::XactLock) => self.timeout_xact(&name).await?,
        };
        Ok(Outcome {
            scenario,
            variant,
            safe,
            took_over,
            detail,
        })
    }

    /// Worker A's session lock on `name` (which nobody else holds yet).
    async fn session(&self, name: &str) -> Result<SessionLock> {
        self.m
            .try_session_lock(name)
            .await?
            .ok_or_else(|| held(name))
    }

    /// Worker A's transaction lock on `name`.
    async fn xact(&self, name: &str) -> Result<XactLock> {
        self.m.try_xact_lock(name).await?.ok_or_else(|| held(name))
    }

    fn ttl(&self) -> Duration {
        self.unit * 2
    }

    async fn reset(&self) -> Result<()> {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} VALUES (1, 'initial') ON CONFLICT (id) DO UPDATE SET value = 'initial'",
            self.table
        )))
        .execute(self.m.pool())
        .await?;
        Ok(())
    }

    fn update(&self) -> String {
        format!("UPDATE {} SET value = $1 WHERE id = 1", self.table)
    }

    /// An unguarded write on any connection.
    async fn write(&self, conn: &mut PgConnection, who: &str) -> Result<()> {
        sqlx::query(AssertSqlSafe(self.update()))
            .bind(who)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// A write through a fresh connection of the pool.
    async fn write_fresh(&self, who: &str) -> Result<()> {
        let mut conn = self.m.pool().acquire().await?;
        self.write(&mut conn, who).await
    }

    /// A fenced write: `Ok(true)` if it committed, `Ok(false)` if the
    /// database rejected the token (LE001).
    async fn fenced_write(&self, lease: &Fence, who: &str) -> Result<bool> {
        let update = self.update();
        let outcome = self
            .m
            .fenced(lease, async |conn| {
                sqlx::query(AssertSqlSafe(update))
                    .bind(who)
                    .execute(&mut *conn)
                    .await
                    .map_err(Error::from)?;
                Ok::<_, Error>(())
            })
            .await;
        match outcome {
            Ok(()) => Ok(true),
            Err(Error::NotHeld { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn value(&self) -> Result<String> {
        let value: String = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT value FROM {} WHERE id = 1",
            self.table
        )))
        .fetch_one(self.m.pool())
        .await?;
        Ok(value)
    }

    async fn db_now(&self) -> Result<DateTime<Utc>> {
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(self.m.pool())
            .await?;
        Ok(now)
    }

    /// Sleeps until the database clock is past `instant` (a pause that
    /// outlasts a lease, by the clock that decides expiry).
    async fn pause_until(&self, instant: DateTime<Utc>) -> Result<()> {
        loop {
            let now = self.db_now().await?;
            if now > instant {
                return Ok(());
            }
            let left = (instant - now).to_std().unwrap_or_default();
            tokio::time::sleep(left.min(self.unit) + Duration::from_millis(1)).await;
        }
    }

    async fn terminate(&self, pid: i32) -> Result<()> {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(self.m.pool())
            .await?;
        Ok(())
    }

    /// Polls `try_session_lock` for worker B until it succeeds or `limit`
    /// passes; returns the lock and how long it took.
    async fn b_session_lock(
        &self,
        name: &str,
        limit: Duration,
    ) -> Result<Option<(SessionLock, Duration)>> {
        poll_lock(limit, || self.m.try_session_lock(name)).await
    }

    /// The same with `try_xact_lock`.
    async fn b_xact_lock(
        &self,
        name: &str,
        limit: Duration,
    ) -> Result<Option<(XactLock, Duration)>> {
        poll_lock(limit, || self.m.try_xact_lock(name)).await
    }

    // (a) ------------------------------------------------------------

    async fn paused_lease(&self, name: &str) -> Result<(bool, Option<Duration>, String)> {
        let start = Instant::now();
        let a = self
            .m
            .acquire(name, Acquire::ttl(self.ttl()).holder("A"))
            .await?;
        self.pause_until(a.expires_at()).await?;
        let b = self
            .m
            .acquire(name, Acquire::ttl(self.ttl()).holder("B"))
            .await?;
        let took_over = start.elapsed();
        let b_wrote = self.fenced_write(b.fence(), "B").await?;
        let a_landed = self.fenced_write(a.fence(), "A").await?;
        self.m.release(&b).await?;
        let value = self.value().await?;
        let safe = b_wrote && !a_landed && value == "B";
        Ok((
            safe,
            Some(took_over),
            format!(
                "B took over after {} ms (the TTL); A's delayed write with token {} was {} \
                 (value {value:?})",
                took_over.as_millis(),
                a.token(),
                if a_landed {
                    "APPLIED"
                } else {
                    "rejected by the database (LE001)"
                }
            ),
        ))
    }

    async fn paused_lock(
        &self,
        name: &str,
        variant: Variant,
    ) -> Result<(bool, Option<Duration>, String)> {
        let pause = self.unit * 3;
        let b_got_it;
        match variant {
            Variant::SessionLock => {
                let mut a = self.session(name).await?;
                let b = self.b_session_lock(name, pause).await?;
                b_got_it = b.is_some();
                if let Some(conn) = a.connection() {
                    self.write(conn, "A").await?;
                }
                a.release().await?;
                if let Some((b, _)) = b {
                    b.release().await?;
                }
            }
            _ => {
                let mut a = self.xact(name).await?;
                let b = self.b_xact_lock(name, pause).await?;
                b_got_it = b.is_some();
                self.write(&mut a, "A").await?;
                a.commit().await?;
                if let Some((b, _)) = b {
                    b.rollback().await?;
                }
            }
        }
        let value = self.value().await?;
        Ok((
            !b_got_it && value == "A",
            None,
            format!(
                "nothing expires: B could not take over during A's {} ms pause (a paused holder \
                 blocks everyone for as long as it pauses); A's write then landed as the \
                 legitimate holder's",
                pause.as_millis()
            ),
        ))
    }

    // (b) ------------------------------------------------------------

    async fn killed_lease(&self, name: &str) -> Result<(bool, Option<Duration>, String)> {
        // A acquires on a connection of its own, which is then killed.
        let mut conn = PgConnection::connect_with(&self.m.pool().connect_options()).await?;
        let (token, pid): (i64, i32) =
            sqlx::query_as("SELECT token, pg_backend_pid() FROM pglease.acquire($1, 'A', $2)")
                .bind(name)
                .bind(self.ttl())
                .fetch_one(&mut conn)
                .await?;
        self.terminate(pid).await?;
        drop(conn);
        let start = Instant::now();
        let b = self
            .m
            .acquire(
                name,
                Acquire::ttl(self.ttl()).holder("B").wait(self.unit * 10),
            )
            .await?;
        let took_over = start.elapsed();
        self.fenced_write(b.fence(), "B").await?;
        let a_landed = self
            .fenced_write(&Fence::new(name, Token::new(token)?)?, "A")
            .await?;
        self.m.release(&b).await?;
        let value = self.value().await?;
        Ok((
            !a_landed && value == "B",
            Some(took_over),
            format!(
                "the lease outlived the killed connection; B took over {} ms later, at its \
                 expiry; A's write through a fresh connection was {}",
                took_over.as_millis(),
                if a_landed {
                    "APPLIED"
                } else {
                    "rejected by the database (LE001)"
                }
            ),
        ))
    }

    async fn killed_session(&self, name: &str) -> Result<(bool, Option<Duration>, String)> {
        let mut a = self.session(name).await?;
        self.terminate(a.backend_pid()).await?;
        let (b, took_over) = self
            .b_session_lock(name, self.unit * 10)
            .await?
            .ok_or_else(|| held(name))?;
        self.write_fresh("B").await?;
        // A's code still believes it holds the lock and carries on.
        self.write_fresh("A").await?;
        let noticed = a.is_held().await.is_err();
        b.release().await?;
        drop(a);
        let value = self.value().await?;
        Ok((
            value != "A",
            Some(took_over),
            format!(
                "the lock died with the connection: B took over after {} ms; A's write through a \
                 fresh connection was APPLIED after B's (value {value:?}); A {} have noticed by \
                 asking its dead connection",
                took_over.as_millis(),
                if noticed { "could" } else { "could not" }
            ),
        ))
    }

    async fn killed_xact(&self, name: &str) -> Result<(bool, Option<Duration>, String)> {
        let mut a = self.xact(name).await?;
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *a)
            .await?;
        self.write(&mut a, "A (uncommitted)").await?;
        self.terminate(pid).await?;
        let start = Instant::now();
        let (mut b, _) = self
            .b_xact_lock(name, self.unit * 10)
            .await?
            .ok_or_else(|| held(name))?;
        let took_over = start.elapsed();
        self.write(&mut b, "B").await?;
        b.commit().await?;
        drop(a);
        let value_after_b = self.value().await?;
        // A redoes its unit of work, lock included, in a new transaction.
        let mut again = self.xact(name).await?;
        self.write(&mut again, "A").await?;
        again.commit().await?;
        Ok((
            value_after_b == "B",
            Some(took_over),
            format!(
                "A's uncommitted write was rolled back with its transaction and B took over \
                 after {} ms; A's retry took the lock afresh after B committed (serialized, \
                 not stale)",
                took_over.as_millis()
            ),
        ))
    }

    // (c) ------------------------------------------------------------

    async fn dead_lease(&self, name: &str) -> Result<(bool, Option<Duration>, String)> {
        let start = Instant::now();
        self.m
            .acquire(name, Acquire::ttl(self.ttl()).holder("A"))
            .await?;
        // A dies here. B waits for the lease.
        let b = self
            .m
            .acquire(
                name,
                Acquire::ttl(self.ttl()).holder("B").wait(self.unit * 10),
            )
            .await?;
        let took_over = start.elapsed();
        self.m.release(&b).await?;
        Ok((
            b.token() > 0,
            Some(took_over),
            format!(
                "B took over {} ms after A's acquisition (TTL {} ms), whatever state A's host \
                 is in",
                took_over.as_millis(),
                self.ttl().as_millis()
            ),
        ))
    }

    async fn dead_lock(
        &self,
        name: &str,
        variant: Variant,
    ) -> Result<(bool, Option<Duration>, String)> {
        let took_over = match variant {
            Variant::SessionLock => {
                let a = self.session(name).await?;
                // The process dies: its connection closes and nothing
                // unlocks first.
                drop(a);
                let start = Instant::now();
                let (b, _) = self
                    .b_session_lock(name, self.unit * 10)
                    .await?
                    .ok_or_else(|| held(name))?;
                let took = start.elapsed();
                b.release().await?;
                took
            }
            _ => {
                let mut a = self.xact(name).await?;
                let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(&mut *a)
                    .await?;
                self.terminate(pid).await?;
                let start = Instant::now();
                let (b, _) = self
                    .b_xact_lock(name, self.unit * 10)
                    .await?
                    .ok_or_else(|| held(name))?;
                let took = start.elapsed();
                b.rollback().await?;
                drop(a);
                took
            }
        };
        Ok((
            true,
            Some(took_over),
            format!(
                "B took over {} ms after the connection closed; a frozen process or a silent \
                 network keeps the lock until TCP keepalive gives up (minutes by default)",
                took_over.as_millis()
            ),
        ))
    }

    // (d) ------------------------------------------------------------

    async fn duplicate_lease(&self, name: &str) -> Result<(bool, Option<Duration>, String)> {
        let first = self
            .m
            .acquire(name, Acquire::ttl(self.ttl() * 10).holder("A"))
            .await?;
        self.m.release(&first).await?;
        let second = self
            .m
            .acquire(name, Acquire::ttl(self.ttl() * 10).holder("A"))
            .await?;
        let duplicate = self.m.release(&first).await?;
        let b_got_it = match self
            .m
            .acquire(name, Acquire::ttl(self.ttl()).holder("B"))
            .await
        {
            Ok(b) => {
                self.m.release(&b).await?;
                true
            }
            Err(Error::Held { .. }) => false,
            Err(e) => return Err(e),
        };
        self.m.release(&second).await?;
        Ok((
            !duplicate && !b_got_it,
            None,
            format!(
                "the delayed release carried token {}, not the current {}: {}",
                first.token(),
                second.token(),
                if duplicate {
                    "it ENDED the new hold"
                } else {
                    "ignored, A still holds it"
                }
            ),
        ))
    }

    async fn duplicate_session(&self, name: &str) -> Result<(bool, Option<Duration>, String)> {
        let mut a = self.session(name).await?;
        unlock_once(&mut a).await?; // A's release
        relock(&mut a).await?; // A acquires again, same session
        let start = Instant::now();
        let duplicate = unlock_once(&mut a).await?; // the delayed duplicate
        let b = self.m.try_session_lock(name).await?;
        let took_over = b.as_ref().map(|_| start.elapsed());
        let b_got_it = b.is_some();
        if let Some(b) = b {
            b.release().await?;
        }
        a.release().await?;
        Ok((
            !b_got_it,
            took_over,
            format!(
                "session locks carry no identity: the duplicate unlock {} A's new hold, and B {} \
                 while A believed it held the lock",
                pick(duplicate, "RELEASED", "did not release"),
                pick(b_got_it, "TOOK IT", "could not take it")
            ),
        ))
    }

    async fn duplicate_xact(&self, name: &str) -> Result<(bool, Option<Duration>, String)> {
        let first = self.xact(name).await?;
        first.commit().await?; // A's release
        let mut second = self.xact(name).await?;
        // The only release message there is, sent late on A's connection.
        let duplicate: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
            .bind(second.key())
            .fetch_one(&mut *second)
            .await?;
        let b = self.m.try_xact_lock(name).await?;
        let b_got_it = b.is_some();
        if let Some(b) = b {
            b.rollback().await?;
        }
        second.commit().await?;
        Ok((
            !duplicate && !b_got_it,
            None,
            format!(
                "a transaction lock is released only by its transaction's end; a late unlock \
                 {} it, and B {}",
                pick(duplicate, "RELEASED", "did not release"),
                pick(b_got_it, "TOOK IT", "could not take it")
            ),
        ))
    }

    // (e) ------------------------------------------------------------

    async fn timeout_lease(&self, name: &str) -> Result<(bool, Option<Duration>, String)> {
        let ttl = self.unit * 3;
        let held = self.m.hold(name, Acquire::ttl(ttl).holder("A")).await?;
        // Every renewal from now on blocks behind this row lock.
        let mut blocker = PgConnection::connect_with(&self.m.pool().connect_options()).await?;
        let mut tx = blocker.begin().await?;
        sqlx::query("SELECT 1 FROM pglease.leases WHERE name = $1 FOR UPDATE")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let start = Instant::now();
        let limit = ttl * 3;
        let reason = tokio::time::timeout(limit, held.lost()).await.ok();
        let told_after = start.elapsed();
        let db_valid: bool = sqlx::query_scalar("SELECT held FROM pglease.status WHERE name = $1")
            .bind(name)
            .fetch_one(self.m.pool())
            .await?;
        // Unblock first: a fenced transaction that does reach the database
        // would wait behind the blocker's row lock.
        tx.rollback().await?;
        let refused = match held.begin_fenced().await {
            Err(Error::Lost { .. }) => true,
            Ok(tx) => {
                tx.rollback().await?;
                false
            }
            Err(e) => return Err(e),
        };
        drop(held);
        let safe = reason.is_some() && refused;
        Ok((
            safe,
            None,
            match reason {
                Some(reason) => format!(
                    "the loss signal fired {} ms into the unanswered renewals ({reason}), while \
                     the database {} the lease valid; new fenced work was {}",
                    told_after.as_millis(),
                    if db_valid {
                        "still considered"
                    } else {
                        "no longer considered"
                    },
                    if refused { "refused" } else { "ALLOWED" }
                ),
                None => format!("NO loss signal within {} ms", limit.as_millis()),
            },
        ))
    }

    async fn timeout_session(&self, name: &str) -> Result<(bool, Option<Duration>, String)> {
        let mut a = self.session(name).await?;
        let pid = a.backend_pid();
        // A's lock connection stalls (a statement that hangs stands for a
        // silent network); A's liveness check on it gets no answer.
        let stall = self.unit * 20;
        let check = async {
            let conn = a.connection().ok_or_else(|| held(name))?;
            sqlx::query("SELECT pg_sleep($1)")
                .bind(stall.as_secs_f64())
                .execute(conn)
                .await
                .map_err(Error::from)
        };
        let probe = async {
            tokio::time::sleep(self.unit).await;
            // Nothing tells A to stop: it starts new work.
            self.write_fresh("A (new work)").await?;
            // The server gives up on the stalled session (a TCP timeout).
            self.terminate(pid).await?;
            let start = Instant::now();
            let (b, _) = self
                .b_session_lock(name, self.unit * 10)
                .await?
                .ok_or_else(|| held(name))?;
            let took = start.elapsed();
            self.write_fresh("B").await?;
            // A, never told, starts its next piece of work.
            self.write_fresh("A").await?;
            b.release().await?;
            Ok::<_, Error>(took)
        };
        let (_, took) = tokio::join!(check, probe);
        let took = took?;
        drop(a);
        let value = self.value().await?;
        Ok((
            value != "A",
            Some(took),
            format!(
                "nothing stops A: no expiry, no signal; it kept starting work while its check \
                 hung, B took over {} ms after the server dropped A's session, and A's next \
                 write was APPLIED after B's (value {value:?})",
                took.as_millis()
            ),
        ))
    }

    async fn timeout_xact(&self, name: &str) -> Result<(bool, Option<Duration>, String)> {
        let mut a = self.xact(name).await?;
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *a)
            .await?;
        let stall = self.unit * 20;
        let stalled = async {
            sqlx::query("SELECT pg_sleep($1)")
                .bind(stall.as_secs_f64())
                .execute(&mut *a)
                .await
        };
        let probe = async {
            tokio::time::sleep(self.unit).await;
            // New work needs the lock again, in its own transaction.
            let second = self.m.try_xact_lock(name).await?;
            let refused = second.is_none();
            if let Some(second) = second {
                second.rollback().await?;
            }
            self.terminate(pid).await?;
            Ok::<_, Error>(refused)
        };
        let (_, refused) = tokio::join!(stalled, probe);
        let refused = refused?;
        drop(a);
        Ok((
            refused,
            None,
            format!(
                "new work must take the lock in its own transaction: it was {} while the stalled \
                 transaction held it (whose writes roll back if it is killed)",
                if refused { "refused" } else { "ALLOWED" }
            ),
        ))
    }
}

/// Calls `attempt` every 2 ms until it yields a lock or `limit` passes.
async fn poll_lock<L, F, Fut>(limit: Duration, mut attempt: F) -> Result<Option<(L, Duration)>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<L>>>,
{
    let start = Instant::now();
    loop {
        if let Some(lock) = attempt().await? {
            return Ok(Some((lock, start.elapsed())));
        }
        if start.elapsed() > limit {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn pick(flag: bool, yes: &'static str, no: &'static str) -> &'static str {
    if flag { yes } else { no }
}

fn held(name: &str) -> Error {
    Error::Held {
        name: name.to_owned(),
        holder: "another session".to_owned(),
        expires_at: DateTime::<Utc>::MAX_UTC,
    }
}

/// Sends an unlock for the lock's key on its connection without giving the
/// lock up locally: what a delayed duplicate release does. Session locks
/// count: after lock, unlock, lock, a duplicate unlock frees the second hold.
async fn unlock_once(lock: &mut SessionLock) -> Result<bool> {
    let key = lock.key();
    let Some(conn) = lock.connection() else {
        return Ok(false);
    };
    Ok(sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .fetch_one(conn)
        .await?)
}

/// Takes the lock again on the same connection (session locks are
/// re-entrant: each lock needs its own unlock).
async fn relock(lock: &mut SessionLock) -> Result<bool> {
    let key = lock.key();
    let Some(conn) = lock.connection() else {
        return Ok(false);
    };
    Ok(sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(conn)
        .await?)
}
