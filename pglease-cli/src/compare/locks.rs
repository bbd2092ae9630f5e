//! The scenarios against session-level and transaction-level advisory
//! locks.

use std::time::{Duration, Instant};

use pglease::{Error, Result};

use super::Variant;
use super::harness::{Harness, held, pick, relock, unlock_once};

impl Harness {
    pub(super) async fn paused_lock(
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

    pub(super) async fn killed_session(
        &self,
        name: &str,
    ) -> Result<(bool, Option<Duration>, String)> {
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

    pub(super) async fn killed_xact(&self, name: &str) -> Result<(bool, Option<Duration>, String)> {
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

    pub(super) async fn dead_lock(
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

    pub(super) async fn duplicate_session(
        &self,
        name: &str,
    ) -> Result<(bool, Option<Duration>, String)> {
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

    pub(super) async fn duplicate_xact(
        &self,
        name: &str,
    ) -> Result<(bool, Option<Duration>, String)> {
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

    pub(super) async fn timeout_session(
        &self,
        name: &str,
    ) -> Result<(bool, Option<Duration>, String)> {
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

    pub(super) async fn timeout_xact(
        &self,
        name: &str,
    ) -> Result<(bool, Option<Duration>, String)> {
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
