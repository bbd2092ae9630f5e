//! Waiting acquisition: retry when the holder releases (LISTEN on the
//! channel `pglease_release`, which `pglease.release` notifies for names
//! that a session watches with `pglease.watch`), otherwise when the
//! holder's lease expires, with backoff and jitter; polling only when no
//! listener is available.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::{Notify, broadcast, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::holding::{Shared, release_in_background};
use crate::input::check_text;
use crate::lease::{Acquire, Lease, LeaseManager, Token, interval, ttl_duration};
use crate::sql;

/// The channel `pglease.release` notifies, with the lease name as payload.
pub const RELEASE_CHANNEL: &str = "pglease_release";

/// How long a waiter waits for the listener to confirm a watch before it
/// falls back to polling for that round.
const WATCH_CONFIRM: Duration = Duration::from_secs(1);

/// How long one watch or unwatch statement on the listening connection may
/// take before the connection is given up and opened again.
const WATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// A number in [0, 1) for jitter. Each `RandomState` is seeded differently,
/// which is all the randomness jitter needs.
pub(crate) fn jitter() -> f64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let bits = RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed));
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// Exponential backoff with jitter: `first` doubled for each attempt after
/// the first (attempt 1 waits about `first`), at most `cap`, then scaled by
/// a random factor in [0.5, 1) so that many clients do not retry in step.
pub(crate) fn backoff(first: Duration, attempt: u32, cap: Duration) -> Duration {
    let doubled = first.saturating_mul(1 << (attempt.clamp(1, 16) - 1));
    doubled.min(cap).mul_f64(0.5 + jitter() / 2.0)
}

/// The outcome of one acquisition statement.
pub(crate) enum Attempt {
    Acquired {
        lease: Lease,
        /// When the statement that last confirmed the lease was sent (the
        /// start of the local deadline): the acquisition, or the renewal
        /// that confirmed a late one.
        sent: Instant,
    },
    Held {
        /// The current or last holder (`None` once released).
        holder: Option<String>,
        expires_at: DateTime<Utc>,
        /// The database time of the decision, to turn `expires_at` into a
        /// wait without comparing clocks.
        checked_at: DateTime<Utc>,
        /// Why an ended lease could not be taken.
        note: Option<String>,
    },
}

impl Attempt {
    /// For a lease found held: the error to report, [`Error::Pinned`] when
    /// the lease has ended but a stale fenced transaction still holds it.
    pub(crate) fn refusal(
        name: &str,
        holder: Option<String>,
        expires_at: DateTime<Utc>,
        checked_at: DateTime<Utc>,
        note: Option<String>,
    ) -> Error {
        let pinned = pinned(holder.as_deref(), expires_at, checked_at);
        match holder {
            Some(holder) if !pinned => Error::Held {
                name: name.to_owned(),
                holder,
                expires_at,
            },
            holder => Error::Pinned {
                name: name.to_owned(),
                holder,
                ended_at: expires_at,
                reason: note.unwrap_or_else(|| {
                    "a transaction that the database could not end holds its row".to_owned()
                }),
            },
        }
    }
}

/// Whether a "not acquired" answer describes a lease that has ended (it
/// expired before the decision, or was released) and is only pinned by a
/// transaction that could not be ended.
fn pinned(holder: Option<&str>, expires_at: DateTime<Utc>, checked_at: DateTime<Utc>) -> bool {
    holder.is_none() || expires_at <= checked_at
}

/// Where a watched name stands on the listening connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum WatchState {
    /// Not watched on the current connection yet (or any more).
    Pending,
    /// `pglease.watch` succeeded: its releases are notified.
    Watched,
    /// `pglease.watch` returned false (a release was committing), or
    /// failed with a database error (the schema lacks it, or the role may
    /// not call it).
    Refused,
    /// Nobody waited any more and `pglease.unwatch` is on its way: not
    /// watched, whatever the connection holds. A waiter who comes now
    /// waits for the name to be watched again.
    Unwatching,
}

struct WatchEntry {
    waiters: usize,
    state: WatchState,
}

/// The names waiters wait for, shared by the waiters (who add and drop
/// interest) and the listening task (which watches and unwatches them on
/// its connection).
struct Watches {
    entries: Mutex<HashMap<String, WatchEntry>>,
    /// Wakes the listening task: some entry needs a statement.
    poke: Notify,
    /// Bumped whenever the task has changed an entry's state.
    changes: watch::Sender<u64>,
    /// Whether a failing `pglease.watch` has been reported already.
    warned: std::sync::atomic::AtomicBool,
}

impl Watches {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, WatchEntry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new or lost connection watches nothing: every name is pending.
    fn reset(&self) {
        let mut entries = self.entries();
        entries.retain(|_, e| e.waiters > 0);
        for entry in entries.values_mut() {
            entry.state = WatchState::Pending;
        }
        drop(entries);
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Watches the pending names that waiters wait for, and unwatches the
    /// names nobody waits for any more, one statement each. Returns an
    /// error only when the connection should be given up (a timeout or a
    /// lost connection); a statement the database refuses leaves the name
    /// refused, and its waiters poll.
    async fn reconcile(&self, connection: &mut PgListener) -> std::result::Result<(), sqlx::Error> {
        loop {
            let next = {
                let mut entries = self.entries();
                entries.retain(|_, e| {
                    e.waiters > 0 || matches!(e.state, WatchState::Watched | WatchState::Unwatching)
                });
                // The decision and the state change are made under one
                // lock: no waiter can take a name that is being unwatched
                // for a watched one.
                entries
                    .iter_mut()
                    .find_map(|(name, e)| match (e.waiters > 0, e.state) {
                        (true, WatchState::Pending) => Some((name.clone(), true)),
                        (false, WatchState::Watched) => {
                            e.state = WatchState::Unwatching;
                            Some((name.clone(), false))
                        }
                        _ => None,
                    })
            };
            let Some((name, watch)) = next else {
                return Ok(());
            };
            let statement = if watch { sql::WATCH } else { sql::UNWATCH };
            let done = tokio::time::timeout(
                WATCH_TIMEOUT,
                sqlx::query_scalar::<_, bool>(statement)
                    .bind(&name)
                    .fetch_one(&mut *connection),
            )
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?;
            let state = match (watch, done) {
                (true, Ok(true)) => WatchState::Watched,
                (true, Ok(false)) => WatchState::Refused,
                (true, Err(sqlx::Error::Database(error))) => {
                    if !self.warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            %error,
                            "pglease.watch failed (is the schema migrated?); waiters poll"
                        );
                    }
                    WatchState::Refused
                }
                // Unwatched, or the database refused to: either way only
                // a waiter that comes now needs the name watched again.
                (false, Ok(_) | Err(sqlx::Error::Database(_))) => WatchState::Pending,
                (_, Err(error)) => return Err(error),
            };
            if let Some(entry) = self.entries().get_mut(&name) {
                entry.state = state;
            }
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// A waiter's interest in the releases of one name. Dropped, it lets the
/// listener unwatch the name once no other waiter waits for it.
pub(crate) struct Watching {
    watches: Arc<Watches>,
    name: String,
}

impl Watching {
    /// Whether releases of the name are notified now. Waits up to
    /// `WATCH_CONFIRM` (at most until `deadline`) for the listener to watch
    /// it; a watch refused earlier (a release was committing) is asked for
    /// again.
    async fn confirmed(&self, listening: bool, deadline: Instant) -> bool {
        let mut changes = self.watches.changes.subscribe();
        let state = |watches: &Watches| watches.entries().get(&self.name).map(|e| e.state);
        {
            let mut entries = self.watches.entries();
            match entries.get_mut(&self.name) {
                Some(entry) if entry.state == WatchState::Watched => return true,
                Some(entry) if entry.state == WatchState::Refused => {
                    entry.state = WatchState::Pending;
                    self.watches.poke.notify_one();
                }
                _ => {}
            }
        }
        if !listening {
            return false;
        }
        let until = (Instant::now() + WATCH_CONFIRM).min(deadline);
        loop {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return false },
                () = tokio::time::sleep_until(until) => return false,
            }
            match state(&self.watches) {
                Some(WatchState::Watched) => return true,
                Some(WatchState::Pending | WatchState::Unwatching) => {}
                Some(WatchState::Refused) | None => return false,
            }
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        if let Some(entry) = self.watches.entries().get_mut(&self.name) {
            entry.waiters = entry.waiters.saturating_sub(1);
        }
        self.watches.poke.notify_one();
    }
}

/// The manager's listener for releases, started by the first waiter.
pub(crate) struct Listener {
    /// A released name, or `None` for "anything may have been released"
    /// (the listener (re)connected and may have missed notifications).
    releases: broadcast::Sender<Option<String>>,
    listening: watch::Sender<bool>,
    watches: Arc<Watches>,
    options: PgConnectOptions,
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Listener {
    fn new(options: PgConnectOptions, stop: CancellationToken) -> Listener {
        let (releases, _) = broadcast::channel(256);
        let (listening, _) = watch::channel(false);
        Listener {
            releases,
            listening,
            watches: Arc::new(Watches {
                entries: Mutex::new(HashMap::new()),
                poke: Notify::new(),
                changes: watch::channel(0).0,
                warned: std::sync::atomic::AtomicBool::new(false),
            }),
            options,
            stop,
            task: Mutex::new(None),
        }
    }

    /// Registers a waiter's interest in the releases of `name`.
    fn watch(&self, name: &str) -> Watching {
        self.watches
            .entries()
            .entry(name.to_owned())
            .or_insert(WatchEntry {
                waiters: 0,
                state: WatchState::Pending,
            })
            .waiters += 1;
        self.watches.poke.notify_one();
        Watching {
            watches: Arc::clone(&self.watches),
            name: name.to_owned(),
        }
    }

    /// Starts the listening task, or starts it again if the runtime it ran
    /// on has ended (it stops by itself only when the manager stops).
    fn ensure_running(&self) {
        let mut task = self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !self.stop.is_cancelled() && task.as_ref().is_none_or(|t| t.is_finished()) {
            self.listening.send_replace(false);
            *task = Some(tokio::spawn(listen(
                self.options.clone(),
                self.releases.clone(),
                self.listening.clone(),
                Arc::clone(&self.watches),
                self.stop.clone(),
            )));
        }
    }

    pub(crate) fn is_listening(&self) -> bool {
        *self.listening.borrow()
    }
}

/// Keeps one LISTEN connection open (its own, outside the manager's pool),
/// watches on it the names that waiters wait for, and forwards
/// notifications; reconnects with backoff when it drops.
async fn listen(
    options: PgConnectOptions,
    releases: broadcast::Sender<Option<String>>,
    listening: watch::Sender<bool>,
    watches: Arc<Watches>,
    stop: CancellationToken,
) {
    let mut failures: u32 = 0;
    loop {
        let connect = async {
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(10))
                .connect_lazy_with(options.clone());
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.eager_reconnect(false);
            listener.listen(RELEASE_CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let connected = tokio::select! {
            () = stop.cancelled() => return,
            connected = connect => connected,
        };
        match connected {
            Ok(mut listener) => {
                failures = 0;
                // This session watches nothing yet: watch what waiters
                // wait for, then tell them to retry (releases while nobody
                // listened went unheard).
                watches.reset();
                listening.send_replace(true);
                let mut healthy = tokio::select! {
                    () = stop.cancelled() => return,
                    done = watches.reconcile(&mut listener) => done.is_ok(),
                };
                let _ = releases.send(None);
                while healthy {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = watches.poke.notified() => {
                            healthy = tokio::select! {
                                () = stop.cancelled() => return,
                                done = watches.reconcile(&mut listener) => done.is_ok(),
                            };
                        }
                        received = listener.try_recv() => match received {
                            Ok(Some(notification)) => {
                                let _ = releases.send(Some(notification.payload().to_owned()));
                            }
                            Ok(None) | Err(_) => healthy = false,
                        },
                    }
                }
                listening.send_replace(false);
                watches.reset();
                let _ = releases.send(None);
                tracing::debug!("release listener lost its connection; reconnecting");
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                tracing::debug!(%error, "cannot listen for releases; waiters poll");
            }
        }
        let pause = backoff(
            Duration::from_millis(50),
            failures.saturating_add(1),
            Duration::from_millis(50 << 6),
        );
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// An attempt's outcome on its way to the waiter. Dropped with an acquired
/// lease still inside (the waiter stopped waiting), it releases the lease
/// in the background.
struct Delivery {
    outcome: Option<Result<Attempt>>,
    shared: Arc<Shared>,
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let Some(Ok(Attempt::Acquired { lease, .. })) = self.outcome.take() {
            release_in_background(&self.shared, &lease);
        }
    }
}

/// Counts a waiting acquirer for [`crate::ManagerStats::waiting`].
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl LeaseManager {
    /// One acquisition statement (one round trip), and, if its answer came
    /// late, the renewal that confirms it.
    pub(crate) async fn attempt(
        &self,
        name: &str,
        holder: &str,
        ttl: PgInterval,
    ) -> Result<Attempt> {
        let sent = Instant::now();
        let row = sqlx::query(sql::ACQUIRE)
            .bind(name)
            .bind(holder)
            .bind(ttl)
            .fetch_one(self.pool())
            .await;
        self.shared()
            .counters
            .acquire_attempts
            .fetch_add(1, Ordering::Relaxed);
        let row = row?;
        let token: Option<i64> = row.try_get("token")?;
        let expires_at: DateTime<Utc> = row.try_get("expires_at")?;
        let current_holder: Option<String> = row.try_get("holder")?;
        let checked_at: DateTime<Utc> = row.try_get("checked_at")?;
        let Some(token) = token else {
            return Ok(Attempt::Held {
                holder: current_holder,
                expires_at,
                checked_at,
                note: row.try_get("note")?,
            });
        };
        let lease = Lease::new(
            name,
            current_holder.unwrap_or_else(|| holder.to_owned()),
            Token::issued(token),
            expires_at,
            checked_at,
        );
        let window = self.shared().options.confirm_after(ttl_duration(ttl));
        if sent.elapsed() <= window {
            return Ok(Attempt::Acquired { lease, sent });
        }
        self.confirm(lease, ttl).await
    }

    /// Confirms an acquisition whose answer came late with a renewal under
    /// the same token: the database gave the lease a full TTL from its
    /// decision, but the local deadline, counted from the send, would have
    /// little or nothing of it left. The deadline starts again from this
    /// renewal's send; only a failed renewal makes it a loss.
    async fn confirm(&self, lease: Lease, ttl: PgInterval) -> Result<Attempt> {
        let sent = Instant::now();
        match self.renew(&lease, ttl_duration(ttl)).await {
            Ok(expires_at) => Ok(Attempt::Acquired {
                lease: lease.confirmed(expires_at),
                sent,
            }),
            Err(lost @ Error::Lost { .. }) => Err(lost),
            Err(error) => {
                // Nobody will use a lease whose confirmation failed: give
                // it back rather than leave it held until it expires.
                release_in_background(self.shared(), &lease);
                Err(error)
            }
        }
    }

    /// One attempt on a task of its own, so that a caller who stops waiting
    /// while the statement is in flight leaves nothing held: an acquisition
    /// that nobody takes delivery of is released in the background.
    async fn attempt_detached(&self, name: &str, holder: &str, ttl: PgInterval) -> Result<Attempt> {
        let (reply, answer) = oneshot::channel();
        let manager = self.clone();
        let (name, holder) = (name.to_owned(), holder.to_owned());
        // Tracked, so that `shutdown` waits for an attempt still in the
        // database and for the release of what it acquired for nobody.
        self.shared().background.spawn(async move {
            let outcome = manager.attempt(&name, &holder, ttl).await;
            // If the waiter is gone, the returned delivery is dropped here.
            let _ = reply.send(Delivery {
                outcome: Some(outcome),
                shared: Arc::clone(manager.shared()),
            });
        });
        // No await between receiving and taking: cancellation cannot fall
        // in between.
        let mut delivery = answer.await.map_err(|_| Error::ShutDown)?;
        delivery.outcome.take().unwrap_or(Err(Error::ShutDown))
    }

    fn listener(&self) -> &Listener {
        let shared = self.shared();
        let listener = shared.listener.get_or_init(|| {
            Listener::new(
                (*shared.pool.connect_options()).clone(),
                shared.stop.clone(),
            )
        });
        listener.ensure_running();
        listener
    }

    /// Acquires lease `name` as `how` says: for its TTL, for its holder,
    /// and waiting up to its [`wait`](Acquire::wait) for the current holder
    /// to release it or let it expire (by default, one attempt).
    ///
    /// Each success carries a new token, greater than every token issued
    /// before for `name`. An attempt on a held, unexpired lease is
    /// read-only in the database. On a lease that has ended but is still
    /// locked by transactions fenced under an earlier token, the database
    /// ends those transactions first; each attempt answers within about
    /// 2 s. An answer that came later than a renewal period is confirmed
    /// with a renewal before it is returned.
    ///
    /// A waiting acquisition wakes as soon as the holder releases (the
    /// manager starts listening for releases when a first attempt fails,
    /// see [`ManagerOptions::notify`](crate::ManagerOptions::notify)),
    /// otherwise retries when the holder's lease expires, with jitter; when
    /// it cannot listen it polls, backing off from 10 ms up to the
    /// configured maximum.
    ///
    /// ```no_run
    /// # async fn f(leases: pglease::LeaseManager) -> Result<(), pglease::Error> {
    /// use std::time::Duration;
    /// use pglease::{Acquire, Error};
    ///
    /// match leases.acquire("nightly-report", Acquire::ttl(Duration::from_secs(30))).await {
    ///     Ok(lease) => println!("mine under token {}", lease.token()),
    ///     Err(Error::Held { holder, .. }) => println!("{holder} has it"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Held`] (with the last holder seen) if someone holds it when
    /// the wait is over, including this holder itself: leases are not
    /// re-entrant. [`Error::Pinned`] if it has ended but a stale fenced
    /// transaction that could not be ended still holds it.
    /// [`Error::InvalidInput`] (nothing sent), [`Error::ShutDown`],
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future leaves nothing held (an attempt in
    /// flight at that moment is released if it succeeded).
    pub async fn acquire(&self, name: &str, how: Acquire) -> Result<Lease> {
        Ok(self.acquire_sent(name, &how).await?.0)
    }

    pub(crate) async fn acquire_sent(&self, name: &str, how: &Acquire) -> Result<(Lease, Instant)> {
        check_text("name", name)?;
        let holder = how.holder_name();
        let holder = holder.as_ref();
        check_text("holder", holder)?;
        let ttl = interval(how.lease_ttl())?;
        let max_wait = how.max_wait();
        let shared = Arc::clone(self.shared());
        if shared.is_shut_down() {
            return Err(Error::ShutDown);
        }
        let start = Instant::now();
        let deadline = start
            .checked_add(max_wait)
            .unwrap_or(start + Duration::from_secs(86400 * 365));
        // The release listener starts only once an attempt has failed and
        // there is time to wait: a release committed before the name is
        // watched is caught by the attempt made after the watch.
        let mut listener: Option<&Listener> = None;
        let (mut releases, mut listening) = (None, None);
        shared.counters.waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(&shared.counters.waiting);
        let mut polls: u32 = 0;
        // Releases are notified only for names a session watches: watched
        // on the listening connection after the first failed attempt.
        let mut watching: Option<Watching> = None;
        let mut watched = false;
        loop {
            let (current, expires_at, checked_at, note) =
                match self.attempt_detached(name, holder, ttl).await {
                    Ok(Attempt::Acquired { lease, sent }) => return Ok((lease, sent)),
                    Ok(Attempt::Held {
                        holder,
                        expires_at,
                        checked_at,
                        note,
                    }) => (holder, expires_at, checked_at, note),
                    // Acquired so late that it was lost before its
                    // confirming renewal: another attempt, while allowed.
                    Err(Error::Lost { .. }) if Instant::now() < deadline => continue,
                    Err(error) => return Err(error),
                };
            let pinned = pinned(current.as_deref(), expires_at, checked_at);
            let now = Instant::now();
            if now >= deadline {
                return Err(Attempt::refusal(
                    name, current, expires_at, checked_at, note,
                ));
            }
            if shared.is_shut_down() {
                return Err(Error::ShutDown);
            }
            if listener.is_none() && shared.options.notify_enabled() {
                let started = self.listener();
                releases = Some(started.releases.subscribe());
                listening = Some(started.listening.subscribe());
                listener = Some(started);
            }
            if let Some(listener) = listener.filter(|_| !watched && !pinned) {
                let watching = watching.get_or_insert_with(|| listener.watch(name));
                let confirmed = tokio::select! {
                    confirmed = watching.confirmed(listener.is_listening(), deadline) => confirmed,
                    () = shared.stop.cancelled() => return Err(Error::ShutDown),
                };
                if confirmed {
                    // A release that committed before the watch took hold
                    // notified nobody: look again now that one would.
                    watched = true;
                    continue;
                }
            }
            // Database time left on the holder's lease, as a duration on
            // this machine's clock (no clocks are compared).
            let until_expiry =
                (expires_at - checked_at).to_std().unwrap_or_default() + Duration::from_millis(1);
            // Read (and mark seen) the listener's state whether or not this
            // waiter is watched, so that an old change does not wake it.
            let connected = listening.as_mut().is_some_and(|w| *w.borrow_and_update());
            let heard = watched && connected;
            let nap = if pinned {
                // Ended but pinned by a transaction the database could not
                // end: no release or expiry will announce when it lets go.
                polls = polls.saturating_add(1);
                backoff(Duration::from_millis(10), polls, shared.options.max_poll())
            } else if heard {
                // A release wakes us; otherwise try again when it expires,
                // spread a little so that many waiters do not arrive at once.
                until_expiry
                    + until_expiry
                        .min(Duration::from_millis(250))
                        .mul_f64(jitter() / 10.0)
            } else {
                polls = polls.saturating_add(1);
                until_expiry.min(backoff(
                    Duration::from_millis(10),
                    polls,
                    shared.options.max_poll(),
                ))
            };
            let wake = (now + nap).min(deadline);
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(wake) => break,
                    () = shared.stop.cancelled() => return Err(Error::ShutDown),
                    released = next_release(&mut releases) => match released {
                        Ok(Some(released)) if released != name => continue,
                        Err(broadcast::error::RecvError::Closed) => {
                            releases = None;
                            break;
                        }
                        // The listener connected again (its watches are
                        // new), or this waiter lagged and may have missed
                        // that: watch again.
                        Ok(None) | Err(broadcast::error::RecvError::Lagged(_)) => {
                            watched = false;
                            break;
                        }
                        // This name: try now.
                        Ok(Some(_)) => break,
                    },
                    () = listening_changed(&mut listening) => {
                        watched = false;
                        break;
                    }
                }
            }
        }
    }
}

async fn next_release(
    releases: &mut Option<broadcast::Receiver<Option<String>>>,
) -> std::result::Result<Option<String>, broadcast::error::RecvError> {
    match releases {
        Some(receiver) => receiver.recv().await,
        None => std::future::pending().await,
    }
}

async fn listening_changed(listening: &mut Option<watch::Receiver<bool>>) {
    match listening {
        Some(receiver) => {
            if receiver.changed().await.is_err() {
                *listening = None;
            }
        }
        None => std::future::pending().await,
    }
}
