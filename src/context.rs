//! What a manager's clones, its held leases and its background tasks
//! share. The tasks hold this, not the manager, so that dropping the last
//! manager handle (and the last held lease) stops them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use sqlx::postgres::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connect::Follow;
use crate::lease::Fence;
use crate::notify::Listener;
use crate::options::ManagerOptions;
use crate::sql;

pub(crate) struct Context {
    pub(crate) pool: PgPool,
    pub(crate) options: ManagerOptions,
    pub(crate) counters: Counters,
    /// Cancelled at shutdown or when the last handle is dropped: every
    /// background task stops.
    pub(crate) stop: CancellationToken,
    /// Work that may leave a lease held if it is cut short: acquisition
    /// attempts on tasks of their own, releases sent in the background
    /// (dropped leases, abandoned acquisitions, leases given up locally),
    /// and `hold` calls until their lease is registered. `shutdown` waits
    /// for all of it, so that a process that stops cleanly leaves nothing
    /// held.
    pub(crate) background: TaskTracker,
    /// The server session that session-bound leases are acquired on (and
    /// bound to), opened beside the pool on first use; dropped after an
    /// error, which ends those leases (see `AcquireOptions::session_bound`).
    pub(crate) session: tokio::sync::Mutex<Option<PgConnection>>,
    /// With several hosts (or attributes to check): which host the pool
    /// uses, and the watch task's trouble signal.
    pub(crate) follow: Option<Arc<Follow>>,
    /// The one listening connection, shared by waiters, observers and
    /// electors; started by the first of them that needs it.
    listener: OnceLock<Listener>,
    shut_down: AtomicBool,
    /// Faults a test has switched on (`pglease::testing::Faults`).
    #[cfg(feature = "testing")]
    pub(crate) faults: FaultFlags,
}

/// The manager's counters (see [`crate::ManagerStats`]).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) renewal_statements: AtomicU64,
    pub(crate) leases_renewed: AtomicU64,
    pub(crate) renewal_failures: AtomicU64,
    pub(crate) acquire_attempts: AtomicU64,
    pub(crate) waiting: AtomicUsize,
}

impl Context {
    pub(crate) fn new(
        pool: PgPool,
        options: ManagerOptions,
        follow: Option<Arc<Follow>>,
    ) -> Context {
        Context {
            pool,
            options,
            counters: Counters::default(),
            stop: CancellationToken::new(),
            background: TaskTracker::new(),
            session: tokio::sync::Mutex::new(None),
            follow,
            listener: OnceLock::new(),
            shut_down: AtomicBool::new(false),
            #[cfg(feature = "testing")]
            faults: FaultFlags::default(),
        }
    }

    /// A statement failed: with several hosts, the watch task looks at the
    /// primary now rather than at its next check.
    pub(crate) fn report_trouble(&self) {
        if let Some(follow) = &self.follow {
            follow.report_trouble();
        }
    }

    /// The manager's listening connection, started (or started again, if
    /// the runtime it ran on has ended) by this call.
    pub(crate) fn listener(&self) -> &Listener {
        let listener = self
            .listener
            .get_or_init(|| Listener::new(self.pool.clone(), self.stop.clone()));
        listener.ensure_running();
        listener
    }

    /// Whether the manager is listening right now (false if it never
    /// started to).
    pub(crate) fn is_listening(&self) -> bool {
        self.listener.get().is_some_and(Listener::is_listening)
    }

    /// Whether `shutdown` has begun: no new acquisitions.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    pub(crate) fn begin_shutdown(&self) {
        self.shut_down.store(true, Ordering::Release);
    }

    /// Releases `lease` on a tracked task if a runtime is available (else
    /// it simply expires); `shutdown` waits for it. Bounded by the renewal
    /// timeout; a failure is logged.
    pub(crate) fn release_in_background(&self, lease: &Fence) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = self.pool.clone();
        let limit = self.options.get_renew_timeout();
        let (name, token) = (lease.name().to_owned(), lease.token().get());
        let statement = sql::release(lease.name(), lease.token());
        self.background.spawn_on(
            async move {
                let release = sql::query(statement).execute(&pool);
                match tokio::time::timeout(limit, release).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => {
                        tracing::debug!(name, token, %error, "background release failed");
                    }
                    Err(_) => tracing::debug!(name, token, "background release timed out"),
                }
            },
            &runtime,
        );
    }
}

/// The faults a test has switched on for one manager, read by the
/// renewal task; set through `pglease::testing::Faults` (the kit uses
/// the runtime, never the reverse).
#[cfg(feature = "testing")]
pub(crate) struct FaultFlags {
    failing: std::sync::atomic::AtomicBool,
    paused: tokio::sync::watch::Sender<bool>,
}

#[cfg(feature = "testing")]
impl Default for FaultFlags {
    fn default() -> Self {
        FaultFlags {
            failing: std::sync::atomic::AtomicBool::new(false),
            paused: tokio::sync::watch::Sender::new(false),
        }
    }
}

#[cfg(feature = "testing")]
impl FaultFlags {
    pub(crate) fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::Release);
    }

    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    pub(crate) fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    pub(crate) fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Resolves once the renewal task is no longer paused.
    pub(crate) async fn resumed(&self) {
        let mut paused = self.paused.subscribe();
        let _ = paused.wait_for(|paused| !paused).await;
    }
}

/// The error a renewal made to fail reports: the one a server that
/// refuses connections gives.
#[cfg(feature = "testing")]
pub(crate) fn refused() -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "connection refused (made to fail by pglease::testing::Faults::fail_renewals)",
    ))
}
