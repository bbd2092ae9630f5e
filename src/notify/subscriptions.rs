//! What the manager's listening connection is asked to hear: for each
//! name, the waiters waiting for its release (`pglease.watch`) and the
//! observers following its changes (`pglease.observe`), counted, so that
//! one statement per name and topic serves them all. Shared by the
//! subscribers (who add and drop interest) and the listening task (which
//! subscribes and unsubscribes on its connection).

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

/// How long one subscribe or unsubscribe statement on the listening
/// connection may take before the connection is given up and opened again
/// (`pglease.observe` alone may wait 2 s for a key).
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a subscription asks to hear of a name.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Topic {
    /// Its releases (`pglease.watch`, channel `pglease_release`).
    Releases,
    /// Its every change (`pglease.observe`, channel `pglease_change`).
    Changes,
}

impl Topic {
    fn subscribe(self, name: &str) -> String {
        match self {
            Topic::Releases => sql::watch(name),
            Topic::Changes => sql::observe(name),
        }
    }

    fn unsubscribe(self, name: &str) -> String {
        match self {
            Topic::Releases => sql::unwatch(name),
            Topic::Changes => sql::unobserve(name),
        }
    }

    fn function(self) -> &'static str {
        match self {
            Topic::Releases => "pglease.watch",
            Topic::Changes => "pglease.observe",
        }
    }
}

/// Where a subscribed name stands on the listening connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Not subscribed on the current connection yet (or any more).
    Pending,
    /// The subscribing function returned true: its notifications come.
    Subscribed,
    /// The subscribing function returned false (`pglease.watch`: a release
    /// was committing; `pglease.observe`: another session held its key for
    /// 2 s), or failed with a database error (the schema lacks it, or the
    /// role may not call it).
    Refused,
    /// Nobody is subscribed any more and the unsubscribing statement is on
    /// its way: not subscribed, whatever the connection holds. A
    /// subscriber who comes now waits for the name to be subscribed again.
    Leaving,
}

struct Entry {
    subscribers: usize,
    state: State,
    /// The key its notifications carry (`hashtext(name)`), once subscribed.
    key: Option<String>,
}

/// The names subscribed to, by topic, shared by the subscribers and the
/// listening task.
pub(crate) struct Subscriptions {
    entries: Mutex<HashMap<(Topic, String), Entry>>,
    /// Wakes the listening task: some entry needs a statement.
    pub(crate) poke: Notify,
    /// Bumped whenever the task has changed an entry's state.
    changes: watch::Sender<u64>,
    /// Whether a failing subscription has been reported already.
    warned: AtomicBool,
}

impl Subscriptions {
    pub(crate) fn new() -> Subscriptions {
        Subscriptions {
            entries: Mutex::new(HashMap::new()),
            poke: Notify::new(),
            changes: watch::channel(0).0,
            warned: AtomicBool::new(false),
        }
    }

    /// Registers one subscriber's interest in `topic` of `name`.
    pub(crate) fn subscribe(self: &Arc<Self>, topic: Topic, name: &str) -> Subscription {
        self.entries()
            .entry((topic, name.to_owned()))
            .or_insert(Entry {
                subscribers: 0,
                state: State::Pending,
                key: None,
            })
            .subscribers += 1;
        self.poke.notify_one();
        Subscription {
            subscriptions: Arc::clone(self),
            topic,
            name: name.to_owned(),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<(Topic, String), Entry>> {
        crate::sync::lock(&self.entries)
    }

    /// The names subscribed to `topic` whose notifications with `payload`
    /// stand for: a hint (anyone may send one), which costs each of their
    /// subscribers one read.
    pub(crate) fn names_for(&self, topic: Topic, payload: &str) -> Vec<String> {
        self.entries()
            .iter()
            .filter(|((t, _), e)| *t == topic && e.key.as_deref() == Some(payload))
            .map(|((_, name), _)| name.clone())
            .collect()
    }

    /// How many names are subscribed to on the connection now, by topic.
    #[cfg(test)]
    fn subscribed(&self, topic: Topic) -> usize {
        self.entries()
            .iter()
            .filter(|((t, _), e)| *t == topic && e.state == State::Subscribed)
            .count()
    }

    /// A new or lost connection is subscribed to nothing: every name is
    /// pending.
    pub(crate) fn reset(&self) {
        let mut entries = self.entries();
        entries.retain(|_, e| e.subscribers > 0);
        for entry in entries.values_mut() {
            entry.state = State::Pending;
        }
        drop(entries);
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The next statement the connection owes: a pending name someone
    /// subscribes to (true), or a subscribed one nobody does any more
    /// (false, and the entry is marked leaving). The decision and the
    /// state change are made under one lock: no subscriber can take a name
    /// that is being unsubscribed for a subscribed one.
    fn next_due(&self) -> Option<(Topic, String, bool)> {
        let mut entries = self.entries();
        entries.retain(|_, e| {
            e.subscribers > 0 || matches!(e.state, State::Subscribed | State::Leaving)
        });
        entries
            .iter_mut()
            .find_map(|((topic, name), e)| match (e.subscribers > 0, e.state) {
                (true, State::Pending) => Some((*topic, name.clone(), true)),
                (false, State::Subscribed) => {
                    e.state = State::Leaving;
                    Some((*topic, name.clone(), false))
                }
                _ => None,
            })
    }

    /// Subscribes the pending names that someone subscribes to, and
    /// unsubscribes the names nobody does any more, one statement each.
    /// Returns an error only when the connection should be given up (a
    /// timeout or a lost connection); a statement the database refuses
    /// leaves the name refused, and its subscribers poll.
    pub(crate) async fn reconcile(
        &self,
        connection: &mut PgListener,
    ) -> std::result::Result<(), sqlx::Error> {
        while let Some((topic, name, subscribe)) = self.next_due() {
            let statement = if subscribe {
                topic.subscribe(&name)
            } else {
                topic.unsubscribe(&name)
            };
            let done = tokio::time::timeout(
                STATEMENT_TIMEOUT,
                sql::query(statement).fetch_one(&mut *connection),
            )
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
            .and_then(|row| {
                let key = if subscribe {
                    Some(row.try_get::<String, _>(1)?)
                } else {
                    None
                };
                Ok((row.try_get::<bool, _>(0)?, key))
            });
            let mut key = None;
            let state = match (subscribe, done) {
                (true, Ok((true, subscribed_key))) => {
                    key = subscribed_key;
                    State::Subscribed
                }
                (true, Ok((false, _))) => {
                    if topic == Topic::Changes {
                        // The server's log has the WARNING naming who
                        // holds the key.
                        tracing::warn!(
                            name,
                            "pglease.observe could not take its key within 2 s (held by another \
                             session); the observer reads the lease instead"
                        );
                    }
                    State::Refused
                }
                (true, Err(sqlx::Error::Database(error))) => {
                    if !self.warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            %error,
                            "{} failed (is the schema migrated?); its subscribers poll",
                            topic.function()
                        );
                    }
                    State::Refused
                }
                // Unsubscribed, or the database refused to: either way
                // only a subscriber that comes now needs the name again.
                (false, Ok(_) | Err(sqlx::Error::Database(_))) => State::Pending,
                (_, Err(error)) => return Err(error),
            };
            if let Some(entry) = self.entries().get_mut(&(topic, name)) {
                entry.state = state;
                if key.is_some() {
                    entry.key = key;
                }
            }
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
        Ok(())
    }
}

/// One subscriber's interest in one topic of one name. Dropped, it lets
/// the listener unsubscribe the name once nobody else subscribes to it.
pub(crate) struct Subscription {
    subscriptions: Arc<Subscriptions>,
    topic: Topic,
    name: String,
}

impl Subscription {
    /// Whether the notifications of the name come now. When the manager
    /// is not `listening`, answers false at once; otherwise waits until
    /// `until` for the listener to subscribe the name. A subscription
    /// refused earlier is asked for again either way.
    pub(crate) async fn confirmed(&self, listening: bool, until: Instant) -> bool {
        let mut changes = self.subscriptions.changes.subscribe();
        let key = (self.topic, self.name.clone());
        let state =
            |subscriptions: &Subscriptions| subscriptions.entries().get(&key).map(|e| e.state);
        {
            let mut entries = self.subscriptions.entries();
            match entries.get_mut(&key) {
                Some(entry) if entry.state == State::Subscribed => return true,
                Some(entry) if entry.state == State::Refused => {
                    entry.state = State::Pending;
                    self.subscriptions.poke.notify_one();
                }
                _ => {}
            }
        }
        if !listening {
            return false;
        }
        loop {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return false },
                () = tokio::time::sleep_until(until) => return false,
            }
            match state(&self.subscriptions) {
                Some(State::Subscribed) => return true,
                Some(State::Pending | State::Leaving) => {}
                Some(State::Refused) | None => return false,
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let key = (self.topic, std::mem::take(&mut self.name));
        if let Some(entry) = self.subscriptions.entries().get_mut(&key) {
            entry.subscribers = entry.subscribers.saturating_sub(1);
        }
        self.subscriptions.poke.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_statement_serves_every_subscriber_of_a_name() {
        let subscriptions = Arc::new(Subscriptions::new());
        let first = subscriptions.subscribe(Topic::Changes, "a");
        let second = subscriptions.subscribe(Topic::Changes, "a");
        let waiter = subscriptions.subscribe(Topic::Releases, "a");
        let mut due = vec![];
        while let Some((topic, name, subscribe)) = subscriptions.next_due() {
            assert!(subscribe);
            if let Some(entry) = subscriptions.entries().get_mut(&(topic, name.clone())) {
                entry.state = State::Subscribed;
            }
            due.push((topic, name));
        }
        due.sort_by_key(|(t, _)| *t == Topic::Changes);
        assert_eq!(
            due,
            vec![
                (Topic::Releases, "a".to_owned()),
                (Topic::Changes, "a".to_owned())
            ]
        );
        assert_eq!(subscriptions.subscribed(Topic::Changes), 1);

        // The name stays subscribed while one subscriber is left.
        drop(first);
        assert_eq!(subscriptions.next_due(), None);
        drop(second);
        assert_eq!(
            subscriptions.next_due(),
            Some((Topic::Changes, "a".to_owned(), false))
        );
        // Leaving: nothing more is due for it, and the waiter's stays.
        assert_eq!(subscriptions.next_due(), None);
        assert_eq!(subscriptions.subscribed(Topic::Releases), 1);
        drop(waiter);
    }

    #[test]
    fn a_reset_makes_every_wanted_name_pending_and_forgets_the_rest() {
        let subscriptions = Arc::new(Subscriptions::new());
        let kept = subscriptions.subscribe(Topic::Changes, "kept");
        let gone = subscriptions.subscribe(Topic::Releases, "gone");
        for key in [
            (Topic::Changes, "kept".to_owned()),
            (Topic::Releases, "gone".to_owned()),
        ] {
            let mut entries = subscriptions.entries();
            let entry = entries.get_mut(&key).expect("registered");
            entry.state = State::Subscribed;
            entry.key = Some("7".to_owned());
        }
        drop(gone);
        subscriptions.reset();
        assert_eq!(
            subscriptions.next_due(),
            Some((Topic::Changes, "kept".to_owned(), true))
        );
        assert_eq!(
            subscriptions.names_for(Topic::Releases, "7"),
            Vec::<String>::new()
        );
        assert_eq!(
            subscriptions.names_for(Topic::Changes, "7"),
            vec!["kept".to_owned()]
        );
        drop(kept);
    }
}
