//! Holding leases over time: the handle a holder keeps ([`HeldLease`]),
//! the per-lease state it shares with the renewal task (`state.rs`), the
//! registry of held leases (`registry.rs`), and the task that renews them
//! all in one statement per tick (`renewer.rs`).

mod registry;
mod renewer;
mod state;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

pub(crate) use registry::Registry;
use state::HeldState;

use crate::context::Context;
use crate::db;
use crate::error::{Error, LossReason, Result};
use crate::fencing::{self, FencedTransaction};
use crate::lease::{Fence, Lease, micros_interval};
use crate::limits::check_duration;
use crate::options::Timing;
use crate::token::Token;

/// A lease held by a manager, renewed in the background until it is
/// released, dropped, or lost.
///
/// Work done under it should either watch [`HeldLease::lost`] (or
/// [`HeldLease::loss_token`]) or go through [`HeldLease::begin_fenced`],
/// which refuses to start once the lease is lost locally; the database
/// rejects a stale token in any case.
///
/// Dropping it releases the lease in the background, best effort (it needs
/// a running tokio runtime; otherwise the lease simply expires after its
/// TTL). Prefer [`HeldLease::release`], which reports the outcome.
#[derive(Clone)]
pub struct HeldLease {
    inner: Arc<Holding>,
}

/// How a held lease's renewals are going (see
/// [`HeldLease::renewal_health`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RenewalHealth {
    /// The last renewal (or the acquisition) was confirmed by the database.
    Confirmed,
    /// Renewals have failed since `since`; `error` is the last failure.
    /// Unless one succeeds first, the lease is given up at `deadline`
    /// ([`HeldLease::deadline`], which does not move while this lasts).
    Failing {
        /// The first failed renewal since the last confirmed one.
        since: std::time::Instant,
        /// The local deadline.
        deadline: std::time::Instant,
        /// The last failure.
        error: Arc<Error>,
    },
}

impl RenewalHealth {
    fn of(view: &state::View) -> RenewalHealth {
        match &view.failing {
            None => RenewalHealth::Confirmed,
            Some((since, error)) => RenewalHealth::Failing {
                since: since.into_std(),
                deadline: view.deadline.into_std(),
                error: error.clone(),
            },
        }
    }
}

/// What the clones of one [`HeldLease`] share; released when the last one
/// is dropped.
struct Holding {
    context: Arc<Context>,
    registry: Arc<Registry>,
    /// Keeps the manager's background tasks running while the lease is
    /// held, even if every manager handle has been dropped.
    _keepalive: Arc<DropGuard>,
    state: Arc<HeldState>,
    /// Released, or handed over to `expire_in`: nothing for `Drop` to do.
    released: AtomicBool,
}

impl std::fmt::Debug for HeldLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLease")
            .field("lease", &self.inner.state.lease)
            .field("view", &*self.inner.state.view.borrow())
            .finish_non_exhaustive()
    }
}

impl HeldLease {
    /// The acquisition: name, holder, token.
    pub fn lease(&self) -> &Lease {
        &self.inner.state.lease
    }

    /// The lease name.
    pub fn name(&self) -> &str {
        self.inner.state.lease.name()
    }

    /// The fencing token; carry it into fenced transactions.
    pub fn token(&self) -> Token {
        self.inner.state.lease.token()
    }

    /// The TTL each renewal asks for.
    pub fn ttl(&self) -> Duration {
        self.inner.state.timing.ttl
    }

    /// Until when this process may act under the lease, on the monotonic
    /// clock: the last confirmed renewal's send time + TTL − safety margin.
    /// It moves forward only when a renewal is confirmed.
    pub fn deadline(&self) -> std::time::Instant {
        self.inner.state.view.borrow().deadline.into_std()
    }

    /// Time left before [`HeldLease::deadline`] (zero once past).
    pub fn remaining(&self) -> Duration {
        self.inner
            .state
            .view
            .borrow()
            .deadline
            .saturating_duration_since(Instant::now())
    }

    /// The expiry the database set at the last confirmed renewal (database
    /// clock; compare it only with database time).
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.inner.state.view.borrow().expires_at
    }

    /// Whether the lease is lost (this also notices a deadline that has
    /// passed while the renewal task could not run).
    pub fn is_lost(&self) -> bool {
        self.inner.state.loss_by(Instant::now()).is_some()
    }

    /// Why the lease is lost, if it is.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.inner.state.loss_by(Instant::now())
    }

    /// When the loss signal fired, if it has.
    pub fn lost_at(&self) -> Option<std::time::Instant> {
        self.inner.state.loss_by(Instant::now());
        self.inner
            .state
            .view
            .borrow()
            .lost_at
            .map(Instant::into_std)
    }

    /// Resolves when the lease is lost, with the reason; at the latest at
    /// the local deadline, whatever the database does. Cancel-safe, so it
    /// can sit in a `tokio::select!` beside the work.
    pub async fn lost(&self) -> LossReason {
        let mut view = self.inner.state.view.subscribe();
        loop {
            // Mark the current state seen *before* checking it, so that a
            // loss fired in between wakes `changed()` below.
            view.borrow_and_update();
            if let Some(reason) = self.inner.state.loss_by(Instant::now()) {
                return reason;
            }
            let fire_at = self.inner.state.fire_at();
            tokio::select! {
                // The sender lives in `self.inner.state`, so this never errors.
                _ = view.changed() => {}
                () = tokio::time::sleep_until(fire_at) => {}
            }
        }
    }

    /// How renewals are going: [`RenewalHealth::Failing`] from the first
    /// failed renewal until the next confirmed one (a failover, a network
    /// drop), else [`RenewalHealth::Confirmed`].
    pub fn renewal_health(&self) -> RenewalHealth {
        RenewalHealth::of(&self.inner.state.view.borrow())
    }

    /// Resolves once renewals are failing while `last` says they were
    /// confirmed, or the reverse (at once if that is already so), with the
    /// new [`HeldLease::renewal_health`]; or when the lease is lost (check
    /// [`HeldLease::is_lost`]). Pass what the previous call returned (or
    /// [`RenewalHealth::Confirmed`] first), so that no change is missed
    /// between calls. Cancel-safe, for a `tokio::select!` loop that says
    /// what is happening (`pglease run` prints a line on each change).
    pub async fn renewal_health_changed(&self, last: &RenewalHealth) -> RenewalHealth {
        let failing = matches!(last, RenewalHealth::Failing { .. });
        let mut view = self.inner.state.view.subscribe();
        tokio::select! {
            _ = view.wait_for(|v| v.failing.is_some() != failing || v.lost.is_some()) => {}
            _ = self.lost() => {}
        }
        self.renewal_health()
    }

    /// A token cancelled when the lease is lost, for work that already
    /// speaks `CancellationToken`. Cancelling it yourself affects only your
    /// copy, not the lease.
    pub fn loss_token(&self) -> CancellationToken {
        self.inner.state.loss_by(Instant::now());
        self.inner.state.lost.child_token()
    }

    /// Begins a fenced transaction under this lease, refusing with
    /// [`Error::Lost`] if the lease is already lost locally (the database
    /// checks the token again either way).
    pub async fn begin_fenced(&self) -> Result<FencedTransaction> {
        if let Some(reason) = self.inner.state.loss_by(Instant::now()) {
            return Err(self.lost_error(reason));
        }
        fencing::begin(&self.inner.context.pool, self.as_ref()).await
    }

    /// Stops renewing and releases the lease in the database. Returns
    /// `true` if this ended it, `false` if it had already ended (lost).
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] with [`LossReason::Forgotten`] if the database
    /// changed timeline (a failover or a restore) and does not know this
    /// acquisition (one extra read, when nothing was released);
    /// [`Error::Database`].
    pub async fn release(self) -> Result<bool> {
        self.inner.registry.forget(&self.inner.state.lease);
        self.inner.state.fire(LossReason::Released, Instant::now());
        let outcome = db::release_checked(&self.inner.context, self.as_ref()).await;
        // Only now: if this future is dropped before the database answers,
        // `Drop` releases in the background instead.
        self.inner.released.store(true, Ordering::Release);
        outcome
    }

    /// Stops renewing and hands the lease over to `successor` for `ttl`
    /// ([`LeaseManager::hand_over`](crate::LeaseManager::hand_over)):
    /// the successor's token, or `None` when it did not wait in line and
    /// the lease was released instead. This handle reports the lease
    /// released either way.
    ///
    /// # Errors
    ///
    /// Those of [`LeaseManager::hand_over`](crate::LeaseManager::hand_over).
    ///
    /// # Cancel safety
    ///
    /// Dropped before the database answers, the handover may or may not
    /// commit; the lease is not renewed any more either way.
    pub async fn hand_over(self, successor: &str, ttl: Duration) -> Result<Option<Token>> {
        crate::manager::check_hand_over(self.as_ref(), successor)?;
        let pg_ttl = crate::lease::interval(ttl)?;
        self.inner.registry.forget(&self.inner.state.lease);
        self.inner.state.fire(LossReason::Released, Instant::now());
        let outcome = crate::db::hand_over(
            &self.inner.context.pool,
            self.as_ref(),
            successor,
            &pg_ttl,
            true,
        )
        .await;
        // Only now: dropped before the answer, `Drop` releases instead.
        self.inner.released.store(true, Ordering::Release);
        outcome.inspect_err(|_| {
            // Not handed over (a grant delay, a transaction that could not
            // be ended, the network): nobody renews it any more, so release
            // it (a no-op if the handover did commit).
            self.inner.context.release_in_background(self.as_ref());
        })
    }

    /// Stops renewing the lease and reports it released, without a
    /// statement: for a caller that ends it by a statement of its own (a
    /// group member leaving its group).
    pub(crate) fn forget(&self) {
        self.inner.registry.forget(&self.inner.state.lease);
        self.inner.state.fire(LossReason::Released, Instant::now());
        self.inner.released.store(true, Ordering::Release);
    }

    /// Stops renewing the lease and lets it expire `after` from now
    /// (database clock) instead of releasing it: nobody else can acquire it
    /// until then. For work that must not run again elsewhere too soon after
    /// it finished here (`pglease run --min-hold`). `after` may be shorter
    /// or longer than the TTL. Returns the new expiry (database clock).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] if `after` is not between 1 µs and
    /// [`MAX_TTL`](crate::limits::MAX_TTL) (the handle is then dropped, which
    /// releases the lease); [`Error::Lost`] if the lease was already lost;
    /// [`Error::Database`] if the statement failed (the lease then expires
    /// at its last expiry, unless the statement got through).
    ///
    /// # Cancel safety
    ///
    /// Dropped before the database answers, the lease is neither renewed
    /// in the background nor released: it expires a TTL after the last
    /// renewal that got through, or `after` from now if this statement
    /// got through.
    pub async fn expire_in(self, after: Duration) -> Result<DateTime<Utc>> {
        let ttl = micros_interval(check_duration("after", after)?);
        if let Some(reason) = self.inner.state.loss_by(Instant::now()) {
            return Err(self.lost_error(reason));
        }
        // From here on neither renewed nor released (not even by Drop).
        self.inner.released.store(true, Ordering::Release);
        let Holding {
            context, registry, ..
        } = &*self.inner;
        let mut applied = registry.applied();
        let in_flight = registry.forget(&self.inner.state.lease) == Some(true);
        self.inner.state.fire(LossReason::Released, Instant::now());
        if in_flight {
            // A renewal already sent would, landing after the statement
            // below, set the expiry to a TTL from then: let it land first.
            let limit = context.options.get_renew_timeout();
            let _ = tokio::time::timeout(limit, applied.changed()).await;
        }
        db::renew(context, self.as_ref(), ttl).await
    }

    /// Asks the database whether the lease is still held under its token
    /// (one read, bounded by the renewal timeout). If it is not, the lease
    /// is lost from now on, with the reason the database gives, which is
    /// returned; `None` while it is held, or when the database cannot say.
    pub(crate) async fn confirm(&self) -> Option<LossReason> {
        if let Some(reason) = self.inner.state.loss_by(Instant::now()) {
            return Some(reason);
        }
        let context = &self.inner.context;
        let limit = context.options.get_renew_timeout();
        let found = tokio::time::timeout(limit, db::fence_status(&context.pool, self.as_ref()))
            .await
            .ok()?
            .ok()??;
        let reason = match found {
            db::Found::Lost(reason) => reason,
            db::Found::Forgotten(timeline) => LossReason::Forgotten { timeline },
            // Not for a held lease's own token; said as what it means.
            db::Found::NeverHeld(_) => LossReason::Stale {
                current_token: None,
                current_holder: None,
            },
        };
        self.inner.state.fire(reason, Instant::now());
        self.inner.state.loss()
    }

    /// The error for work that finds this lease lost.
    pub(crate) fn lost_error(&self, reason: LossReason) -> Error {
        Error::Lost {
            name: self.name().to_owned(),
            token: self.token(),
            reason,
        }
    }
}

impl AsRef<Fence> for HeldLease {
    fn as_ref(&self) -> &Fence {
        self.inner.state.lease.fence()
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        if self.released.load(Ordering::Acquire) {
            return;
        }
        self.registry.forget(&self.state.lease);
        // No longer valid in the database: nothing to give back.
        let stale = matches!(
            self.state.loss(),
            Some(LossReason::Stale { .. } | LossReason::Forgotten { .. })
        );
        self.state.fire(LossReason::Released, Instant::now());
        if !stale {
            self.context.release_in_background(self.state.lease.fence());
        }
    }
}

/// Registers `lease`, acquired by a statement sent at `sent`, for renewal
/// in the background, and returns its handle.
pub(crate) fn register(
    context: &Arc<Context>,
    registry: &Arc<Registry>,
    keepalive: &Arc<DropGuard>,
    lease: Lease,
    sent: Instant,
    timing: Timing,
    pg_ttl: PgInterval,
) -> HeldLease {
    let state = Arc::new(HeldState::new(lease, sent, timing, pg_ttl));
    let wake = registry.insert(Arc::clone(&state), sent + timing.period);
    if context.is_shut_down() {
        // A shutdown raced this acquisition: do not leave it behind.
        registry.forget(&state.lease);
        state.fire(LossReason::Released, Instant::now());
        context.release_in_background(state.lease.fence());
    } else {
        renewer::ensure_running(context, registry, wake);
    }
    HeldLease {
        inner: Arc::new(Holding {
            context: Arc::clone(context),
            registry: Arc::clone(registry),
            _keepalive: Arc::clone(keepalive),
            state,
            released: AtomicBool::new(false),
        }),
    }
}

/// Stops renewing every lease in `registry` and tells their holders they
/// were released; returns the leases, for the caller to release.
pub(crate) fn drain(registry: &Registry) -> Vec<Lease> {
    let states = registry.drain();
    let now = Instant::now();
    // Every holder hears of it before the first release is awaited.
    for state in &states {
        state.fire(LossReason::Released, now);
    }
    states.iter().map(|state| state.lease.clone()).collect()
}
