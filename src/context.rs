//! What a manager's clones, its held leases and its background tasks
//! share. The tasks hold this, not the manager, so that dropping the last
//! manager handle (and the last held lease) stops them.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
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
    /// Whether acquire, renew and release go prepared (see
    /// `ManagerOptions::prepared_statements`): [`UNDECIDED`] (as text,
    /// while the check for a pooler may run), [`PREPARED`] or [`TEXT`].
    prepared: Arc<AtomicU8>,
    /// The calls that went as text while undecided; the check starts at
    /// [`PROBE_AFTER`].
    undecided_calls: AtomicU32,
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
    pub(crate) group_statements: AtomicU64,
    pub(crate) waiting: AtomicUsize,
}

impl Context {
    pub(crate) fn new(
        pool: PgPool,
        options: ManagerOptions,
        follow: Option<Arc<Follow>>,
    ) -> Context {
        let prepared = match options.get_prepared_statements() {
            Some(true) => PREPARED,
            Some(false) => TEXT,
            None => UNDECIDED,
        };
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
            prepared: Arc::new(AtomicU8::new(prepared)),
            undecided_calls: AtomicU32::new(0),
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

    /// Whether acquire, renew and release go prepared now. Undecided, they
    /// go as text, and the [`PROBE_AFTER`]th call starts the check for a
    /// transaction pooler in the background (on a runtime, two connections
    /// of its own, once per manager): found none, the manager prepares from
    /// then on. A process that makes a few calls (a command) never checks.
    pub(crate) fn prepared(&self) -> bool {
        match self.prepared.load(Ordering::Acquire) {
            PREPARED => true,
            TEXT => false,
            _ => {
                self.start_probe();
                false
            }
        }
    }

    fn start_probe(&self) {
        if self.undecided_calls.fetch_add(1, Ordering::AcqRel) != PROBE_AFTER - 1 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (options, state, stop) = (
            (*self.pool.connect_options())
                .clone()
                .application_name(PROBE_APPLICATION_NAME),
            Arc::clone(&self.prepared),
            self.stop.clone(),
        );
        runtime.spawn(async move {
            let shared = tokio::select! {
                () = stop.cancelled() => return,
                shared = crate::connect::sessions_shared(&options) => shared,
            };
            let decided = match shared {
                Ok(false) => PREPARED,
                Ok(true) => TEXT,
                Err(error) => {
                    tracing::debug!(%error, "cannot check for a transaction pooler; statements stay text");
                    TEXT
                }
            };
            let _ = state.compare_exchange(UNDECIDED, decided, Ordering::AcqRel, Ordering::Acquire);
        });
    }

    /// A prepared statement was not on the server session (a pooler in
    /// between that the check missed): text from now on.
    pub(crate) fn stop_preparing(&self, error: &sqlx::Error) {
        if self.prepared.swap(TEXT, Ordering::AcqRel) != TEXT {
            tracing::warn!(%error, "a prepared statement failed as behind a transaction pooler; \
                                    statements go as text from now on \
                                    (ManagerOptions::prepared_statements(false) skips preparing)");
        }
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

/// The `application_name` of the check for a pooler's connections, which
/// are not the pool's.
const PROBE_APPLICATION_NAME: &str = "pglease pooler check";

/// How many calls go as text before the check for a pooler starts:
/// preparing pays only for calls made again and again.
const PROBE_AFTER: u32 = 8;

/// [`Context::prepared`]'s states.
const UNDECIDED: u8 = 0;
const PREPARED: u8 = 1;
const TEXT: u8 = 2;

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
