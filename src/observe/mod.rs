//! Observation of one lease: its state now, then every change (acquired,
//! value published, step-down requested, released, expired) in order.
//!
//! Changes are heard of as notifications on the manager's one listening
//! connection, which every observer, elector and waiter of the manager
//! shares (`crate::notify`): it subscribes each observed name there once
//! (`pglease.observe`, see migrations/0001_schema.sql). A notification
//! is only a hint, which anyone who can connect may send: it carries the
//! name's key and nothing else, and the observer reads the lease through
//! pglease and reports what the read shows. Changes that commit between
//! two reads may be reported together as [`Change::Current`]. Expiry is
//! not an event in the database: it is read when the known expiry passes.
//! Without notifications (a transaction pooler, [`ManagerOptions::notify`]
//! off, a schema that refuses `pglease.observe`) the lease is read every
//! [`ManagerOptions::max_poll_interval`]. After a gap (the connection
//! dropped, or a poll found a change it cannot tell apart) the observer
//! reads the lease and reports [`Change::Current`].
//!
//! Here the public surface; `tracker.rs` turns what is read into changes
//! (no I/O, unit-tested), and `link.rs` is the observing task and its
//! subscription.
//!
//! [`ManagerOptions::notify`]: crate::ManagerOptions::notify
//! [`ManagerOptions::max_poll_interval`]: crate::ManagerOptions::max_poll_interval

mod link;
mod tracker;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use tokio_util::sync::DropGuard;

use crate::db;
use crate::error::{Error, Result};
use crate::lease::LeaseStatus;
use crate::limits::check_text;
use crate::manager::LeaseManager;
use crate::token::Token;
use link::Link;
use tracker::Tracker;

/// How many changes may wait for [`Observer::next`] before the observer
/// stops reading notifications until there is room.
const BACKLOG: usize = 1024;

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
/// Observing shares the manager's one listening connection with every
/// other observer, elector and waiter of the manager (one subscription
/// per name, however many observe it), and costs one read per change,
/// expiry or poll. Dropped, it stops, and the name is unsubscribed once
/// nobody else of the manager observes it.
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
        // Subscribed before the first read: every change committed after
        // that read is heard.
        let mut link = Link::new(&context, name);
        link.confirm().await;
        let status = db::inspect(&context.pool, name).await?;
        let (send, changes) = mpsc::channel(BACKLOG);
        let stop = context.stop.child_token();
        let _ = send.try_send(Change::Current(status.clone()));
        let tracker = Tracker::new(status);
        tokio::spawn(link::observe(
            context,
            name.to_owned(),
            tracker,
            link,
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
