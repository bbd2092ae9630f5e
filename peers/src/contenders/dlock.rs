//! distributed-lock-postgres 0.2.0, session mode (its default): a session
//! advisory lock behind a lock trait. Its handle offers no connection to
//! write through, so writes go through the application's pool while the
//! lock is held.

use std::time::{Duration, Instant};

use distributed_lock_core::error::LockError;
use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use distributed_lock_postgres::PostgresLockProvider;
use distributed_lock_postgres::handle::PostgresLockHandle;
use pglease_scenarios::engine::{BoxError, Contender, Fault, Scenario, Seen, Who, Written};
use sqlx08::postgres::PgPool;
use tokio::sync::Mutex;

use super::{Setting, committed, net, takeover_text, written_text};

/// A holder's lock and the pool its writes go through.
pub(crate) struct Held {
    handle: PostgresLockHandle,
    pool: PgPool,
}

#[derive(Default)]
struct Notes {
    /// (a): A's write, uncommitted.
    staged: Option<sqlx08::Transaction<'static, sqlx08::Postgres>>,
    /// What A's lost token said when A wrote after the fault.
    lost: Option<bool>,
}

pub(crate) struct DlockContender<'a> {
    s: &'a Setting,
    a: (PostgresLockProvider, PgPool),
    b: (PostgresLockProvider, PgPool),
    notes: Mutex<Notes>,
}

impl<'a> DlockContender<'a> {
    pub(crate) async fn new(s: &'a Setting) -> Result<DlockContender<'a>, BoxError> {
        let a_pool = net::proxied_pool(&s.db, &s.proxy).await?;
        let b_pool = crate::pool(&s.db, "peer-B").await?;
        Ok(DlockContender {
            s,
            a: (crate::dlock(a_pool.clone()).await?, a_pool),
            b: (crate::dlock(b_pool.clone()).await?, b_pool),
            notes: Mutex::new(Notes::default()),
        })
    }
}

impl Contender for DlockContender<'_> {
    type Held = Held;

    fn lacks(&self, scenario: Scenario) -> Option<&'static str> {
        (scenario == Scenario::LateRelease).then_some(
            "release consumes the handle and waits for the unlock's answer, so the API cannot \
             send a release late or twice",
        )
    }

    async fn acquire(&self, who: Who, wait: Duration) -> Result<Option<Held>, BoxError> {
        let (provider, pool) = match who {
            Who::A => &self.a,
            Who::B => &self.b,
        };
        let lock = provider.create_lock("res");
        let handle = if wait.is_zero() {
            lock.try_acquire().await?
        } else {
            match lock.acquire(Some(wait)).await {
                Ok(handle) => Some(handle),
                Err(LockError::Timeout(_)) => None,
                Err(e) => return Err(e.into()),
            }
        };
        Ok(handle.map(|handle| Held {
            handle,
            pool: pool.clone(),
        }))
    }

    async fn write(&self, held: &mut Held, who: Who) -> Result<Written, BoxError> {
        if who == Who::A {
            // The library's signal for a lost lock, as A writes.
            self.notes.lock().await.lost = Some(*held.handle.lost_token().borrow());
        }
        self.s.write(&held.pool, who).await
    }

    async fn stage(&self, held: &mut Held, who: Who) -> Result<bool, BoxError> {
        if self.s.scenario != Scenario::PausedHolder {
            return Ok(false);
        }
        // A transaction of the application's own, while holding the lock.
        let mut tx = held.pool.begin().await?;
        sqlx08::query(&self.s.ledger.insert())
            .bind(who.name())
            .execute(&mut *tx)
            .await?;
        self.notes.lock().await.staged = Some(tx);
        Ok(true)
    }

    async fn commit(&self, _held: &mut Held) -> Result<Written, BoxError> {
        let tx = self
            .notes
            .lock()
            .await
            .staged
            .take()
            .ok_or("nothing staged")?;
        Ok(committed(tx.commit().await))
    }

    async fn fault(&self, _held: &mut Held, fault: Fault) -> Result<(), BoxError> {
        self.s.fault(fault).await?;
        Ok(())
    }

    async fn heal(&self, _fault: Fault) -> Result<(), BoxError> {
        self.s.heal();
        Ok(())
    }

    async fn die(&self, held: Held) -> Result<(), BoxError> {
        drop(held);
        Ok(())
    }

    async fn told(&self, held: &Held, limit: Duration) -> Result<Option<Instant>, BoxError> {
        let start = Instant::now();
        loop {
            if *held.handle.lost_token().borrow() {
                return Ok(Some(Instant::now()));
            }
            if start.elapsed() >= limit {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn release(&self, held: Held) -> Result<Option<bool>, BoxError> {
        // A's session may be gone (the fault): so is the lock.
        let _ = held.handle.release().await;
        Ok(None)
    }

    fn detail(&self, scenario: Scenario, seen: &Seen) -> String {
        let takeover = takeover_text(seen.took_over, seen.window);
        let a_wrote = match (&seen.a_wrote, seen.b_wrote) {
            (Some(Written::Committed), true) => "APPLIED after B's".to_owned(),
            (written, _) => written_text(written.as_ref()),
        };
        let notes = self.notes.try_lock().ok();
        let lost = notes.as_deref().and_then(|n| n.lost).unwrap_or(false);
        match scenario {
            Scenario::PausedHolder => format!(
                "the lock lives as long as A's session, which a frozen network does not end; B \
                 {takeover}; A's commit after the thaw: {a_wrote}; rows by insertion {:?}",
                seen.writers()
            ),
            Scenario::KilledConnection => format!(
                "A's connections ended: {}; the lock went with them, B {takeover}; A's \
                 lost_token still said {lost}; A's write through its pool: {a_wrote}",
                self.s.killed(),
            ),
            Scenario::LateRelease | Scenario::DeadHolder => "not run".to_owned(),
            Scenario::SilentRenewal => format!(
                "the lock stays with A's (frozen) session; lost_token said {lost}; B \
                 {takeover}; A's write after the thaw: {a_wrote}"
            ),
        }
    }
}
