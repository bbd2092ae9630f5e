//! The manager's listener for releases: one LISTEN connection of its own,
//! started by the first acquirer that has to wait, that watches the names
//! waiters wait for and forwards the notifications.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::PgPool;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::watches::{Watches, Watching};
use crate::backoff;
use crate::notify;
use crate::schema::RELEASE_CHANNEL;

/// How long the listener's connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The manager's listener for releases, started by the first waiter.
pub(crate) struct Listener {
    /// A released name, or `None` for "anything may have been released"
    /// (the listener (re)connected and may have missed notifications).
    pub(crate) releases: broadcast::Sender<Option<String>>,
    pub(crate) listening: watch::Sender<bool>,
    watches: Arc<Watches>,
    /// Whose connect options the listener uses, read at each (re)connect:
    /// after a failover they name the new primary.
    pool: PgPool,
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Listener {
    pub(crate) fn new(pool: PgPool, stop: CancellationToken) -> Listener {
        let (releases, _) = broadcast::channel(256);
        let (listening, _) = watch::channel(false);
        Listener {
            releases,
            listening,
            watches: Arc::new(Watches::new()),
            pool,
            stop,
            task: Mutex::new(None),
        }
    }

    /// Registers a waiter's interest in the releases of `name`.
    pub(crate) fn watch(&self, name: &str) -> Watching {
        self.watches.watch(name)
    }

    /// Starts the listening task, or starts it again if the runtime it ran
    /// on has ended (it stops by itself only when the manager stops).
    pub(crate) fn ensure_running(&self) {
        let mut task = self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !self.stop.is_cancelled() && task.as_ref().is_none_or(|t| t.is_finished()) {
            self.listening.send_replace(false);
            *task = Some(tokio::spawn(listen(
                self.pool.clone(),
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
    pool: PgPool,
    releases: broadcast::Sender<Option<String>>,
    listening: watch::Sender<bool>,
    watches: Arc<Watches>,
    stop: CancellationToken,
) {
    let mut failures: u32 = 0;
    // Whether the probe for a transaction pooler has run (once per manager).
    let mut probed = false;
    loop {
        let options = pool.connect_options();
        let connect = notify::listen(&options, RELEASE_CHANNEL, !probed, CONNECT_TIMEOUT);
        let connected = tokio::select! {
            () = stop.cancelled() => return,
            connected = connect => connected,
        };
        match connected {
            Ok(None) => {
                // A LISTEN there would stay on a server session that other
                // clients then use, and its notifications reach them.
                tracing::warn!(
                    "the connection goes through a transaction pooler: waiting acquirers poll \
                     (set ManagerOptions::notify(false) to skip this check)"
                );
                stop.cancelled().await;
                return;
            }
            Ok(Some(mut listener)) => {
                probed = true;
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
                                for name in watches.names_for(notification.payload()) {
                                    let _ = releases.send(Some(name));
                                }
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
        let pause = backoff::reconnect(failures);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}
