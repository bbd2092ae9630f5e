//! pg_lease 0.1.3: each holder is a `LeaseLooper` whose function runs
//! while its lease row is heartbeated; writes verify the lease in their
//! own transaction with `verify_lease_held`, as pg_lease documents.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_lease::{LeaseContext, LeaseLooper, verify_lease_held};
use pglease_scenarios::engine::{BoxError, Contender, Fault, Scenario, Seen, Who, Written};
use sqlx08::postgres::PgPool;
use tokio::sync::{Mutex, oneshot};

use super::{Setting, committed, net, takeover_text, written_text};
use crate::looper::{OnDrop, Signal, signal, slot};

/// The future of a looper's function, boxed so that its type has a name.
type Work = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;
/// A looper's state: the signals its function sends when it starts and
/// when pg_lease stops it, and the order to finish (its term then ends,
/// and pg_lease deletes the lease row).
type Watch = (Signal, Signal, Arc<Mutex<Option<oneshot::Receiver<()>>>>);
type Looper = LeaseLooper<fn(LeaseContext, Watch) -> Work, Work, Watch>;

/// A looper's function: signals once its looper holds the lease, works
/// without the database, and returns when told to finish; signals again
/// when pg_lease aborts it (its looper has given the lease up).
fn watched(_ctx: LeaseContext, (started, stopped, finish): Watch) -> Work {
    Box::pin(async move {
        let _stopped = OnDrop(stopped);
        signal(&started);
        let order = finish.lock().await.take();
        match order {
            Some(order) => {
                let _ = order.await;
            }
            None => std::future::pending::<()>().await,
        }
        Ok(())
    })
}

/// A holder: its looper, the pool its writes go through, when pg_lease
/// stopped its work, and the order to finish its term.
pub(crate) struct Held {
    looper: Looper,
    pool: PgPool,
    worker: &'static str,
    stopped: Mutex<oneshot::Receiver<Instant>>,
    finish: Option<oneshot::Sender<()>>,
}

#[derive(Default)]
struct Notes {
    /// (a): A's write, uncommitted.
    staged: Option<sqlx08::Transaction<'static, sqlx08::Postgres>>,
    /// (d): A's first term, whose end (a DELETE) is held up.
    first: Option<Held>,
}

pub(crate) struct PgLeaseContender<'a> {
    s: &'a Setting,
    a_pool: PgPool,
    notes: Mutex<Notes>,
}

impl<'a> PgLeaseContender<'a> {
    pub(crate) async fn new(s: &'a Setting) -> Result<PgLeaseContender<'a>, BoxError> {
        Ok(PgLeaseContender {
            s,
            a_pool: net::proxied_pool(&s.db, &s.proxy).await?,
            notes: Mutex::new(Notes::default()),
        })
    }

    /// Starts `worker`'s looper on `pool`; the holder once its function
    /// runs, `None` if it does not within `wait` (and the looper is
    /// stopped).
    async fn start(
        &self,
        worker: &'static str,
        pool: PgPool,
        wait: Duration,
    ) -> Result<Option<Held>, BoxError> {
        let (started, has_started) = slot();
        let (stopped, has_stopped) = slot();
        let (finish, order) = oneshot::channel();
        let looper: Looper = LeaseLooper::new(
            "res".to_owned(),
            watched as fn(LeaseContext, Watch) -> Work,
            worker.to_owned(),
            pool.clone(),
            crate::looper::options(self.s.ttl()),
            (started, stopped, Arc::new(Mutex::new(Some(order)))),
        );
        looper.start().await?;
        if tokio::time::timeout(wait, has_started).await.is_err() {
            looper.stop().await?;
            return Ok(None);
        }
        Ok(Some(Held {
            looper,
            pool,
            worker,
            stopped: Mutex::new(has_stopped),
            finish: Some(finish),
        }))
    }

    /// The lease verified and `who`'s row written in one transaction of
    /// `held`'s pool, left uncommitted; `Err(why)` if refused.
    async fn verified(
        &self,
        held: &Held,
        who: Who,
    ) -> Result<sqlx08::Transaction<'static, sqlx08::Postgres>, String> {
        let mut tx = held.pool.begin().await.map_err(|e| e.to_string())?;
        match verify_lease_held(&mut tx, "res", held.worker).await {
            Ok(true) => {}
            Ok(false) => return Err("verify_lease_held: not held".to_owned()),
            Err(e) => return Err(format!("verify_lease_held: {e}")),
        }
        sqlx08::query(&self.s.ledger.insert())
            .bind(who.name())
            .execute(&mut *tx)
            .await
            .map_err(|e| e.to_string())?;
        Ok(tx)
    }

    /// (d): A's first term ends, with its release held up or sent again
    /// late; A's second term begins and becomes `held`.
    async fn late_release(&self, held: &mut Held) -> Result<(), BoxError> {
        // A's first term ends: pg_lease deletes the lease row, and
        // that DELETE is held up in the frozen network.
        self.s.proxy.freeze();
        if let Some(finish) = held.finish.take() {
            let _ = finish.send(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The same holder (same worker id) acquires again, through
        // a connection of its own: pg_lease lets a worker id take
        // back its own unexpired lease.
        let direct = crate::pool(&self.s.db, "peer-A2").await?;
        let second = self
            .start("A", direct, Duration::from_secs(10))
            .await?
            .ok_or("pg_lease: A's second term never began")?;
        let first = std::mem::replace(held, second);
        self.notes.lock().await.first = Some(first);
        Ok(())
    }
}

impl Contender for PgLeaseContender<'_> {
    type Held = Held;

    async fn acquire(&self, who: Who, wait: Duration) -> Result<Option<Held>, BoxError> {
        match who {
            // A's first acquisition of a free lease: within a few loops.
            Who::A => {
                self.start("A", self.a_pool.clone(), Duration::from_secs(10))
                    .await
            }
            Who::B => {
                self.start("B", crate::pool(&self.s.db, "peer-B").await?, wait)
                    .await
            }
        }
    }

    async fn write(&self, held: &mut Held, who: Who) -> Result<Written, BoxError> {
        Ok(match self.verified(held, who).await {
            Ok(tx) => committed(tx.commit().await),
            Err(why) => Written::Refused(why),
        })
    }

    async fn stage(&self, held: &mut Held, who: Who) -> Result<bool, BoxError> {
        if self.s.scenario != Scenario::PausedHolder {
            return Ok(false);
        }
        let tx = self.verified(held, who).await?;
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

    async fn fault(&self, held: &mut Held, fault: Fault) -> Result<(), BoxError> {
        self.s.fault(fault).await?;
        if fault == Fault::LateRelease {
            self.late_release(held).await?;
        }
        Ok(())
    }

    async fn heal(&self, _fault: Fault) -> Result<(), BoxError> {
        self.s.heal();
        Ok(())
    }

    async fn die(&self, held: Held) -> Result<(), BoxError> {
        held.looper.stop().await
    }

    async fn told(&self, held: &Held, limit: Duration) -> Result<Option<Instant>, BoxError> {
        let mut stopped = held.stopped.lock().await;
        Ok(tokio::time::timeout(limit, &mut *stopped)
            .await
            .ok()
            .and_then(Result::ok))
    }

    async fn release(&self, held: Held) -> Result<Option<bool>, BoxError> {
        held.looper.stop().await?;
        if let Some(first) = self.notes.lock().await.first.take() {
            first.looper.stop().await?;
        }
        Ok(None)
    }

    fn detail(&self, scenario: Scenario, seen: &Seen) -> String {
        let takeover = takeover_text(seen.took_over, seen.window);
        let a_wrote = written_text(seen.a_wrote.as_ref());
        let told = seen.told.map_or_else(
            || format!("not within {} s", seen.window.as_secs()),
            |t| format!("after {} ms", t.as_millis()),
        );
        match scenario {
            Scenario::PausedHolder => format!(
                "verify_lease_held passed before the freeze and holds nothing until commit; B \
                 {takeover}; A's commit after the thaw: {a_wrote}; rows by insertion {:?}",
                seen.writers()
            ),
            Scenario::KilledConnection => format!(
                "A's connections ended: {}; the lease row outlives them: A's heartbeat went on \
                 through new connections, B {takeover}; A's verified write: {a_wrote}",
                self.s.killed()
            ),
            Scenario::LateRelease => format!(
                "the first term's DELETE (by worker id, no token) arrived during the second term \
                 and deleted its row; B {takeover}, A's second term was stopped {told} (its next \
                 heartbeat)"
            ),
            Scenario::SilentRenewal | Scenario::DeadHolder => format!(
                "A's work is stopped only when a heartbeat fails, and a heartbeat without an \
                 answer neither fails nor times out: A told {told}; B {takeover}; A's verified \
                 write after the thaw: {a_wrote}"
            ),
        }
    }
}
