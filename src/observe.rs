//! Observation of one lease: its state now, then every change (acquired,
//! value published, step-down requested, released, expired) in order.
//!
//! Changes are heard as notifications on a connection of the observer's
//! own (`pglease.observe`, see migrations/0001_schema.sql), which carry
//! the change itself, so that none is merged with the next. Expiry is not
//! an event in the database: it is read when the known expiry passes.
//! Without notifications (a transaction pooler, [`ManagerOptions::notify`]
//! off, a schema that refuses `pglease.observe`) the lease is read every
//! [`ManagerOptions::max_poll_interval`]. After a gap (the connection
//! dropped, or a poll found a change it cannot tell apart) the observer
//! reads the lease and reports [`Change::Current`].
//!
//! [`ManagerOptions::notify`]: crate::ManagerOptions::notify
//! [`ManagerOptions::max_poll_interval`]: crate::ManagerOptions::max_poll_interval

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgListener, PgPoolOptions};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::backoff;
use crate::context::Context;
use crate::db;
use crate::error::{Error, Result};
use crate::input::check_text;
use crate::lease::LeaseStatus;
use crate::manager::LeaseManager;
use crate::sql;
use crate::token::Token;

/// How many changes may wait for [`Observer::next`] before the observer
/// stops reading notifications until there is room.
const BACKLOG: usize = 1024;

/// How long one statement on the observing connection may take before the
/// connection is given up and opened again.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// One change of an observed lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// The lease as it is now: the first change an observer reports, and
    /// again after a gap in which changes may have been missed (a dropped
    /// connection, or a poll that found more than one change).
    Current(LeaseStatus),
    /// A new acquisition: a holder got the lease under a new token (also
    /// when it took over an expired lease, which is reported as
    /// [`Change::Expired`] first).
    Acquired {
        /// The new term's token.
        token: Token,
        /// The new holder.
        holder: String,
        /// When the acquisition expires unless renewed (database clock).
        expires_at: DateTime<Utc>,
    },
    /// The holder published a value, or cleared it (`None`).
    ValueChanged {
        /// The acquisition that published it.
        token: Token,
        /// The new value.
        value: Option<String>,
    },
    /// Somebody asked the holder to step down.
    StepDownRequested {
        /// The acquisition asked.
        token: Token,
        /// Who asked.
        by: String,
    },
    /// The holder released the lease.
    Released {
        /// The acquisition that ended.
        token: Token,
    },
    /// The lease expired without being renewed or released.
    Expired {
        /// The acquisition that ended.
        token: Token,
    },
}

/// The changes of one lease, in order: made by [`LeaseManager::observe`].
/// Observing costs one connection of its own (outside the manager's pool)
/// while notifications are available, and one read per expiry or poll.
/// Dropped, it stops and closes its connection.
#[derive(Debug)]
pub struct Observer {
    name: String,
    changes: mpsc::Receiver<Change>,
    _stop: DropGuard,
}

impl LeaseManager {
    /// Observes lease `name`: reads it now (the first [`Observer::next`]
    /// returns [`Change::Current`]), then reports each change in order.
    /// See docs/library.md, "Observing a lease".
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name; [`Error::Database`] if the
    /// first read fails (later failures are retried with backoff).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped early, nothing is left running.
    pub async fn observe(&self, name: &str) -> Result<Observer> {
        check_text("name", name)?;
        let context = Arc::clone(self.context());
        let mut link = Link::new(&context);
        // Listening before the first read: every change committed after
        // that read is heard.
        let listener = match link.connect(name).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::debug!(name, %error, "cannot listen for changes; reading instead");
                link.failures = 1;
                None
            }
        };
        let status = db::inspect(&context.pool, name).await?;
        let (send, changes) = mpsc::channel(BACKLOG);
        let stop = context.stop.child_token();
        let _ = send.try_send(Change::Current(status.clone()));
        let tracker = Tracker::new(status);
        tokio::spawn(observe(
            context,
            name.to_owned(),
            tracker,
            link,
            listener,
            send,
            stop.clone(),
        ));
        Ok(Observer {
            name: name.to_owned(),
            changes,
            _stop: stop.drop_guard(),
        })
    }
}

impl Observer {
    /// The next change, in the order they were committed.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] once the manager has shut down (or its last
    /// handle was dropped).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a change is taken only when it is returned.
    pub async fn next(&mut self) -> Result<Change> {
        self.changes.recv().await.ok_or(Error::ShutDown)
    }

    /// The observed lease name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// What the observer knows of the lease, and how it turns what it hears
/// or reads into changes.
pub(crate) struct Tracker {
    known: LeaseStatus,
    /// When the known acquisition expires, on this machine's clock.
    deadline: Option<Instant>,
    /// A database time and the local instant it was read at, to turn an
    /// `expires_at` into a local deadline.
    clock: Option<(DateTime<Utc>, Instant)>,
}

impl Tracker {
    fn new(status: LeaseStatus) -> Tracker {
        let mut tracker = Tracker {
            known: LeaseStatus::never_acquired(&status.name),
            deadline: None,
            clock: None,
        };
        tracker.set(status, Instant::now());
        tracker
    }

    /// Takes `status`, read at about `at`, as what is known.
    fn set(&mut self, status: LeaseStatus, at: Instant) {
        if let (Some(expires_at), Some(remaining)) = (status.expires_at, status.remaining) {
            let now = chrono::Duration::from_std(remaining)
                .ok()
                .and_then(|r| expires_at.checked_sub_signed(r));
            if let Some(now) = now {
                self.clock = Some((now, at));
            }
        }
        self.deadline = status.remaining.map(|r| at + r);
        self.known = status;
    }

    /// The local instant at which database time `t` comes, if the clock
    /// has been read.
    fn local(&self, t: DateTime<Utc>) -> Option<Instant> {
        let (then, at) = self.clock?;
        let ahead = (t - then).to_std().unwrap_or_default();
        Some(at + ahead)
    }

    /// The changes a notification stands for (none if it repeats what is
    /// known, or is older), and whether the lease must be read for a value
    /// too long to be notified.
    fn hear(&mut self, heard: Heard) -> (Vec<Change>, bool) {
        let mut changes = Vec::new();
        let current = self.known.token;
        match heard {
            Heard::Acquired {
                token,
                expires_at,
                holder,
            } => {
                if current.is_some_and(|c| c >= token) {
                    return (changes, false);
                }
                if let Some(ended) =
                    current.filter(|_| self.known.holder.is_some() && self.known.held)
                {
                    // Acquisition takes only an ended lease, and a release
                    // would have been heard first.
                    changes.push(Change::Expired { token: ended });
                }
                // A new term: nothing of the last one carries over.
                self.known = LeaseStatus {
                    holder: Some(holder.clone()),
                    token: Some(token),
                    expires_at: Some(expires_at),
                    held: true,
                    ..LeaseStatus::never_acquired(&self.known.name)
                };
                self.deadline = self
                    .local(expires_at)
                    .or_else(|| Some(Instant::now() + Duration::from_secs(1)));
                changes.push(Change::Acquired {
                    token,
                    holder,
                    expires_at,
                });
            }
            Heard::Released { token } => {
                if current == Some(token) && self.known.holder.is_some() {
                    self.known.holder = None;
                    self.known.held = false;
                    self.known.remaining = None;
                    self.known.step_down_requested_by = None;
                    self.known.step_down_requested_at = None;
                    self.deadline = None;
                    changes.push(Change::Released { token });
                }
            }
            Heard::Value { token, value } => {
                if current == Some(token) {
                    match value {
                        None => return (changes, true),
                        Some(value) if value != self.known.value => {
                            self.known.value = value.clone();
                            changes.push(Change::ValueChanged { token, value });
                        }
                        Some(_) => {}
                    }
                }
            }
            Heard::StepDown { token, by } => {
                if current == Some(token)
                    && self.known.holder.is_some()
                    && self.known.step_down_requested_by.as_deref() != Some(by.as_str())
                {
                    self.known.step_down_requested_by = Some(by.clone());
                    changes.push(Change::StepDownRequested { token, by });
                }
            }
        }
        (changes, false)
    }

    /// The changes between what is known and `status`, read at about
    /// `at`: exact when the acquisition is the same or the known one had
    /// ended; [`Change::Current`] when several changes may lie between.
    fn read(&mut self, status: LeaseStatus, at: Instant) -> Vec<Change> {
        let known = &self.known;
        let mut changes = Vec::new();
        match (known.token, status.token) {
            (_, None) => {}
            (Some(old), Some(new)) if old == new => {
                if known.holder.is_some() && status.holder.is_none() {
                    changes.push(Change::Released { token: new });
                } else if known.held && !status.held {
                    changes.push(Change::Expired { token: new });
                }
                if known.value != status.value {
                    changes.push(Change::ValueChanged {
                        token: new,
                        value: status.value.clone(),
                    });
                }
                if let Some(by) = &status.step_down_requested_by
                    && known.step_down_requested_by.as_ref() != Some(by)
                {
                    changes.push(Change::StepDownRequested {
                        token: new,
                        by: by.clone(),
                    });
                }
            }
            (Some(old), Some(new)) if old > new => {}
            (old, Some(new)) => {
                let known_ended = old.is_none() || known.holder.is_none() || !known.held;
                match &status.holder {
                    Some(holder) if status.held && known_ended => {
                        changes.push(Change::Acquired {
                            token: new,
                            holder: holder.clone(),
                            expires_at: status.expires_at.unwrap_or_default(),
                        });
                        if status.value.is_some() {
                            changes.push(Change::ValueChanged {
                                token: new,
                                value: status.value.clone(),
                            });
                        }
                        if let Some(by) = &status.step_down_requested_by {
                            changes.push(Change::StepDownRequested {
                                token: new,
                                by: by.clone(),
                            });
                        }
                    }
                    _ => changes.push(Change::Current(status.clone())),
                }
            }
        }
        self.set(status, at);
        changes
    }
}

/// A parsed notification (see the payload format in
/// migrations/0001_schema.sql).
#[derive(Debug, PartialEq, Eq)]
enum Heard {
    Acquired {
        token: Token,
        expires_at: DateTime<Utc>,
        holder: String,
    },
    Released {
        token: Token,
    },
    /// `value: None` when the value was too long to be notified.
    Value {
        token: Token,
        value: Option<Option<String>>,
    },
    StepDown {
        token: Token,
        by: String,
    },
}

/// The name a notification is about, and what it says; `None` if it is
/// not one pglease sends.
fn parse(payload: &str) -> Option<(&str, Heard)> {
    let (kind, rest) = payload.split_once(' ')?;
    let (token, rest) = rest.split_once(' ')?;
    let token = Token::issued(token.parse().ok()?);
    let (chars, rest) = rest.split_once(' ')?;
    let chars: usize = chars.parse().ok()?;
    let end = rest
        .char_indices()
        .nth(chars)
        .map_or(rest.len(), |(i, _)| i);
    let (name, rest) = rest.split_at(end);
    if name.chars().count() != chars {
        return None;
    }
    let heard = match kind {
        "a" => {
            let (micros, holder) = rest.split_once(' ')?;
            let expires_at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
            Heard::Acquired {
                token,
                expires_at,
                holder: holder.to_owned(),
            }
        }
        "r" => Heard::Released { token },
        "v" => {
            let (flag, value) = rest.split_once(' ')?;
            let value = match flag {
                "=" => Some(Some(value.to_owned())),
                "-" => Some(None),
                "*" => None,
                _ => return None,
            };
            Heard::Value { token, value }
        }
        "s" => Heard::StepDown {
            token,
            by: rest.to_owned(),
        },
        _ => return None,
    };
    Some((name, heard))
}

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
struct Link {
    options: sqlx::postgres::PgConnectOptions,
    /// Whether to listen at all (false: poll).
    listen: bool,
    /// Whether the probe for a transaction pooler has run.
    probed: bool,
    failures: u32,
}

impl Link {
    fn new(context: &Context) -> Link {
        Link {
            options: (*context.pool.connect_options())
                .clone()
                .application_name("pglease observer"),
            listen: context.options.notify_enabled(),
            probed: false,
            failures: 0,
        }
    }

    /// A connection that listens for the changes of `name`, or `None` if
    /// the observer polls.
    async fn connect(&mut self, name: &str) -> Result<Option<PgListener>> {
        if !self.listen {
            return Ok(None);
        }
        if !self.probed {
            self.probed = true;
            if crate::connect::sessions_shared(&self.options).await? {
                tracing::warn!(
                    name,
                    "the connection goes through a transaction pooler: the observer polls"
                );
                self.listen = false;
                return Ok(None);
            }
        }
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(STATEMENT_TIMEOUT)
            .connect_lazy_with(self.options.clone());
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.eager_reconnect(false);
        listener.listen(sql::CHANGE_CHANNEL).await?;
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
async fn observe(
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
                context.options.max_poll()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_parse_with_any_name() {
        let name = "odd name \t with\nspaces 3 ü";
        let n = name.chars().count();
        let payload = format!("a 42 {n} {name}1700000000000000 host:1 x");
        let (got, heard) = parse(&payload).unwrap();
        assert_eq!(got, name);
        assert_eq!(
            heard,
            Heard::Acquired {
                token: Token::issued(42),
                expires_at: DateTime::from_timestamp_micros(1_700_000_000_000_000).unwrap(),
                holder: "host:1 x".to_owned(),
            }
        );
        assert_eq!(
            parse(&format!("r 7 {n} {name}")).unwrap().1,
            Heard::Released {
                token: Token::issued(7)
            }
        );
        assert_eq!(
            parse(&format!("v 7 {n} {name}=  a b")).unwrap().1,
            Heard::Value {
                token: Token::issued(7),
                value: Some(Some(" a b".to_owned()))
            }
        );
        assert_eq!(
            parse(&format!("v 7 {n} {name}- ")).unwrap().1,
            Heard::Value {
                token: Token::issued(7),
                value: Some(None)
            }
        );
        assert_eq!(
            parse(&format!("s 7 {n} {name}ops")).unwrap().1,
            Heard::StepDown {
                token: Token::issued(7),
                by: "ops".to_owned()
            }
        );
        assert!(parse("x 7 1 a").is_none());
        assert!(parse("r 7 5 abc").is_none());
        assert!(parse("r seven 1 a").is_none());
    }
}
