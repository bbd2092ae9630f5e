//! The lease with fencing as a contender: every write is fenced, so the
//! database, not a client timer, refuses a stale one.

use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};
use tokio::sync::Mutex;

use pglease::{AcquireOptions, Error, Fence, HeldLease, Lease, LeaseManager, Token};
use sqlx::Postgres;
use sqlx::pool::PoolConnection;

use super::harness::{Ctx, ms, rejected};
use crate::engine::{BoxError, Contender, Fault, Scenario, Seen, Who, Written};

/// The lease's TTL in `scenario`: two units, three for a renewing holder,
/// twenty where nobody should take over.
pub(super) fn ttl(scenario: Scenario, unit: Duration) -> Duration {
    match scenario {
        Scenario::SilentRenewal => unit * 3,
        Scenario::LateRelease => unit * 20,
        _ => unit * 2,
    }
}

/// A's or B's lease.
pub(super) enum Held {
    /// Acquired once, never renewed (A's pause in-process cannot stop a
    /// renewal task, so the paused holder does not renew).
    Plain(Lease),
    /// Acquired on a connection of its own (with its pid), which the
    /// fault kills.
    OnConnection(Fence, Option<PgConnection>, i32),
    /// Held and renewed in the background.
    Renewed(HeldLease),
}

impl Held {
    fn token(&self) -> i64 {
        match self {
            Held::Plain(l) => l.token().get(),
            Held::OnConnection(f, ..) => f.token().get(),
            Held::Renewed(h) => h.token().get(),
        }
    }
}

/// What the contender noted on the way, for the detail.
#[derive(Default)]
struct Notes {
    a_token: i64,
    /// (d): the first term's token, the second's, and whether the late
    /// release ended the second.
    late: Option<(i64, i64, bool)>,
    /// (e): A's own manager, on a pool of one connection.
    a: Option<LeaseManager>,
    /// (e): that connection, taken by the stall: every renewal of A's
    /// waits for it and gets no answer.
    stalled: Option<PoolConnection<Postgres>>,
    /// (e): why A was told, and whether the database then still
    /// considered the lease valid.
    told: Option<(String, bool)>,
}

pub(super) struct LeaseContender {
    ctx: Ctx,
    notes: Mutex<Notes>,
}

impl LeaseContender {
    pub(super) fn new(ctx: Ctx) -> LeaseContender {
        LeaseContender {
            ctx,
            notes: Mutex::new(Notes::default()),
        }
    }

    fn ttl(&self) -> Duration {
        ttl(self.ctx.scenario, self.ctx.unit)
    }

    fn options(&self, who: Who) -> AcquireOptions {
        AcquireOptions::ttl(self.ttl()).holder(who.name())
    }

    /// A manager for A alone, on a pool of one connection.
    async fn own_manager(&self) -> Result<LeaseManager, BoxError> {
        let options = self.ctx.m.pool().connect_options();
        let pool = pglease::connect::pool_options()
            .max_connections(1)
            .connect_with((*options).clone())
            .await?;
        Ok(LeaseManager::new(pool))
    }

    /// A's lease on a connection of its own, and that connection's pid.
    async fn on_connection(&self) -> Result<Held, BoxError> {
        let mut conn = PgConnection::connect_with(&self.ctx.m.pool().connect_options()).await?;
        let (token, pid): (i64, i32) =
            sqlx::query_as("SELECT token, pg_backend_pid() FROM pglease.acquire($1, 'A', $2)")
                .bind(&self.ctx.name)
                .bind(self.ttl())
                .fetch_one(&mut conn)
                .await?;
        Ok(Held::OnConnection(
            Fence::new(&self.ctx.name, Token::new(token)?)?,
            Some(conn),
            pid,
        ))
    }
}

impl Contender for LeaseContender {
    type Held = Held;

    async fn acquire(&self, who: Who, wait: Duration) -> Result<Option<Held>, BoxError> {
        let held = match (who, self.ctx.scenario) {
            (Who::A, Scenario::KilledConnection) => self.on_connection().await?,
            (Who::A, Scenario::SilentRenewal) => {
                let a = self.own_manager().await?;
                let held = a.hold(&self.ctx.name, self.options(who)).await?;
                self.notes.lock().await.a = Some(a);
                Held::Renewed(held)
            }
            _ => match self
                .ctx
                .m
                .acquire(&self.ctx.name, self.options(who).wait(wait))
                .await
            {
                Ok(lease) => Held::Plain(lease),
                // Pinned: the row is locked by something acquire may not end
                // (a role without the right to end stale sessions); the
                // tests assert the takeovers that need it.
                Err(Error::Held { .. } | Error::Timeout { .. } | Error::Pinned { .. }) => {
                    return Ok(None);
                }
                Err(e) => return Err(e.into()),
            },
        };
        if who == Who::A {
            self.notes.lock().await.a_token = held.token();
        }
        Ok(Some(held))
    }

    fn token(&self, held: &Held) -> Option<i64> {
        Some(held.token())
    }

    /// A paused holder writes before it pauses: a lease acquired
    /// once writes under its token (a renewed one is for (e), which does
    /// not call this).
    async fn work(&self, held: &mut Held, who: Who) -> Result<Option<Written>, BoxError> {
        match held {
            Held::Plain(_) | Held::OnConnection(..) => Ok(Some(self.write(held, who).await?)),
            Held::Renewed(_) => Ok(None),
        }
    }

    async fn write(&self, held: &mut Held, who: Who) -> Result<Written, BoxError> {
        match held {
            Held::Plain(lease) => self.ctx.fenced_write(lease.fence(), who).await,
            Held::OnConnection(fence, ..) => self.ctx.fenced_write(fence, who).await,
            Held::Renewed(held) => match held.begin_fenced().await {
                Ok(mut tx) => {
                    self.ctx.write_on(&mut tx, who).await?;
                    tx.commit().await?;
                    Ok(Written::Committed)
                }
                Err(e @ Error::NotHeld { .. }) => Ok(rejected(&e)),
                Err(e @ Error::Lost { .. }) => Ok(Written::Refused(format!(
                    "by pglease, which knows the lease is lost: {e}"
                ))),
                Err(e) => Err(e.into()),
            },
        }
    }

    async fn fault(&self, held: &mut Held, fault: Fault) -> Result<(), BoxError> {
        match (fault, &mut *held) {
            (Fault::Kill, Held::OnConnection(_, conn, pid)) => {
                self.ctx.terminate(*pid).await?;
                drop(conn.take());
            }
            (Fault::LateRelease, Held::Plain(first)) => {
                let first = &*first;
                let m = &self.ctx.m;
                m.release(first).await?;
                let second = m.acquire(&self.ctx.name, self.options(Who::A)).await?;
                // The first release again, as a late duplicate.
                let ended = m.release(first).await?;
                self.notes.lock().await.late =
                    Some((first.token().get(), second.token().get(), ended));
                *held = Held::Plain(second);
            }
            (Fault::Stall, Held::Renewed(_)) => {
                // A's only connection is taken (a stalled network, a
                // stuck pool): A's renewals wait and get no answer, while
                // B, on connections of its own, can take over once the
                // lease has expired in the database.
                let mut notes = self.notes.lock().await;
                let a = notes.a.clone().ok_or("A has no manager of its own")?;
                notes.stalled = Some(a.pool().acquire().await?);
            }
            // A paused holder simply does nothing until it resumes.
            _ => {}
        }
        Ok(())
    }

    async fn heal(&self, _fault: Fault) -> Result<(), BoxError> {
        drop(self.notes.lock().await.stalled.take());
        Ok(())
    }

    async fn die(&self, _held: Held) -> Result<(), BoxError> {
        // Nothing to do: nobody releases, nobody renews.
        Ok(())
    }

    async fn told(&self, held: &Held, limit: Duration) -> Result<Option<Instant>, BoxError> {
        let Held::Renewed(held) = held else {
            return Ok(None);
        };
        let Ok(reason) = tokio::time::timeout(limit, held.lost()).await else {
            return Ok(None);
        };
        let valid: bool = sqlx::query_scalar("SELECT held FROM pglease.status WHERE name = $1")
            .bind(&self.ctx.name)
            .fetch_one(self.ctx.m.pool())
            .await?;
        self.notes.lock().await.told = Some((reason.to_string(), valid));
        // The holder knows from its local deadline on (`is_lost()`,
        // `remaining()`), whenever the signal's task gets round to it.
        let deadline = held.deadline();
        Ok(Some(held.lost_at().map_or(deadline, |at| at.min(deadline))))
    }

    async fn release(&self, held: Held) -> Result<Option<bool>, BoxError> {
        match held {
            Held::Plain(lease) => Ok(Some(self.ctx.m.release(&lease).await?)),
            Held::OnConnection(fence, ..) => Ok(Some(self.ctx.m.release(&fence).await?)),
            // Lost already in (e): nothing left to release.
            Held::Renewed(held) => {
                drop(held);
                if let Some(a) = self.notes.lock().await.a.take() {
                    a.pool().close().await;
                }
                Ok(None)
            }
        }
    }

    fn detail(&self, scenario: Scenario, seen: &Seen) -> String {
        let notes = self.notes.try_lock().ok();
        let notes = notes.as_deref();
        let a_token = notes.map_or(0, |n| n.a_token);
        let a_wrote = match &seen.a_wrote {
            Some(Written::Committed) => "APPLIED",
            _ => "rejected by the database (LE001)",
        };
        match scenario {
            Scenario::PausedHolder => format!(
                "B took over after {} ms (the TTL); A's delayed write with token {a_token} was \
                 {a_wrote} (value {:?})",
                ms(seen.took_over),
                seen.value()
            ),
            Scenario::KilledConnection => format!(
                "the lease outlived the killed connection; B took over {} ms later, at its \
                 expiry; A's write through a fresh connection was {a_wrote}",
                ms(seen.took_over)
            ),
            Scenario::DeadHolder => format!(
                "B took over {} ms after A's acquisition (TTL {} ms), whatever state A's host \
                 is in",
                ms(seen.took_over),
                self.ttl().as_millis()
            ),
            Scenario::LateRelease => match notes.and_then(|n| n.late) {
                Some((first, second, ended)) => format!(
                    "the delayed release carried token {first}, not the current {second}: {}",
                    if ended {
                        "it ENDED the new hold"
                    } else {
                        "ignored, A still holds it"
                    }
                ),
                None => "the late release was not sent".to_owned(),
            },
            Scenario::SilentRenewal => match (seen.told, notes.and_then(|n| n.told.clone())) {
                (Some(told), Some((reason, valid))) => format!(
                    "the loss signal fired {} ms into the unanswered renewals ({reason}), while \
                     the database {} the lease valid; B {}; new fenced work was {}",
                    told.as_millis(),
                    if valid {
                        "still considered"
                    } else {
                        "no longer considered"
                    },
                    match seen.took_over {
                        Some(t) => format!("took over after {} ms", t.as_millis()),
                        None => "could not take over".to_owned(),
                    },
                    match seen.a_wrote {
                        Some(Written::Committed) => "ALLOWED",
                        _ => "refused",
                    }
                ),
                _ => format!("NO loss signal within {} ms", seen.window.as_millis()),
            },
        }
    }
}
