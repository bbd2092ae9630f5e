//! The observing task: follows the notifications on a connection of its
//! own while it can listen (see `crate::notify`), reads the lease when its
//! known expiry passes or at each poll, and reconnects with backoff.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Change;
use super::payload::parse;
use super::tracker::Tracker;
use crate::backoff;
use crate::context::Context;
use crate::db;
use crate::error::{Error, Result};
use crate::notify;
use crate::schema::CHANGE_CHANNEL;
use crate::sql;

/// How long one statement on the observing connection may take before the
/// connection is given up and opened again.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `changes`; false once the observer is gone.
async fn report(send: &mpsc::Sender<Change>, changes: Vec<Change>) -> bool {
    for change in changes {
        if send.send(change).await.is_err() {
            return false;
        }
    }
    true
}

/// How the observer reaches the database for notifications.
pub(super) struct Link {
    options: sqlx::postgres::PgConnectOptions,
    /// Whether to listen at all (false: poll).
    listen: bool,
    /// Whether the probe for a transaction pooler has run.
    probed: bool,
    pub(super) failures: u32,
}

impl Link {
    pub(super) fn new(context: &Context) -> Link {
        Link {
            options: (*context.pool.connect_options())
                .clone()
                .application_name("pglease observer"),
            listen: context.options.get_notify(),
            probed: false,
            failures: 0,
        }
    }

    /// A connection that listens for the changes of `name`, or `None` if
    /// the observer polls.
    pub(super) async fn connect(&mut self, name: &str) -> Result<Option<PgListener>> {
        if !self.listen {
            return Ok(None);
        }
        let probe = !self.probed;
        self.probed = true;
        let Some(mut listener) =
            notify::listen(&self.options, CHANGE_CHANNEL, probe, STATEMENT_TIMEOUT).await?
        else {
            tracing::warn!(
                name,
                "the connection goes through a transaction pooler: the observer polls"
            );
            self.listen = false;
            return Ok(None);
        };
        let observed = tokio::time::timeout(
            STATEMENT_TIMEOUT,
            sql::query(sql::observe(name)).execute(&mut listener),
        )
        .await
        .map_err(|_| Error::Timeout {
            operation: "observe",
            after: Some(STATEMENT_TIMEOUT),
        })?;
        match observed {
            Ok(_) => {
                self.failures = 0;
                Ok(Some(listener))
            }
            Err(sqlx::Error::Database(error)) => {
                tracing::warn!(name, %error, "pglease.observe failed (is the schema migrated?); the observer polls");
                self.listen = false;
                Ok(None)
            }
            Err(error) => Err(Error::from(error)),
        }
    }
}

/// The observing task: follows the notifications while it can listen,
/// reads the lease when its known expiry passes or at each poll, and
/// reconnects with backoff.
pub(super) async fn observe(
    context: Arc<Context>,
    name: String,
    mut tracker: Tracker,
    mut link: Link,
    mut listener: Option<PgListener>,
    send: mpsc::Sender<Change>,
    stop: CancellationToken,
) {
    loop {
        if let Some(listener) = listener.as_mut() {
            if !follow(&context, &name, &mut tracker, listener, &send, &stop).await {
                return;
            }
            tracing::debug!(name, "observer lost its connection; reconnecting");
        } else {
            // Polling, or waiting to reconnect.
            let pause = if link.listen {
                backoff::reconnect(link.failures)
            } else {
                context.options.get_max_poll_interval()
            };
            let now = Instant::now();
            let wake = tracker.deadline.map_or(now + pause, |d| {
                (d + Duration::from_millis(1)).min(now + pause)
            });
            tokio::select! {
                () = stop.cancelled() => return,
                () = send.closed() => return,
                () = tokio::time::sleep_until(wake) => {}
            }
        }
        let gap = listener.take().is_some() || link.listen;
        let connect = link.connect(&name);
        listener = tokio::select! {
            () = stop.cancelled() => return,
            connected = connect => match connected {
                Ok(listener) => listener,
                Err(error) => {
                    link.failures = link.failures.saturating_add(1);
                    tracing::debug!(name, %error, "cannot listen for changes; reading instead");
                    None
                }
            },
        };
        // Whatever happened while nobody listened: read it now.
        let at = Instant::now();
        match db::inspect(&context.pool, &name).await {
            Ok(status) => {
                let changes = if gap && listener.is_some() {
                    tracker.set(status.clone(), at);
                    vec![Change::Current(status)]
                } else {
                    tracker.read(status, at)
                };
                if !report(&send, changes).await {
                    return;
                }
            }
            Err(error) => {
                link.failures = link.failures.saturating_add(1);
                tracing::debug!(name, %error, "cannot read the observed lease");
                listener = None;
            }
        }
    }
}

/// Reports the changes heard on `listener` and the expiries read, until
/// the connection fails (true) or the observer stops (false).
async fn follow(
    context: &Context,
    name: &str,
    tracker: &mut Tracker,
    listener: &mut PgListener,
    send: &mpsc::Sender<Change>,
    stop: &CancellationToken,
) -> bool {
    loop {
        let expiry = tracker.deadline.map(|d| d + Duration::from_millis(1));
        tokio::select! {
            () = stop.cancelled() => return false,
            () = send.closed() => return false,
            () = sleep_until(expiry) => {
                let at = Instant::now();
                match db::inspect(&context.pool, name).await {
                    Ok(status) => {
                        let changes = tracker.read(status, at);
                        if !report(send, changes).await {
                            return false;
                        }
                    }
                    Err(error) => {
                        tracing::debug!(name, %error, "cannot read the observed lease");
                        tracker.deadline = Some(Instant::now() + backoff::reconnect(1));
                    }
                }
            }
            received = listener.try_recv() => {
                let notification = match received {
                    Ok(Some(notification)) => notification,
                    Ok(None) | Err(_) => return true,
                };
                let Some((heard_name, heard)) = parse(notification.payload()) else {
                    tracing::debug!(payload = notification.payload(), "unknown change notification");
                    continue;
                };
                if heard_name != name {
                    continue;
                }
                let (mut changes, read) = tracker.hear(heard);
                if read {
                    // A value too long for a notification.
                    let at = Instant::now();
                    match db::inspect(&context.pool, name).await {
                        Ok(status) => changes.extend(tracker.read(status, at)),
                        Err(error) => {
                            tracing::debug!(name, %error, "cannot read the observed lease");
                            return true;
                        }
                    }
                }
                if !report(send, changes).await {
                    return false;
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
