//! The manager: what its clones share, its life (construction, counters,
//! shutdown), and its operations (`ops.rs`: one statement each;
//! `acquire.rs`: acquiring, holding, working under a lease; `admin.rs`:
//! the administrator's operations, behind [`LeaseManager::admin`]).

mod acquire;
mod admin;
mod group;
mod ops;
pub use admin::Admin;
pub(crate) use ops::check_hand_over;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[cfg(doc)]
use sqlx::postgres::PgConnectOptions;
use sqlx::postgres::PgPool;
use tokio_util::sync::DropGuard;

use crate::connect::{DEFAULT_TIMEOUT, Follow, Target, connect_pool};
use crate::context::Context;
use crate::db;
use crate::error::{Error, LossReason, Result};
use crate::hold::{self, Registry};
use crate::options::ManagerOptions;
use crate::wait::Acquirer;

/// Counters of one manager, for monitoring and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ManagerStats {
    /// Leases held with background renewal right now.
    pub held: usize,
    /// Renewal statements sent (each renews every lease due at that tick).
    pub renewal_statements: u64,
    /// Lease renewals confirmed by the database, over all statements.
    pub leases_renewed: u64,
    /// Renewal statements that failed or timed out (and were retried).
    pub renewal_failures: u64,
    /// Acquisition statements answered (successful or not).
    pub acquire_attempts: u64,
    /// Statements its lease group members sent: joins, reads of the
    /// group, takes, handovers, leaves (their renewals are counted in
    /// `renewal_statements`).
    pub group_statements: u64,
    /// Acquirers waiting for a lease right now.
    pub waiting: usize,
    /// Whether this manager's listening connection (shared by its waiters,
    /// observers and electors) is connected right now.
    pub listening: bool,
}

/// Entry point: acquires, holds, renews, releases and inspects leases, and
/// opens fenced transactions, through a [`PgPool`].
///
/// Cheap to clone: clones share one renewal task and one listening
/// connection (for all their waiters, observers and electors), which stop
/// when the last clone (and the last [`HeldLease`](crate::HeldLease))
/// is dropped, or at [`LeaseManager::shutdown`]. Apart from that optional
/// listener it uses no session state that outlives a transaction, and it
/// sends no prepared statements, so it works through a transaction-pooling
/// proxy such as PgBouncer, where the listener is not started and waiters
/// poll (see [`ManagerOptions::notify`]).
#[derive(Clone)]
pub struct LeaseManager {
    shared: Arc<Shared>,
    /// Stops the background tasks when the last manager handle and the
    /// last held lease are gone (held leases keep a clone).
    keepalive: Arc<DropGuard>,
}

/// What the clones of one manager share.
struct Shared {
    context: Arc<Context>,
    registry: Arc<Registry>,
    acquirer: Acquirer,
}

impl std::fmt::Debug for LeaseManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseManager")
            .field("pool", self.pool())
            .field("options", self.options())
            .finish_non_exhaustive()
    }
}

impl LeaseManager {
    /// A manager that uses `pool`, with the default [`ManagerOptions`].
    /// Call [`LeaseManager::migrate`] once before first use (it is
    /// idempotent).
    pub fn new(pool: PgPool) -> Self {
        Self::build(pool, ManagerOptions::default())
    }

    /// A manager that uses `pool` with `options`, which are validated.
    pub fn with_options(pool: PgPool, options: ManagerOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self::build(pool, options))
    }

    fn build(pool: PgPool, options: ManagerOptions) -> Self {
        Self::build_following(pool, options, None)
    }

    /// With `follow`, also starts the task that follows the primary among
    /// several hosts (it stops with the manager's other tasks).
    fn build_following(pool: PgPool, options: ManagerOptions, follow: Option<Arc<Follow>>) -> Self {
        let context = Arc::new(Context::new(pool.clone(), options, follow.clone()));
        if let Some(follow) = follow {
            let stop = context.stop.clone();
            tokio::spawn(async move { follow.watch(pool, stop).await });
        }
        let keepalive = Arc::new(context.stop.clone().drop_guard());
        LeaseManager {
            shared: Arc::new(Shared {
                registry: Arc::new(Registry::new()),
                acquirer: Acquirer::new(Arc::clone(&context)),
                context,
            }),
            keepalive,
        }
    }

    /// Connects a pool of [`pool_options`](crate::connect::pool_options) to `url`
    /// and builds a manager on it, with the default [`ManagerOptions`].
    /// `url` is a PostgreSQL URL or a libpq `keyword=value` string, with one
    /// host or several (see [`Target::parse`]): with several, the manager
    /// connects to the first that is writable and follows the primary
    /// through a failover (see [`LeaseManager::connect_with`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a connection string that cannot be used
    /// (see [`Target::parse`]); [`Error::Database`] for a URL that does not
    /// parse, or when no server can be reached: at once for a refused
    /// connection or a failed login, after the URL's `connect_timeout`
    /// (or `PGCONNECT_TIMEOUT`), else
    /// [`DEFAULT_TIMEOUT`](crate::connect::DEFAULT_TIMEOUT) (10 s), for a
    /// server that does not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped early, the connection being opened is closed
    /// and no manager exists.
    pub async fn connect(url: &str) -> Result<Self> {
        let target = Target::parse(url)?;
        let timeout = target.connect_timeout().unwrap_or(DEFAULT_TIMEOUT);
        Self::connect_with(target, timeout).await
    }

    /// Like [`LeaseManager::connect`], for a [`Target`] (or one host's
    /// [`PgConnectOptions`], which convert into one), with the time to wait
    /// for a server that does not answer. With several hosts (or
    /// `target_session_attrs` other than `any`), the hosts are tried in
    /// order and the first with the attributes is used; every new
    /// connection is checked before use, and a watch task checks the host
    /// every second (and at once when a renewal fails). When it fails, the
    /// hosts are searched again until one has the attributes (a failover),
    /// and the pool, the listener and the renewal move there; connections
    /// opened before are not used again. `connect_timeout` bounds each
    /// host's first connection and the pool's acquire.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when no host will do, naming each and why: at
    /// once for a refused connection or a failed login, after
    /// `connect_timeout` for a server that does not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped early, the connection being opened is closed
    /// and no manager exists.
    pub async fn connect_with(
        target: impl Into<Target>,
        connect_timeout: Duration,
    ) -> Result<Self> {
        let (pool, follow) = connect_pool(&target.into(), connect_timeout).await?;
        Ok(Self::build_following(
            pool,
            ManagerOptions::default(),
            follow,
        ))
    }

    /// Sets the password the connections this manager opens from now on
    /// log in with: the pool's, and, for a manager following the primary
    /// among several hosts, those it opens to search them. Connections
    /// already open stay open (PostgreSQL checks a password only at
    /// login).
    ///
    /// The hook for a password that changes, such as a cloud IAM token
    /// (Amazon RDS's expires 15 minutes after it is made): call it with
    /// each new token, before the previous one expires. A password from a
    /// password file is read when the manager connects and at each search
    /// of the hosts; to follow a file that is rewritten while the manager
    /// runs, read it again and call this (docs/library.md, "Connecting").
    ///
    /// # Cancel safety
    ///
    /// Not async; it takes effect before it returns.
    pub fn set_password(&self, password: &str) {
        let pool = self.pool();
        let apply = || {
            let options = (*pool.connect_options()).clone().password(password);
            pool.set_connect_options(options);
        };
        match &self.context().follow {
            Some(follow) => follow.target.set_password(password, apply),
            None => apply(),
        }
    }

    /// The pool this manager uses.
    pub fn pool(&self) -> &PgPool {
        &self.shared.context.pool
    }

    /// What this manager's clones and tasks share.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.shared.context
    }

    /// The leases this manager holds (for the test kit's faults).
    #[cfg(feature = "testing")]
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.shared.registry
    }

    /// This manager's options.
    pub fn options(&self) -> &ManagerOptions {
        &self.shared.context.options
    }

    /// A snapshot of this manager's counters.
    pub fn stats(&self) -> ManagerStats {
        let shared = &self.shared;
        let c = &shared.context.counters;
        ManagerStats {
            held: shared.registry.len(),
            renewal_statements: c.renewal_statements.load(Ordering::Relaxed),
            leases_renewed: c.leases_renewed.load(Ordering::Relaxed),
            renewal_failures: c.renewal_failures.load(Ordering::Relaxed),
            acquire_attempts: c.acquire_attempts.load(Ordering::Relaxed),
            group_statements: c.group_statements.load(Ordering::Relaxed),
            waiting: c.waiting.load(Ordering::Relaxed),
            listening: shared.acquirer.is_listening(),
        }
    }

    /// Releases every lease this manager holds, stops its background tasks
    /// and refuses further acquisitions with [`Error::ShutDown`]. Every held
    /// lease reports [`LossReason::Released`] at once; then each is released
    /// in the database (each release bounded by the renewal timeout), and
    /// the releases already under way in the background (of
    /// [`HeldLease`](crate::HeldLease)s dropped before, for instance with the work future
    /// that held them) are waited for, bounded the same way. Call it last
    /// before the process exits: after it, nothing this manager acquired is
    /// left held, and the next holder takes over at once instead of after
    /// a TTL. See [`shutdown_signal`](crate::shutdown_signal) for tying it
    /// to SIGTERM.
    ///
    /// # Errors
    ///
    /// The first failure among the held leases' releases, after trying them
    /// all; a lease whose release failed ends at its expiry. Failures of
    /// background releases are logged, not returned.
    ///
    /// # Cancel safety
    ///
    /// Dropped early, the manager is shut down all the same (every held
    /// lease has reported its loss), but the leases whose release was not
    /// reached end at their expiry.
    pub async fn shutdown(&self) -> Result<()> {
        let context = &self.shared.context;
        context.begin_shutdown();
        let leases = hold::drain(&self.shared.registry);
        context.stop.cancel();
        let limit = context.options.get_renew_timeout();
        let mut first_error = None;
        for lease in &leases {
            let outcome =
                match tokio::time::timeout(limit, db::release(self.context(), lease.fence())).await
                {
                    Ok(outcome) => outcome.map(|_| ()),
                    Err(_) => Err(Error::Lost {
                        name: lease.name().to_owned(),
                        token: lease.token(),
                        reason: LossReason::Unreachable {
                            error: Arc::new(Error::Timeout {
                                operation: "release",
                                after: Some(limit),
                            }),
                        },
                    }),
                };
            if let Err(error) = outcome {
                first_error.get_or_insert(error);
            }
        }
        // Leases dropped before this call, acquisitions nobody took
        // delivery of and leases given up locally are being released in
        // the background, and attempts may still be in the database (they
        // answer within about 2 s, and `hold` then releases what it got,
        // since the manager is shut down): wait for those too, so that a
        // process that returns from `main` after this leaves nothing held.
        context.background.close();
        let background = limit + Duration::from_secs(1);
        if tokio::time::timeout(background, context.background.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                ?background,
                "background releases still unfinished at shutdown"
            );
        }
        first_error.map_or(Ok(()), Err)
    }
}
