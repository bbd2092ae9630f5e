//! Holding leases over time: one background renewal task per manager that
//! renews every due lease in one statement, a conservative local deadline
//! per lease on the monotonic clock, and a loss signal with a reason.
//!
//! The local deadline of a held lease is the instant its last confirmed
//! renewal (or its acquisition) was *sent*, plus the TTL, minus the safety
//! margin. The database set its expiry to *its* clock at the moment it ran
//! the statement, plus the same TTL, and that moment is after the send: so
//! the local deadline passes before the database's expiry, as long as the
//! two clocks' rates differ by less than the margin. The deadline moves
//! forward only when a renewal is confirmed.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgPool, PgRow};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::{Error, LossReason, Result};
use crate::fenced::FencedTransaction;
use crate::input::check_duration;
use crate::lease::{Acquire, Fence, Lease, LeaseManager, Token, interval};
use crate::options::{ManagerOptions, Timing};
use crate::sql;
use crate::waiting::Listener;

/// Counters of one manager, for monitoring and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ManagerStats {
    /// Leases held with background renewal right now.
    pub held: usize,
    /// Renewal statements sent (each renews every lease due at that tick).
    pub renewal_statements: u64,
    /// Lease renewals confirmed by the database, over all statements.
    pub leases_renewed: u64,
    /// Renewal statements that failed or timed out (and were retried).
    pub renewal_failures: u64,
    /// Acquisition statements answered (successful or not).
    pub acquire_attempts: u64,
    /// Acquirers waiting for a lease right now.
    pub waiting: usize,
    /// Whether this manager is listening for releases right now.
    pub listening: bool,
}

#[derive(Default)]
pub(crate) struct Counters {
    renewal_statements: AtomicU64,
    leases_renewed: AtomicU64,
    renewal_failures: AtomicU64,
    pub(crate) acquire_attempts: AtomicU64,
    pub(crate) waiting: AtomicUsize,
}

/// What a manager and its background tasks share. The tasks hold this, not
/// the manager, so that dropping the last manager handle stops them.
pub(crate) struct Shared {
    pub(crate) pool: PgPool,
    pub(crate) options: ManagerOptions,
    registry: Mutex<HashMap<(String, i64), Entry>>,
    wake: Notify,
    pub(crate) stop: CancellationToken,
    /// The renewal task; started again if the runtime it ran on has ended.
    renewer: Mutex<Option<tokio::task::JoinHandle<()>>>,
    pub(crate) listener: OnceLock<Listener>,
    pub(crate) counters: Counters,
    shut_down: AtomicBool,
    /// Work that may leave a lease held if it is cut short: acquisition
    /// attempts on tasks of their own, releases sent in the background
    /// (dropped leases, abandoned acquisitions, leases given up locally),
    /// and `hold` calls until their lease is registered. `shutdown` waits
    /// for all of it, so that a process that stops cleanly leaves nothing
    /// held.
    pub(crate) background: TaskTracker,
    /// Bumped each time a renewal statement's outcome has been applied.
    applied: watch::Sender<u64>,
}

impl Shared {
    pub(crate) fn new(pool: PgPool, options: ManagerOptions) -> Self {
        Shared {
            pool,
            options,
            registry: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            stop: CancellationToken::new(),
            renewer: Mutex::new(None),
            listener: OnceLock::new(),
            counters: Counters::default(),
            shut_down: AtomicBool::new(false),
            background: TaskTracker::new(),
            applied: watch::channel(0).0,
        }
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    fn registry(&self) -> MutexGuard<'_, HashMap<(String, i64), Entry>> {
        // The map stays consistent even if a holder panicked: recover it.
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops renewing `lease`; returns its registry entry if it had one.
    fn forget(&self, lease: &Lease) -> Option<Entry> {
        self.registry()
            .remove(&(lease.name().to_owned(), lease.token().get()))
    }
}

/// One held lease in the renewal registry.
struct Entry {
    state: Arc<HeldState>,
    renew_at: Instant,
    in_flight: bool,
    failures: u32,
}

/// What the holder and the renewal task both see of one held lease.
struct HeldState {
    lease: Lease,
    timing: Timing,
    /// The TTL as an interval, for the renewal statement.
    pg_ttl: PgInterval,
    view: watch::Sender<View>,
    lost: CancellationToken,
    renewal: Mutex<RenewalStatus>,
}

#[derive(Debug, Clone)]
struct View {
    deadline: Instant,
    expires_at: DateTime<Utc>,
    lost: Option<LossReason>,
    lost_at: Option<Instant>,
}

#[derive(Default)]
struct RenewalStatus {
    last_error: Option<Arc<Error>>,
    sent_at: Option<Instant>,
}

impl HeldState {
    fn fire_at(&self) -> Instant {
        let deadline = self.view.borrow().deadline;
        deadline.checked_sub(self.timing.early).unwrap_or(deadline)
    }

    /// Marks the lease lost (once; later reasons are ignored) and cancels
    /// its token. Returns whether this call was the one that did it.
    fn fire(&self, reason: LossReason) -> bool {
        let fired = self.view.send_if_modified(|v| {
            if v.lost.is_some() {
                return false;
            }
            tracing::warn!(name = self.lease.name(), token = self.lease.token().get(), %reason, "lease lost");
            v.lost = Some(reason);
            v.lost_at = Some(Instant::now());
            true
        });
        if fired {
            self.lost.cancel();
        }
        fired
    }

    /// The reason for a loss at the local deadline.
    fn deadline_reason(&self) -> LossReason {
        let status = self
            .renewal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(error) = &status.last_error {
            return LossReason::Unreachable {
                error: error.clone(),
            };
        }
        if let Some(sent) = status.sent_at {
            return LossReason::Unreachable {
                error: Arc::new(Error::Timeout {
                    operation: "renewal",
                    after: Some(sent.elapsed()),
                }),
            };
        }
        LossReason::Expired
    }

    /// Fires the loss at the local deadline if it has passed; returns the
    /// reason if the lease is lost.
    fn check(&self) -> Option<LossReason> {
        if let Some(reason) = &self.view.borrow().lost {
            return Some(reason.clone());
        }
        if Instant::now() >= self.fire_at() {
            self.fire(self.deadline_reason());
        }
        self.view.borrow().lost.clone()
    }

    fn set_renewal(&self, last_error: Option<Arc<Error>>, sent_at: Option<Instant>) {
        let mut status = self
            .renewal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        status.last_error = last_error;
        status.sent_at = sent_at;
    }

    fn confirm(&self, sent: Instant, expires_at: DateTime<Utc>) {
        let deadline = sent + self.timing.ttl - self.timing.margin;
        self.view.send_if_modified(|v| {
            if v.lost.is_some() || deadline <= v.deadline {
                return false;
            }
            v.deadline = deadline;
            v.expires_at = expires_at;
            true
        });
        self.set_renewal(None, None);
    }
}

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
    inner: Arc<Held>,
}

/// What the clones of one [`HeldLease`] share; released when the last one
/// is dropped.
struct Held {
    manager: LeaseManager,
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
        self.inner.state.check().is_some()
    }

    /// Why the lease is lost, if it is.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.inner.state.check()
    }

    /// When the loss signal fired, if it has.
    pub fn lost_at(&self) -> Option<std::time::Instant> {
        self.inner.state.check();
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
            if let Some(reason) = self.inner.state.check() {
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

    /// A token cancelled when the lease is lost, for work that already
    /// speaks `CancellationToken`. Cancelling it yourself affects only your
    /// copy, not the lease.
    pub fn loss_token(&self) -> CancellationToken {
        self.inner.state.check();
        self.inner.state.lost.child_token()
    }

    /// Begins a fenced transaction under this lease, refusing with
    /// [`Error::Lost`] if the lease is already lost locally (the database
    /// checks the token again either way).
    pub async fn begin_fenced(&self) -> Result<FencedTransaction> {
        if let Some(reason) = self.inner.state.check() {
            return Err(self.lost_error(reason));
        }
        self.inner.manager.begin_fenced(self).await
    }

    /// Stops renewing and releases the lease in the database. Returns
    /// `true` if this ended it, `false` if it had already ended (lost).
    pub async fn release(self) -> Result<bool> {
        self.inner.manager.shared().forget(&self.inner.state.lease);
        self.inner.state.fire(LossReason::Released);
        let outcome = self.inner.manager.release(&self).await;
        // Only now: if this future is dropped before the database answers,
        // `Drop` releases in the background instead.
        self.inner.released.store(true, Ordering::Release);
        outcome
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
    /// [`MAX_TTL`](crate::MAX_TTL) (the handle is then dropped, which
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
        check_duration("after", after)?;
        if let Some(reason) = self.inner.state.check() {
            return Err(self.lost_error(reason));
        }
        // From here on neither renewed nor released (not even by Drop).
        self.inner.released.store(true, Ordering::Release);
        let shared = self.inner.manager.shared();
        let mut applied = shared.applied.subscribe();
        let in_flight = shared
            .forget(&self.inner.state.lease)
            .is_some_and(|e| e.in_flight);
        self.inner.state.fire(LossReason::Released);
        if in_flight {
            // A renewal already sent would, landing after the statement
            // below, set the expiry to a TTL from then: let it land first.
            let limit = shared.options.renew_timeout_value();
            let _ = tokio::time::timeout(limit, applied.changed()).await;
        }
        self.inner.manager.renew(&self, after).await
    }

    fn lost_error(&self, reason: LossReason) -> Error {
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

impl Drop for Held {
    fn drop(&mut self) {
        if self.released.load(Ordering::Acquire) {
            return;
        }
        self.manager.shared().forget(&self.state.lease);
        // No longer valid in the database: nothing to give back.
        let stale = matches!(
            self.state.view.borrow().lost,
            Some(LossReason::Stale { .. })
        );
        self.state.fire(LossReason::Released);
        if !stale {
            release_in_background(self.manager.shared(), &self.state.lease);
        }
    }
}

/// Releases `lease` on a spawned task if a runtime is available; the
/// manager's [`shutdown`](LeaseManager::shutdown) waits for it.
pub(crate) fn release_in_background(shared: &Arc<Shared>, lease: &Lease) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let pool = shared.pool.clone();
    let limit = shared.options.renew_timeout_value();
    let (name, token) = (lease.name().to_owned(), lease.token().get());
    shared.background.spawn_on(
        async move {
            let release = sqlx::query(sql::RELEASE)
                .bind(&name)
                .bind(token)
                .execute(&pool);
            match tokio::time::timeout(limit, release).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => tracing::debug!(name, token, %error, "background release failed"),
                Err(_) => tracing::debug!(name, token, "background release timed out"),
            }
        },
        &runtime,
    );
}

impl LeaseManager {
    /// Acquires lease `name` as `how` says (waiting as long as it allows,
    /// see [`LeaseManager::acquire`]) and keeps it renewed in the
    /// background until every clone of the returned handle is dropped, one
    /// is released, or the lease is lost.
    ///
    /// # Errors
    ///
    /// Those of [`LeaseManager::acquire`]; and [`Error::InvalidInput`] if
    /// the renewal period (TTL × renew fraction) would not come before the
    /// local deadline (TTL − safety margin).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, nothing stays held (an
    /// acquisition in flight is released in the background).
    pub async fn hold(&self, name: &str, how: Acquire) -> Result<HeldLease> {
        // The TTL as renewals send it, validated and converted once.
        let pg_ttl = interval(how.lease_ttl())?;
        let timing = self.shared().options.timing(how.lease_ttl())?;
        // Until the lease is registered (or released, if a shutdown came
        // first), `shutdown` waits for this call.
        let _busy = self.shared().background.token();
        let (lease, sent) = self.acquire_sent(name, &how).await?;
        Ok(self.register(lease, sent, timing, pg_ttl))
    }

    /// Runs `work` while holding lease `name`: acquires it as `how` says,
    /// renews it in the background, and releases it when `work` finishes.
    ///
    /// If the lease is lost first, `work` is dropped at its next await
    /// point (stopped) and this returns [`Error::Lost`] with the reason,
    /// converted into `work`'s error type: one `?` handles both. `work`
    /// gets a clone of the held lease (move it into spawned tasks freely)
    /// for its token and loss signal; fenced writes inside it should use
    /// [`HeldLease::begin_fenced`].
    ///
    /// ```no_run
    /// # async fn f(leases: pglease::LeaseManager) -> Result<(), pglease::Error> {
    /// use std::time::Duration;
    /// use pglease::Acquire;
    ///
    /// let rows = leases
    ///     .with_lease("nightly-report", Acquire::ttl(Duration::from_secs(30)), async |held| {
    ///         let mut tx = held.begin_fenced().await?;
    ///         let rows = sqlx::query("DELETE FROM outbox").execute(&mut *tx).await?;
    ///         tx.commit().await?;
    ///         Ok::<_, pglease::Error>(rows.rows_affected())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Those of [`LeaseManager::hold`] and [`Error::Lost`], converted into
    /// `E`; `work`'s own error. A failed release after the work is logged,
    /// not returned (the lease then ends at its expiry).
    ///
    /// # Cancel safety
    ///
    /// Dropped early, `work` is dropped with it and the lease is released
    /// in the background.
    pub async fn with_lease<T, E, F>(&self, name: &str, how: Acquire, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(HeldLease) -> Result<T, E>,
        E: From<Error>,
    {
        let held = self.hold(name, how).await?;
        let outcome = {
            let work = work(held.clone());
            tokio::select! {
                biased;
                reason = held.lost() => Err(reason),
                value = work => Ok(value),
            }
        };
        match outcome {
            Ok(value) => {
                if let Err(error) = held.release().await {
                    // The work is done; an unreleased lease only delays the
                    // next holder until it expires.
                    tracing::warn!(name, %error, "could not release the lease after the work");
                }
                value
            }
            Err(reason) => Err(held.lost_error(reason).into()),
        }
    }

    /// Releases every lease this manager holds, stops its background tasks
    /// and refuses further acquisitions with [`Error::ShutDown`]. Every held
    /// lease reports [`LossReason::Released`] at once; then each is released
    /// in the database (each release bounded by the renewal timeout), and
    /// the releases already under way in the background (of
    /// [`HeldLease`]s dropped before, for instance with the work future
    /// that held them) are waited for, bounded the same way. Call it last
    /// before the process exits: after it, nothing this manager acquired is
    /// left held, and the next holder takes over at once instead of after
    /// a TTL. See [`shutdown_signal`](crate::shutdown_signal) for tying it
    /// to SIGTERM.
    ///
    /// # Errors
    ///
    /// The first failure among the held leases' releases, after trying them
    /// all; a lease whose release failed ends at its expiry. Failures of
    /// background releases are logged, not returned.
    ///
    /// # Cancel safety
    ///
    /// Dropped early, the manager is shut down all the same (every held
    /// lease has reported its loss), but the leases whose release was not
    /// reached end at their expiry.
    pub async fn shutdown(&self) -> Result<()> {
        let shared = self.shared();
        shared.shut_down.store(true, Ordering::Release);
        let entries: Vec<Entry> = shared.registry().drain().map(|(_, e)| e).collect();
        shared.stop.cancel();
        // Every holder hears of it before the first release is awaited.
        for entry in &entries {
            entry.state.fire(LossReason::Released);
        }
        let limit = shared.options.renew_timeout_value();
        let mut first_error = None;
        for entry in &entries {
            let lease = &entry.state.lease;
            let release = self.release(lease);
            let outcome = match tokio::time::timeout(limit, release).await {
                Ok(outcome) => outcome.map(|_| ()),
                Err(_) => Err(Error::Lost {
                    name: lease.name().to_owned(),
                    token: lease.token(),
                    reason: LossReason::Unreachable {
                        error: Arc::new(Error::Timeout {
                            operation: "release",
                            after: Some(limit),
                        }),
                    },
                }),
            };
            if let Err(error) = outcome {
                first_error.get_or_insert(error);
            }
        }
        // Leases dropped before this call, acquisitions nobody took
        // delivery of and leases given up locally are being released in
        // the background, and attempts may still be in the database (they
        // answer within about 2 s, and `hold` then releases what it got,
        // since the manager is shut down): wait for those too, so that a
        // process that returns from `main` after this leaves nothing held.
        shared.background.close();
        let background = limit + Duration::from_secs(1);
        if tokio::time::timeout(background, shared.background.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                ?background,
                "background releases still unfinished at shutdown"
            );
        }
        first_error.map_or(Ok(()), Err)
    }

    /// A snapshot of this manager's counters.
    pub fn stats(&self) -> ManagerStats {
        let shared = self.shared();
        let c = &shared.counters;
        ManagerStats {
            held: shared.registry().len(),
            renewal_statements: c.renewal_statements.load(Ordering::Relaxed),
            leases_renewed: c.leases_renewed.load(Ordering::Relaxed),
            renewal_failures: c.renewal_failures.load(Ordering::Relaxed),
            acquire_attempts: c.acquire_attempts.load(Ordering::Relaxed),
            waiting: c.waiting.load(Ordering::Relaxed),
            listening: shared.listener.get().is_some_and(Listener::is_listening),
        }
    }

    fn register(
        &self,
        lease: Lease,
        sent: Instant,
        timing: Timing,
        pg_ttl: PgInterval,
    ) -> HeldLease {
        let shared = self.shared();
        let deadline = sent + timing.ttl - timing.margin;
        let (view, _) = watch::channel(View {
            deadline,
            expires_at: lease.expires_at(),
            lost: None,
            lost_at: None,
        });
        let state = Arc::new(HeldState {
            lease,
            timing,
            pg_ttl,
            view,
            lost: CancellationToken::new(),
            renewal: Mutex::new(RenewalStatus::default()),
        });
        shared.registry().insert(
            (state.lease.name().to_owned(), state.lease.token().get()),
            Entry {
                state: state.clone(),
                renew_at: sent + timing.period,
                in_flight: false,
                failures: 0,
            },
        );
        if shared.is_shut_down() {
            // A shutdown raced this acquisition: do not leave it behind.
            shared.forget(&state.lease);
            state.fire(LossReason::Released);
            release_in_background(shared, &state.lease);
        } else {
            let mut renewer = shared
                .renewer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if renewer.as_ref().is_none_or(|task| task.is_finished()) {
                *renewer = Some(tokio::spawn(renewal_task(shared.clone())));
            }
            drop(renewer);
            shared.wake.notify_one();
        }
        HeldLease {
            inner: Arc::new(Held {
                manager: self.clone(),
                state,
                released: AtomicBool::new(false),
            }),
        }
    }
}

/// Leases sent in one renewal statement.
struct Batch {
    keys: Vec<(String, i64)>,
    ttls: Vec<PgInterval>,
    /// The earliest instant at which any held lease is given up.
    first_fire_at: Instant,
}

struct BatchOutcome {
    keys: Vec<(String, i64)>,
    sent: Instant,
    result: std::result::Result<Vec<PgRow>, Arc<Error>>,
}

type InFlight = Pin<Box<dyn Future<Output = BatchOutcome> + Send>>;

/// The manager's one renewal task. Each turn it fires the losses whose
/// deadline has come, sends one statement for every lease that is due (and
/// those due within half a period, so that leases acquired at different
/// times fall into step), and sleeps until the next thing to do. The
/// deadline timer does not wait for a renewal in flight.
async fn renewal_task(shared: Arc<Shared>) {
    let mut in_flight: Option<InFlight> = None;
    loop {
        let now = Instant::now();
        let (batch, next_wake) = plan(&shared, now, in_flight.is_none());
        if let Some(batch) = batch {
            in_flight = Some(Box::pin(send_batch(shared.clone(), batch)));
        }
        let far = now + Duration::from_secs(3600);
        tokio::select! {
            () = shared.stop.cancelled() => return,
            () = shared.wake.notified() => {}
            () = tokio::time::sleep_until(next_wake.unwrap_or(far)) => {}
            outcome = poll_in_flight(&mut in_flight) => {
                in_flight = None;
                apply(&shared, outcome);
            }
        }
    }
}

async fn poll_in_flight(in_flight: &mut Option<InFlight>) -> BatchOutcome {
    match in_flight {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

/// Fires due losses and picks the next batch; returns it and when to wake.
fn plan(shared: &Arc<Shared>, now: Instant, can_send: bool) -> (Option<Batch>, Option<Instant>) {
    let mut registry = shared.registry();
    let mut gone = Vec::new();
    for (key, entry) in registry.iter() {
        let state = &entry.state;
        let lost = state.view.borrow().lost.clone();
        if let Some(reason) = lost {
            // Fired by the holder's own check of the deadline.
            gone.push((key.clone(), Some(reason)));
        } else if now >= state.fire_at() {
            let reason = match state.deadline_reason() {
                // Not renewed because the statement before it hangs.
                LossReason::Expired if !can_send => LossReason::Unreachable {
                    error: Arc::new(Error::Timeout {
                        operation: "renewal statement (sent for other leases)",
                        after: None,
                    }),
                },
                reason => reason,
            };
            state.fire(reason.clone());
            gone.push((key.clone(), Some(reason)));
        }
    }
    for (key, reason) in gone {
        if let Some(entry) = registry.remove(&key) {
            // A lease given up locally may still be valid in the database:
            // release it so that the next holder need not wait for expiry.
            if matches!(
                reason,
                Some(LossReason::Expired | LossReason::Unreachable { .. })
            ) {
                release_in_background(shared, &entry.state.lease);
            }
        }
    }

    let mut next_wake: Option<Instant> = None;
    let mut wake_at = |at: Instant| {
        next_wake = Some(next_wake.map_or(at, |w| w.min(at)));
    };
    let mut batch = Batch {
        keys: Vec::new(),
        ttls: Vec::new(),
        first_fire_at: now + Duration::from_secs(3600),
    };
    let mut first_renew_at = now + Duration::from_secs(3600);
    for (key, entry) in registry.iter_mut() {
        wake_at(entry.state.fire_at());
        // A statement in flight holds up every lease, not only its own:
        // it must give up before the first lease anywhere would be lost.
        batch.first_fire_at = batch.first_fire_at.min(entry.state.fire_at());
        if !can_send || entry.in_flight {
            continue;
        }
        if entry.renew_at > now + entry.state.timing.period / 2 {
            wake_at(entry.renew_at);
            continue;
        }
        first_renew_at = first_renew_at.min(entry.renew_at);
        batch.keys.push(key.clone());
        batch.ttls.push(entry.state.pg_ttl);
    }
    // Send only when something is due now; those due within half a period
    // then go along (sending for the early ones alone would renew a few
    // leases at a time as they enter the window).
    if batch.keys.is_empty() || first_renew_at > now {
        if !batch.keys.is_empty() {
            wake_at(first_renew_at);
        }
        return (None, next_wake);
    }
    for key in &batch.keys {
        if let Some(entry) = registry.get_mut(key) {
            entry.in_flight = true;
            let status = entry.state.renewal.lock();
            let mut status = status.unwrap_or_else(std::sync::PoisonError::into_inner);
            status.sent_at.get_or_insert(now);
        }
    }
    (Some(batch), next_wake)
}

/// Sends one renewal statement with a timeout. On timeout the connection is
/// closed rather than returned to the pool with a statement still running.
async fn send_batch(shared: Arc<Shared>, batch: Batch) -> BatchOutcome {
    let sent = Instant::now();
    let limit = shared
        .options
        .renew_timeout_value()
        .min(batch.first_fire_at.saturating_duration_since(sent))
        .max(Duration::from_millis(1));
    let names: Vec<&str> = batch.keys.iter().map(|k| k.0.as_str()).collect();
    let tokens: Vec<i64> = batch.keys.iter().map(|k| k.1).collect();
    shared
        .counters
        .renewal_statements
        .fetch_add(1, Ordering::Relaxed);
    let mut slot = None;
    let outcome = tokio::time::timeout(limit, async {
        let conn = slot.insert(shared.pool.acquire().await?);
        sqlx::query(sql::RENEW_MANY)
            .bind(&names)
            .bind(&tokens)
            .bind(&batch.ttls)
            .fetch_all(&mut **conn)
            .await
    })
    .await;
    let result = match outcome {
        Ok(Ok(rows)) => Ok(rows),
        Ok(Err(error)) => Err(Arc::new(Error::from(error))),
        Err(_) => {
            if let Some(mut conn) = slot.take() {
                conn.close_on_drop();
            }
            Err(Arc::new(Error::Timeout {
                operation: "renewal",
                after: Some(limit),
            }))
        }
    };
    BatchOutcome {
        keys: batch.keys,
        sent,
        result,
    }
}

/// Applies a renewal statement's outcome to the registry.
fn apply(shared: &Arc<Shared>, outcome: BatchOutcome) {
    let now = Instant::now();
    let mut registry = shared.registry();
    let rows = match outcome.result {
        Ok(rows) => rows,
        Err(error) => {
            shared
                .counters
                .renewal_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%error, leases = outcome.keys.len(), "renewal failed; retrying");
            for key in &outcome.keys {
                if let Some(entry) = registry.get_mut(key) {
                    entry.in_flight = false;
                    entry.failures = entry.failures.saturating_add(1);
                    entry.state.set_renewal(Some(error.clone()), None);
                    entry.renew_at = now + retry_delay(entry.failures, entry.state.timing.period);
                }
            }
            drop(registry);
            shared.applied.send_modify(|n| *n = n.wrapping_add(1));
            shared.wake.notify_one();
            return;
        }
    };
    let mut renewed = 0;
    for row in &rows {
        let parsed: std::result::Result<_, sqlx::Error> = (|| {
            Ok((
                row.try_get::<String, _>("name")?,
                row.try_get::<i64, _>("token")?,
                row.try_get::<bool, _>("renewed")?,
                row.try_get::<Option<DateTime<Utc>>, _>("expires_at")?,
                row.try_get::<Option<i64>, _>("current_token")?,
                row.try_get::<Option<String>, _>("current_holder")?,
            ))
        })();
        let Ok((name, token, ok, expires_at, current_token, current_holder)) = parsed else {
            continue;
        };
        let key = (name, token);
        let Some(entry) = registry.get_mut(&key) else {
            continue; // released or given up meanwhile
        };
        entry.in_flight = false;
        match (ok, expires_at) {
            (true, Some(expires_at)) => {
                renewed += 1;
                entry.failures = 0;
                entry.state.confirm(outcome.sent, expires_at);
                entry.renew_at = outcome.sent + entry.state.timing.period;
            }
            _ => {
                let reason = if current_token == Some(token) && current_holder.is_none() {
                    LossReason::Released
                } else {
                    LossReason::Stale {
                        current_token: current_token.map(Token::issued),
                        current_holder,
                    }
                };
                entry.state.fire(reason);
                registry.remove(&key);
            }
        }
    }
    // Every element yields a row; should one be missing, try it again.
    for key in &outcome.keys {
        if let Some(entry) = registry.get_mut(key) {
            entry.in_flight = false;
        }
    }
    shared
        .counters
        .leases_renewed
        .fetch_add(renewed, Ordering::Relaxed);
    drop(registry);
    shared.applied.send_modify(|n| *n = n.wrapping_add(1));
}

/// Backoff between renewal retries: 10 ms doubling, at most a quarter of the
/// renewal period, with jitter so that many managers do not retry in step.
fn retry_delay(failures: u32, period: Duration) -> Duration {
    let cap = (period / 4).max(Duration::from_millis(10));
    crate::waiting::backoff(Duration::from_millis(10), failures, cap)
}
