//! The names waiters wait for, shared by the waiters (who add and drop
//! interest) and the listening task (which watches and unwatches them on
//! its connection with `pglease.watch` and `pglease.unwatch`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::sql;

/// How long a waiter waits for the listener to confirm a watch before it
/// falls back to polling for that round.
const WATCH_CONFIRM: Duration = Duration::from_secs(1);

/// How long one watch or unwatch statement on the listening connection may
/// take before the connection is given up and opened again.
const WATCH_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// The key its release notifications carry (`hashtext(name)`), once
    /// watched.
    key: Option<String>,
}

/// The names waiters wait for, shared by the waiters (who add and drop
/// interest) and the listening task (which watches and unwatches them on
/// its connection).
pub(crate) struct Watches {
    entries: Mutex<HashMap<String, WatchEntry>>,
    /// Wakes the listening task: some entry needs a statement.
    pub(crate) poke: Notify,
    /// Bumped whenever the task has changed an entry's state.
    changes: watch::Sender<u64>,
    /// Whether a failing `pglease.watch` has been reported already.
    warned: AtomicBool,
}

impl Watches {
    pub(crate) fn new() -> Watches {
        Watches {
            entries: Mutex::new(HashMap::new()),
            poke: Notify::new(),
            changes: watch::channel(0).0,
            warned: AtomicBool::new(false),
        }
    }

    /// Registers a waiter's interest in the releases of `name`.
    pub(crate) fn watch(self: &Arc<Self>, name: &str) -> Watching {
        self.entries()
            .entry(name.to_owned())
            .or_insert(WatchEntry {
                waiters: 0,
                state: WatchState::Pending,
                key: None,
            })
            .waiters += 1;
        self.poke.notify_one();
        Watching {
            watches: Arc::clone(self),
            name: name.to_owned(),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, WatchEntry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The watched names whose releases notifications with `payload`
    /// stand for: a hint (anyone may send one), which costs the waiters of
    /// those names one attempt to acquire.
    pub(crate) fn names_for(&self, payload: &str) -> Vec<String> {
        self.entries()
            .iter()
            .filter(|(_, e)| e.key.as_deref() == Some(payload))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// A new or lost connection watches nothing: every name is pending.
    pub(crate) fn reset(&self) {
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
    pub(crate) async fn reconcile(
        &self,
        connection: &mut PgListener,
    ) -> std::result::Result<(), sqlx::Error> {
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
            let statement = if watch {
                sql::watch(&name)
            } else {
                sql::unwatch(&name)
            };
            let done = tokio::time::timeout(
                WATCH_TIMEOUT,
                sql::query(statement).fetch_one(&mut *connection),
            )
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
            .and_then(|row| {
                let key = if watch {
                    Some(row.try_get::<String, _>(1)?)
                } else {
                    None
                };
                Ok((row.try_get::<bool, _>(0)?, key))
            });
            let mut key = None;
            let state = match (watch, done) {
                (true, Ok((true, watched_key))) => {
                    key = watched_key;
                    WatchState::Watched
                }
                (true, Ok((false, _))) => WatchState::Refused,
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
                if key.is_some() {
                    entry.key = key;
                }
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
    pub(crate) async fn confirmed(&self, listening: bool, deadline: Instant) -> bool {
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
