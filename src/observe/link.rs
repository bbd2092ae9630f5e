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
use super::tracker::Tracker;
use crate::backoff;
use crate::context::Context;
use crate::db;
use crate::error::{Error, Result};
use crate::notify;
use crate::schema::CHANGE_CHANNEL;
use crate::sql;
use sqlx::Row;

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
    /// Whose connect options the observer uses, read at each (re)connect.
    pool: sqlx::postgres::PgPool,
    /// Whether to listen at all (false: poll).
    listen: bool,
    /// Whether the probe for a transaction pooler has run.
    probed: bool,
    pub(super) failures: u32,
}

impl Link {
    pub(super) fn new(context: &Context) -> Link {
        Link {
            pool: context.pool.clone(),
            listen: context.options.get_notify(),
            probed: false,
            failures: 0,
        }
    }

    /// A connection that listens for the changes of `name`, with the key
    /// their notifications carry, or `None` if the observer polls.
    pub(super) async fn connect(&mut self, name: &str) -> Result<Option<(PgListener, String)>> {
        if !self.listen {
            return Ok(None);
        }
        let probe = !self.probed;
        self.probed = true;
        let options = (*self.pool.connect_options())
            .clone()
            .application_name("pglease observer");
        let Some(mut listener) =
            notify::listen(&options, CHANGE_CHANNEL, probe, STATEMENT_TIMEOUT).await?
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
            sql::query(sql::observe(name)).fetch_one(&mut listener),
        )
        .await
        .map_err(|_| Error::Timeout {
            operation: "observe",
            after: Some(STATEMENT_TIMEOUT),
        })?;
        match observed
            .and_then(|row| Ok((row.try_get::<bool, _>(0)?, row.try_get::<String, _>(1)?)))
        {
            Ok((true, key)) => {
                self.failures = 0;
                Ok(Some((listener, key)))
            }
            Ok((false, _)) => {
                // Another session holds the observer key (the WARNING in
                // the server's log names it): read instead, and try again
                // at the next reconnection.
                tracing::warn!(
                    name,
                    "pglease.observe could not take its key within 2 s (held by another session); \
                     the observer reads the lease instead"
                );
                self.failures = self.failures.saturating_add(1);
                Ok(None)
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
    mut listener: Option<(PgListener, String)>,
    send: mpsc::Sender<Change>,
    stop: CancellationToken,
) {
    loop {
        if let Some((listener, key)) = listener.as_mut() {
            if !follow(&context, &name, key, &mut tracker, listener, &send, &stop).await {
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

/// Reads the lease at each notification of `key` heard on `listener`, and
/// when its known expiry passes, and reports what changed, until the
/// connection fails (true) or the observer stops (false).
async fn follow(
    context: &Context,
    name: &str,
    key: &str,
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
                // A hint, from anyone who can NOTIFY: believe only what
                // the read shows.
                if notification.payload() != key {
                    continue;
                }
                // One read stands for every notification already here.
                while listener.next_buffered().is_some() {}
                let at = Instant::now();
                let changes = match db::inspect(&context.pool, name).await {
                    Ok(status) => tracker.read(status, at),
                    Err(error) => {
                        tracing::debug!(name, %error, "cannot read the observed lease");
                        return true;
                    }
                };
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
