//! The manager's one listening connection, started by the first waiter or
//! observer that needs it: it listens on both channels, subscribes on that
//! one session to the names its waiters wait for (`pglease.watch`) and its
//! observers and electors follow (`pglease.observe`), once per name however
//! many subscribe, and forwards each notification to the subscribers of
//! the names its key stands for.

use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgNotification, PgPool};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::subscriptions::{Subscription, Subscriptions, Topic};
use crate::backoff;
use crate::schema::{CHANGE_CHANNEL, RELEASE_CHANNEL};

/// How long the listener's connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How many forwarded notifications a slow subscriber may fall behind by
/// before it is told it lagged (and reads the lease, as after a gap).
const BACKLOG: usize = 1024;

/// The name the listening session shows in `pg_stat_activity`.
pub(crate) const APPLICATION_NAME: &str = "pglease listener";

/// Whether the manager listens, as subscribers see it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Listening {
    /// Not connected now (starting, or reconnecting).
    No,
    /// Connected, and subscribed to what was asked when it connected.
    Yes,
    /// Never will: the connection goes through a transaction pooler.
    Never,
}

/// The manager's listening connection, shared by its waiters, observers
/// and electors.
pub(crate) struct Listener {
    /// A released name, or `None` for "anything may have been released"
    /// (the listener lost its connection: nothing is heard until it has
    /// connected and subscribed again).
    pub(crate) releases: broadcast::Sender<Option<String>>,
    /// A changed name, or `None` as for `releases`.
    pub(crate) changes: broadcast::Sender<Option<String>>,
    pub(crate) listening: watch::Sender<Listening>,
    subscriptions: Arc<Subscriptions>,
    /// Whose connect options the listener uses, read at each (re)connect:
    /// after a failover they name the new primary.
    pool: PgPool,
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Listener {
    /// A listener on `pool`'s server, not started yet, that stops with
    /// `stop`.
    pub(crate) fn new(pool: PgPool, stop: CancellationToken) -> Listener {
        Listener {
            releases: broadcast::channel(BACKLOG).0,
            changes: broadcast::channel(BACKLOG).0,
            listening: watch::channel(Listening::No).0,
            subscriptions: Arc::new(Subscriptions::new()),
            pool,
            stop,
            task: Mutex::new(None),
        }
    }

    /// Registers a subscriber's interest in `topic` of `name`; the listener
    /// subscribes the name on its connection unless it already is.
    pub(crate) fn subscribe(&self, topic: Topic, name: &str) -> Subscription {
        self.subscriptions.subscribe(topic, name)
    }

    /// Starts the listening task, or starts it again if the runtime it ran
    /// on has ended (it stops by itself only when the manager stops, or
    /// when it finds a transaction pooler).
    pub(crate) fn ensure_running(&self) {
        let mut task = crate::sync::lock(&self.task);
        let never = *self.listening.borrow() == Listening::Never;
        if !self.stop.is_cancelled() && !never && task.as_ref().is_none_or(|t| t.is_finished()) {
            self.listening.send_replace(Listening::No);
            let job = Task {
                pool: self.pool.clone(),
                releases: self.releases.clone(),
                changes: self.changes.clone(),
                listening: self.listening.clone(),
                subscriptions: Arc::clone(&self.subscriptions),
                stop: self.stop.clone(),
            };
            *task = Some(tokio::spawn(job.run()));
        }
    }

    /// Whether the listener is connected and subscribed right now.
    pub(crate) fn is_listening(&self) -> bool {
        *self.listening.borrow() == Listening::Yes
    }
}

/// The listening task: its ends of the listener's channels, and what it
/// subscribes.
struct Task {
    pool: PgPool,
    releases: broadcast::Sender<Option<String>>,
    changes: broadcast::Sender<Option<String>>,
    listening: watch::Sender<Listening>,
    subscriptions: Arc<Subscriptions>,
    stop: CancellationToken,
}

impl Task {
    /// Keeps one LISTEN connection open (its own, outside the manager's
    /// pool), subscribes on it the names asked for, and forwards
    /// notifications; reconnects with backoff when it drops.
    async fn run(self) {
        let mut failures: u32 = 0;
        // Whether the probe for a transaction pooler has run (once per
        // manager).
        let mut probed = false;
        loop {
            let options = (*self.pool.connect_options())
                .clone()
                .application_name(APPLICATION_NAME);
            let connect = super::listen(
                &options,
                &[RELEASE_CHANNEL, CHANGE_CHANNEL],
                !probed,
                CONNECT_TIMEOUT,
            );
            let connected = tokio::select! {
                () = self.stop.cancelled() => return,
                connected = connect => connected,
            };
            match connected {
                Ok(None) => {
                    // A LISTEN there would stay on a server session that
                    // other clients then use, and its notifications reach
                    // them.
                    tracing::warn!(
                        "the connection goes through a transaction pooler: waiting acquirers and \
                         observers poll (set ManagerOptions::notify(false) to skip this check)"
                    );
                    self.listening.send_replace(Listening::Never);
                    self.gap();
                    return;
                }
                Ok(Some(mut listener)) => {
                    probed = true;
                    failures = 0;
                    if self.serve(&mut listener).await.is_break() {
                        return;
                    }
                    tracing::debug!("the listening connection was lost; reconnecting");
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    tracing::debug!(%error, "cannot listen; waiters and observers poll");
                }
            }
            let pause = backoff::reconnect(failures);
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Subscribes on the new connection `listener` what is asked for and
    /// forwards its notifications until it fails (then subscribers hear of
    /// the gap); breaks if the manager stops first.
    async fn serve(&self, listener: &mut PgListener) -> ControlFlow<()> {
        // This session is subscribed to nothing yet: subscribe what is
        // asked for. Subscribers learn that they are heard again from their
        // subscription's state, and read the lease then (what changed while
        // nobody listened went unheard).
        self.subscriptions.reset();
        self.listening.send_replace(Listening::Yes);
        let mut healthy = self.reconcile(listener).await?;
        while healthy {
            tokio::select! {
                () = self.stop.cancelled() => return ControlFlow::Break(()),
                () = self.subscriptions.poke.notified() => {
                    healthy = self.reconcile(listener).await?;
                }
                received = listener.try_recv() => match received {
                    Ok(Some(notification)) => self.forward(&notification),
                    Ok(None) | Err(_) => healthy = false,
                },
            }
        }
        self.listening.send_replace(Listening::No);
        self.subscriptions.reset();
        self.gap();
        ControlFlow::Continue(())
    }

    /// Brings the connection's subscriptions in line with what is asked
    /// for: whether the connection is still usable; breaks if the manager
    /// stops first.
    async fn reconcile(&self, listener: &mut PgListener) -> ControlFlow<(), bool> {
        tokio::select! {
            () = self.stop.cancelled() => ControlFlow::Break(()),
            done = self.subscriptions.reconcile(listener) => ControlFlow::Continue(done.is_ok()),
        }
    }

    /// Forwards `notification` to the subscribers of the names its key
    /// stands for.
    fn forward(&self, notification: &PgNotification) {
        let (topic, to) = if notification.channel() == CHANGE_CHANNEL {
            (Topic::Changes, &self.changes)
        } else {
            (Topic::Releases, &self.releases)
        };
        for name in self.subscriptions.names_for(topic, notification.payload()) {
            let _ = to.send(Some(name));
        }
    }

    /// Tells subscribers that anything may have been released or changed
    /// (nothing was heard for a while).
    fn gap(&self) {
        let _ = self.releases.send(None);
        let _ = self.changes.send(None);
    }
}
