//! The session-level and the transaction-level advisory lock as
//! contenders. Nothing in the database ties a write to either lock; the
//! transaction lock at least ends with the transaction its writes are in.

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use pglease::advisory::{SessionLock, XactLock};
use pglease::{Error, Result};

use super::harness::{Ctx, ms, pick, poll_lock};
use crate::engine::{BoxError, Contender, Fault, Scenario, Seen, Who, Written};

/// Runs `function` (`pg_advisory_unlock` or `pg_try_advisory_lock`) on
/// the lock's key on its own connection, without changing what the lock
/// believes locally; `false` if the connection is gone. An unlock sent
/// this way is what a delayed duplicate release does (session locks
/// count: after lock, unlock, lock, a duplicate unlock frees the second
/// hold); a lock, taking it again on the same session (each lock needs
/// its own unlock).
async fn on_lock_session(lock: &mut SessionLock, function: &str) -> Result<bool> {
    let key = lock.key();
    let Some(conn) = lock.connection() else {
        return Ok(false);
    };
    Ok(
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {function}($1)")))
            .bind(key)
            .fetch_one(conn)
            .await?,
    )
}

/// A session-level advisory lock (`pg_try_advisory_lock`); writes are
/// unguarded (A's code believes it holds the lock and carries on).
pub(super) struct SessionContender {
    ctx: Ctx,
    /// (d): whether the duplicate unlock released A's new hold.
    duplicate: Mutex<Option<bool>>,
    /// (e): the server dropping A's stalled session.
    dropper: Mutex<Option<JoinHandle<Result<()>>>>,
}

impl SessionContender {
    pub(super) fn new(ctx: Ctx) -> SessionContender {
        SessionContender {
            ctx,
            duplicate: Mutex::new(None),
            dropper: Mutex::new(None),
        }
    }
}

impl Contender for SessionContender {
    type Held = SessionLock;

    async fn acquire(&self, _who: Who, wait: Duration) -> Result<Option<SessionLock>, BoxError> {
        Ok(poll_lock(wait, || SessionLock::try_lock(&self.ctx.m, &self.ctx.name)).await?)
    }

    async fn write(&self, _held: &mut SessionLock, who: Who) -> Result<Written, BoxError> {
        self.ctx.write_fresh(who).await
    }

    async fn fault(&self, held: &mut SessionLock, fault: Fault) -> Result<(), BoxError> {
        match fault {
            Fault::Kill => self.ctx.terminate(held.backend_pid()).await?,
            Fault::LateRelease => {
                on_lock_session(held, "pg_advisory_unlock").await?; // A's release
                on_lock_session(held, "pg_try_advisory_lock").await?; // A again, same session
                // The delayed duplicate.
                let duplicate = on_lock_session(held, "pg_advisory_unlock").await?;
                *self.duplicate.lock().await = Some(duplicate);
            }
            Fault::Stall => {
                // A's lock connection stalls (a silent network): nothing
                // tells A, until the server gives up on the session (a TCP
                // timeout) one unit later.
                let (m, pid, unit) = (self.ctx.m.clone(), held.backend_pid(), self.ctx.unit);
                *self.dropper.lock().await = Some(tokio::spawn(async move {
                    tokio::time::sleep(unit).await;
                    sqlx::query("SELECT pg_terminate_backend($1)")
                        .bind(pid)
                        .execute(m.pool())
                        .await?;
                    Ok(())
                }));
            }
            // A paused holder simply does nothing until it resumes.
            Fault::Pause | Fault::Die => {}
        }
        Ok(())
    }

    async fn heal(&self, _fault: Fault) -> Result<(), BoxError> {
        if let Some(dropper) = self.dropper.lock().await.take() {
            dropper.await??;
        }
        Ok(())
    }

    async fn die(&self, held: SessionLock) -> Result<(), BoxError> {
        // The process dies: its connection closes and nothing unlocks
        // first.
        drop(held);
        Ok(())
    }

    async fn release(&self, held: SessionLock) -> Result<Option<bool>, BoxError> {
        // A's connection may be dead by now (the fault): the lock went
        // with it, and there is nothing to release.
        Ok(held.release().await.ok())
    }

    fn detail(&self, scenario: Scenario, seen: &Seen) -> String {
        let b_got_it = seen.took_over.is_some();
        match scenario {
            Scenario::PausedHolder => paused_detail(seen),
            Scenario::KilledConnection => format!(
                "the lock died with the connection: B took over after {} ms; A's write through \
                 a fresh connection was {} (value {:?})",
                ms(seen.took_over),
                applied(seen),
                seen.value()
            ),
            Scenario::DeadHolder => dead_detail(seen),
            Scenario::LateRelease => format!(
                "session locks carry no identity: the duplicate unlock {} A's new hold, and B {} \
                 while A believed it held the lock",
                pick(
                    self.duplicate.try_lock().ok().and_then(|d| *d) == Some(true),
                    "RELEASED",
                    "did not release"
                ),
                pick(b_got_it, "TOOK IT", "could not take it")
            ),
            Scenario::SilentRenewal => format!(
                "nothing stops A: no expiry, no signal; B took over {} ms into the stall, once \
                 the server had dropped A's session, and A's next write was {} (value {:?})",
                ms(seen.took_over),
                applied(seen),
                seen.value()
            ),
        }
    }
}

/// A's write after B's, in words.
fn applied(seen: &Seen) -> &'static str {
    match (&seen.a_wrote, seen.b_wrote) {
        (Some(Written::Committed), true) => "APPLIED after B's",
        (Some(Written::Committed), false) => "applied",
        _ => "refused",
    }
}

fn paused_detail(seen: &Seen) -> String {
    format!(
        "nothing expires: B could not take over during A's {} ms pause (a paused holder blocks \
         everyone for as long as it pauses); A's write then landed as the legitimate holder's",
        seen.window.as_millis()
    )
}

fn dead_detail(seen: &Seen) -> String {
    format!(
        "B took over {} ms after the connection closed; a frozen process or a silent network \
         keeps the lock until TCP keepalive gives up (minutes by default)",
        ms(seen.took_over)
    )
}

/// A's or B's transaction lock, with its connection's pid; `None` once
/// its transaction has ended.
pub(super) struct XactHeld {
    lock: Option<XactLock>,
    pid: i32,
}

/// A transaction-level advisory lock (`pg_try_advisory_xact_lock`), with
/// the writes in the same transaction.
pub(super) struct XactContender {
    ctx: Ctx,
    /// (d): whether the late unlock released the lock.
    duplicate: Mutex<Option<bool>>,
    /// (e): the stalled transaction's pid, which the server gives up on.
    stalled: Mutex<Option<i32>>,
}

impl XactContender {
    pub(super) fn new(ctx: Ctx) -> XactContender {
        XactContender {
            ctx,
            duplicate: Mutex::new(None),
            stalled: Mutex::new(None),
        }
    }

    async fn take(&self, wait: Duration) -> Result<Option<XactHeld>, Error> {
        let Some(mut lock) =
            poll_lock(wait, || XactLock::try_lock(&self.ctx.m, &self.ctx.name)).await?
        else {
            return Ok(None);
        };
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *lock)
            .await?;
        Ok(Some(XactHeld {
            lock: Some(lock),
            pid,
        }))
    }
}

impl Contender for XactContender {
    type Held = XactHeld;

    async fn acquire(&self, _who: Who, wait: Duration) -> Result<Option<XactHeld>, BoxError> {
        Ok(self.take(wait).await?)
    }

    async fn write(&self, held: &mut XactHeld, who: Who) -> Result<Written, BoxError> {
        let Some(mut lock) = held.lock.take() else {
            return Ok(Written::Refused("its transaction has ended".to_owned()));
        };
        let outcome = async {
            self.ctx.write_on(&mut lock, who).await?;
            lock.commit().await
        };
        // A dead connection is the end of the transaction, not an error
        // of the scenario.
        Ok(match outcome.await {
            Ok(()) => Written::Committed,
            Err(e) => Written::Refused(e.to_string()),
        })
    }

    async fn stage(&self, held: &mut XactHeld, who: Who) -> Result<bool, BoxError> {
        // Only where the fault cannot hold a commit up (a killed
        // connection): in-process, a paused holder's commit would not
        // pause.
        if self.ctx.scenario != Scenario::KilledConnection {
            return Ok(false);
        }
        if let Some(lock) = held.lock.as_mut() {
            self.ctx.write_on(lock, who).await?;
        }
        Ok(true)
    }

    async fn commit(&self, held: &mut XactHeld) -> Result<Written, BoxError> {
        let Some(lock) = held.lock.take() else {
            return Ok(Written::Refused("its transaction has ended".to_owned()));
        };
        Ok(match lock.commit().await {
            Ok(()) => Written::Committed,
            Err(e) => Written::Refused(e.to_string()),
        })
    }

    async fn fault(&self, held: &mut XactHeld, fault: Fault) -> Result<(), BoxError> {
        match fault {
            Fault::Kill => self.ctx.terminate(held.pid).await?,
            Fault::LateRelease => {
                if let Some(first) = held.lock.take() {
                    first.commit().await?; // A's release
                }
                let mut second = self
                    .take(Duration::ZERO)
                    .await?
                    .ok_or("A could not take the free lock again")?;
                // The only release message there is, sent late on A's
                // connection.
                if let Some(lock) = second.lock.as_mut() {
                    let key = lock.key();
                    let duplicate: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
                        .bind(key)
                        .fetch_one(&mut **lock)
                        .await?;
                    *self.duplicate.lock().await = Some(duplicate);
                }
                *held = second;
            }
            // The transaction stalls: it holds the lock and sends nothing.
            Fault::Stall => *self.stalled.lock().await = Some(held.pid),
            Fault::Pause | Fault::Die => {}
        }
        Ok(())
    }

    async fn heal(&self, _fault: Fault) -> Result<(), BoxError> {
        // The server gives up on the stalled transaction.
        if let Some(pid) = self.stalled.lock().await.take() {
            self.ctx.terminate(pid).await?;
        }
        Ok(())
    }

    async fn die(&self, held: XactHeld) -> Result<(), BoxError> {
        self.ctx.terminate(held.pid).await?;
        drop(held);
        Ok(())
    }

    async fn release(&self, held: XactHeld) -> Result<Option<bool>, BoxError> {
        // Ended with its transaction already, or rolled back with its
        // connection if that is dead.
        let Some(lock) = held.lock else {
            return Ok(Some(false));
        };
        Ok(lock.rollback().await.ok().map(|()| true))
    }

    fn detail(&self, scenario: Scenario, seen: &Seen) -> String {
        let b_got_it = seen.took_over.is_some();
        match scenario {
            Scenario::PausedHolder => paused_detail(seen),
            Scenario::KilledConnection => format!(
                "A's uncommitted write was rolled back with its transaction and B took over \
                 after {} ms; A's commit {} (a retry must take the lock afresh, after B)",
                ms(seen.took_over),
                match &seen.a_wrote {
                    Some(Written::Committed) => "LANDED".to_owned(),
                    Some(Written::Refused(why)) => format!("failed: {why}"),
                    None => "was not sent".to_owned(),
                }
            ),
            Scenario::DeadHolder => dead_detail(seen),
            Scenario::LateRelease => format!(
                "a transaction lock is released only by its transaction's end; a late unlock {} \
                 it, and B {}",
                pick(
                    self.duplicate.try_lock().ok().and_then(|d| *d) == Some(true),
                    "RELEASED",
                    "did not release"
                ),
                pick(b_got_it, "TOOK IT", "could not take it")
            ),
            Scenario::SilentRenewal => format!(
                "new work must take the lock in its own transaction: it was {} for {} ms while \
                 the stalled transaction held it (whose writes rolled back when it was killed)",
                pick(b_got_it, "ALLOWED", "refused"),
                seen.window.as_millis()
            ),
        }
    }
}
