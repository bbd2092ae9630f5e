//! Following the primary of a multi-host [`Target`]: the pool connects to
//! one host at a time (the one that last had the attributes); a watch task
//! checks it once a second on a connection of its own and, as soon as it
//! fails (or a renewal, or a new connection, reports trouble), tries the
//! hosts in libpq's order until one has the attributes, then points the
//! pool there. Connections opened before the switch are not handed out
//! again, and every new connection is checked before use, so nothing is
//! written on a server that has become a standby.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgConnection;
use sqlx::postgres::{PgConnectOptions, PgPool};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::target::{Target, refusal};

/// How often the watch task checks the host the pool uses.
pub(crate) const WATCH_PERIOD: Duration = Duration::from_secs(1);

/// How long one host may take to accept a connection and answer the
/// attribute check while the hosts are searched.
pub(crate) const PER_HOST_TIMEOUT: Duration = Duration::from_secs(2);

/// Between two searches of all hosts that found none with the attributes
/// (a failover in progress).
const SEARCH_PAUSE: Duration = Duration::from_millis(100);

/// What the pool's connection hooks and the watch task share.
pub(crate) struct Follow {
    pub(crate) target: Target,
    /// The host the pool connects to now (index into the target's hosts).
    current: AtomicUsize,
    /// When the pool was last pointed at another host: connections older
    /// than that are closed instead of used.
    switched: Mutex<Option<Instant>>,
    /// Something saw trouble: look now rather than at the next period.
    trouble: Notify,
}

impl Follow {
    pub(crate) fn new(target: Target, current: usize) -> Follow {
        Follow {
            target,
            current: AtomicUsize::new(current),
            switched: Mutex::new(None),
            trouble: Notify::new(),
        }
    }

    /// The host the pool uses now, as `host:port`.
    pub(crate) fn current(&self) -> String {
        self.target.host(self.current.load(Ordering::Acquire))
    }

    /// Asks the watch task to look now.
    pub(crate) fn report_trouble(&self) {
        self.trouble.notify_one();
    }

    /// For `before_acquire`: whether a connection of age `age` was opened
    /// after the last switch (else it may be on the old primary).
    pub(crate) fn is_current(&self, age: Duration) -> bool {
        let switched = *crate::sync::lock(&self.switched);
        match (switched, Instant::now().checked_sub(age)) {
            (Some(switched), Some(opened)) => opened >= switched,
            _ => true,
        }
    }

    /// For `after_connect`: refuses a new connection to a server without
    /// the attributes (and sets the watch task looking).
    pub(crate) async fn vet(&self, connection: &mut PgConnection) -> sqlx::Result<()> {
        match refusal(connection, self.target.attrs()).await? {
            None => Ok(()),
            Some(why) => {
                self.report_trouble();
                Err(sqlx::Error::Configuration(
                    format!(
                        "{} is {why} (target_session_attrs={}); looking for another host",
                        self.current(),
                        self.target.attrs()
                    )
                    .into(),
                ))
            }
        }
    }

    /// The watch task: runs until `stop`.
    pub(crate) async fn watch(&self, pool: PgPool, stop: CancellationToken) {
        let mut watcher: Option<PgConnection> = None;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.trouble.notified() => {}
                () = tokio::time::sleep(WATCH_PERIOD) => {}
            }
            if let Some(mut connection) = watcher.take() {
                let check = tokio::time::timeout(
                    PER_HOST_TIMEOUT,
                    refusal(&mut connection, self.target.attrs()),
                )
                .await;
                if matches!(check, Ok(Ok(None))) {
                    watcher = Some(connection);
                    continue;
                }
            }
            // Search until a host will do (or the manager stops).
            let started = Instant::now();
            let mut announced = false;
            loop {
                let found = tokio::select! {
                    () = stop.cancelled() => return,
                    found = self.search() => found,
                };
                if let Some((connection, index, options)) = found {
                    self.point(&pool, index, options, started);
                    watcher = Some(connection);
                    break;
                }
                if !announced {
                    tracing::warn!(
                        hosts = %self.target.describe(),
                        attrs = %self.target.attrs(),
                        "no host has the target_session_attrs (a failover in progress?); \
                         searching until one does"
                    );
                    announced = true;
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(SEARCH_PAUSE) => {}
                }
            }
        }
    }

    /// Tries the hosts in order; the first with the attributes.
    async fn search(&self) -> Option<(PgConnection, usize, PgConnectOptions)> {
        for index in 0..self.target.len() {
            if let Ok(Ok((connection, options))) =
                self.target.connect_host(index, PER_HOST_TIMEOUT).await
            {
                return Some((connection, index, options));
            }
        }
        None
    }

    /// Points the pool at host `index` if it is not there already.
    fn point(&self, pool: &PgPool, index: usize, options: PgConnectOptions, started: Instant) {
        let before = self.current.swap(index, Ordering::AcqRel);
        if before == index {
            return;
        }
        self.target
            .apply_password(options, |options| pool.set_connect_options(options));
        *crate::sync::lock(&self.switched) = Some(Instant::now());
        tracing::warn!(
            from = %self.target.host(before),
            to = %self.target.host(index),
            searched_ms = started.elapsed().as_millis() as u64,
            "following the primary to another host"
        );
        crate::telemetry::host_switch();
    }
}
