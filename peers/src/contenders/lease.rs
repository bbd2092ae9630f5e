//! pglease: A holds a lease (renewed in the background) through the proxy,
//! every write fenced; B acquires through its own manager.

use std::time::{Duration, Instant};

use pglease::{AcquireOptions, Error, FencedTransaction, HeldLease, Lease, LeaseManager};
use pglease_scenarios::engine::{BoxError, Contender, Fault, Scenario, Seen, Who, Written};
use tokio::sync::Mutex;

use super::{Setting, committed, net, takeover_text, written_text};

/// A's renewed lease, or a lease acquired once (B's, and A's in (d)).
pub(crate) enum Held {
    Renewed(HeldLease),
    Once(Lease),
}

#[derive(Default)]
struct Notes {
    /// (a): A's write, uncommitted.
    staged: Option<FencedTransaction>,
    /// (b): whether A's lease was lost when A wrote.
    lost: Option<bool>,
    /// (d): the first term's token, the second's, and what the late
    /// release returned.
    late: Option<(i64, i64, bool)>,
    /// (e): why A was told.
    reason: Option<String>,
}

pub(crate) struct PgleaseContender<'a> {
    s: &'a Setting,
    a: LeaseManager,
    b: LeaseManager,
    notes: Mutex<Notes>,
}

impl<'a> PgleaseContender<'a> {
    pub(crate) async fn new(s: &'a Setting) -> Result<PgleaseContender<'a>, BoxError> {
        Ok(PgleaseContender {
            s,
            a: net::proxied_manager(&s.db, &s.proxy).await?,
            b: s.db.manager(),
            notes: Mutex::new(Notes::default()),
        })
    }

    fn manager(&self, who: Who) -> &LeaseManager {
        match who {
            Who::A => &self.a,
            Who::B => &self.b,
        }
    }

    /// A's options: B's lease is long, so that B holds on to what it
    /// took; in (d) A's terms are long too.
    fn options(&self, who: Who) -> AcquireOptions {
        let ttl = match (who, self.s.scenario) {
            (Who::A, Scenario::LateRelease) | (Who::B, _) => self.s.ttl() * 30,
            (Who::A, _) => self.s.ttl(),
        };
        AcquireOptions::ttl(ttl).holder(who.name())
    }

    /// (d): A's first term ends, with its release held up or sent again
    /// late; A's second term begins and becomes `held`.
    async fn late_release(&self, held: &mut Held) -> Result<(), BoxError> {
        let Held::Once(first) = &*held else {
            return Err("A's first term is acquired once".into());
        };
        if !self.a.release(first).await? {
            return Err("A's first release found nothing to release".into());
        }
        let second = self.a.acquire("res", self.options(Who::A)).await?;
        // The first release again, as a late duplicate.
        let ended = self.a.release(first).await?;
        self.notes.lock().await.late = Some((first.token().get(), second.token().get(), ended));
        *held = Held::Once(second);
        Ok(())
    }
}

/// The fenced transaction's outcome as a write.
fn refused_if_lost(outcome: Result<(), Error>) -> Result<Written, BoxError> {
    match outcome {
        Ok(()) => Ok(Written::Committed),
        Err(e @ (Error::NotHeld { .. } | Error::Lost { .. })) => {
            Ok(Written::Refused(e.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

impl Contender for PgleaseContender<'_> {
    type Held = Held;

    async fn acquire(&self, who: Who, wait: Duration) -> Result<Option<Held>, BoxError> {
        let m = self.manager(who);
        if who == Who::A && self.s.scenario != Scenario::LateRelease {
            return Ok(Some(Held::Renewed(m.hold("res", self.options(who)).await?)));
        }
        match m.acquire("res", self.options(who).wait(wait)).await {
            Ok(lease) => Ok(Some(Held::Once(lease))),
            Err(Error::Held { .. } | Error::Timeout { .. } | Error::Pinned { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn write(&self, held: &mut Held, who: Who) -> Result<Written, BoxError> {
        let insert = self.s.ledger.insert();
        let write = async |conn: &mut sqlx::PgConnection| {
            sqlx::query(sqlx::AssertSqlSafe(insert))
                .bind(who.name())
                .execute(&mut *conn)
                .await?;
            Ok::<_, Error>(())
        };
        let outcome = match held {
            Held::Renewed(h) => {
                self.notes.lock().await.lost = Some(h.is_lost());
                self.manager(who).fenced(&*h, write).await
            }
            Held::Once(lease) => self.manager(who).fenced(&*lease, write).await,
        };
        refused_if_lost(outcome)
    }

    async fn stage(&self, held: &mut Held, who: Who) -> Result<bool, BoxError> {
        let (Scenario::PausedHolder, Held::Renewed(h)) = (self.s.scenario, &*held) else {
            return Ok(false);
        };
        let mut tx = h.begin_fenced().await?;
        sqlx::query(sqlx::AssertSqlSafe(self.s.ledger.insert()))
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

    async fn die(&self, _held: Held) -> Result<(), BoxError> {
        Ok(())
    }

    async fn told(&self, held: &Held, limit: Duration) -> Result<Option<Instant>, BoxError> {
        let Held::Renewed(h) = held else {
            return Ok(None);
        };
        if let Ok(reason) = tokio::time::timeout(limit, h.lost()).await {
            self.notes.lock().await.reason = Some(format!("{reason:?}"));
        }
        // The holder knows from its local deadline on (is_lost(),
        // remaining()), whenever a task gets round to reporting it.
        let deadline = h.deadline();
        Ok(match h.lost_at() {
            Some(at) => Some(at.min(deadline)),
            None if Instant::now() >= deadline => Some(deadline),
            None => None,
        })
    }

    async fn release(&self, held: Held) -> Result<Option<bool>, BoxError> {
        match held {
            // Lost already in most scenarios: nothing left to release.
            Held::Renewed(h) => {
                let _ = h.release().await;
                Ok(None)
            }
            Held::Once(lease) => Ok(Some(self.b.release(&lease).await?)),
        }
    }

    fn detail(&self, scenario: Scenario, seen: &Seen) -> String {
        let notes = self.notes.try_lock().ok();
        let notes = notes.as_deref();
        let takeover = takeover_text(seen.took_over, seen.window);
        let a_wrote = written_text(seen.a_wrote.as_ref());
        match scenario {
            Scenario::PausedHolder => format!(
                "A's write was checked against the lease and the check held until commit; the \
                 takeover ended A's session; B {takeover}; A's commit after the thaw: {a_wrote}; \
                 rows by insertion {:?}",
                seen.writers()
            ),
            Scenario::KilledConnection => format!(
                "A's connections ended: {}; the lease lives in its table, not in a connection: \
                 A renewed through new ones (lost: {}), B {takeover}; A's fenced write: {a_wrote}",
                self.s.killed(),
                notes.and_then(|n| n.lost).unwrap_or(false),
            ),
            Scenario::LateRelease => match notes.and_then(|n| n.late) {
                Some((first, second, ended)) => format!(
                    "the late release names token {first}, the new term has {second}: it \
                     returned {ended} and changed nothing; B {takeover}"
                ),
                None => "the late release was not sent".to_owned(),
            },
            Scenario::SilentRenewal | Scenario::DeadHolder => format!(
                "A's HeldLease reported {}; A told {}; B {takeover}; A's new fenced work: \
                 {a_wrote}",
                notes
                    .and_then(|n| n.reason.clone())
                    .unwrap_or_else(|| "nothing".to_owned()),
                seen.told.map_or_else(
                    || "not within the window".to_owned(),
                    |t| format!("after {} ms", t.as_millis())
                ),
            ),
        }
    }
}
