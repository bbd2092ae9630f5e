//! Notifications: the one way pglease opens a LISTEN connection (a
//! connection of its own, outside the pool, opened only after a check that
//! it does not go through a transaction pooler, where a LISTEN would stay
//! on a server session that other clients then use and its notifications
//! would reach them instead), and the manager's one listening connection
//! that its waiters, observers and electors share (`hub.rs`), with what it
//! is asked to hear (`subscriptions.rs`).

mod hub;
mod subscriptions;

pub(crate) use hub::{Listener, Listening};
pub(crate) use subscriptions::{Subscription, Topic};

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};

use crate::connect::sessions_shared;
use crate::error::Result;

/// A connection that listens on `channels`, or `None` when `probe` is set
/// and the connection goes through a transaction pooler. Connecting waits
/// up to `connect_timeout`. The listener does not reconnect by itself: its
/// owner does, and reads what it may have missed meanwhile.
pub(crate) async fn listen(
    options: &PgConnectOptions,
    channels: &[&str],
    probe: bool,
    connect_timeout: Duration,
) -> Result<Option<PgListener>> {
    if probe && sessions_shared(options).await? {
        return Ok(None);
    }
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(connect_timeout)
        .connect_lazy_with(options.clone());
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.eager_reconnect(false);
    listener.listen_all(channels.iter().copied()).await?;
    Ok(Some(listener))
}
