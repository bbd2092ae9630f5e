//! Lease loss on demand for one manager: renewals that fail, a renewal
//! task that pauses, renewal at once. The flags live in the manager's
//! context (`crate::context::FaultFlags`), where the renewal task reads them.

use std::sync::Arc;

use crate::context::Context;
use crate::hold::Registry;
use crate::manager::LeaseManager;

impl LeaseManager {
    /// Faults to switch on in tests (feature `testing`): renewals that
    /// fail or pause, and renewal on demand. They affect this manager and
    /// its clones only.
    pub fn faults(&self) -> Faults {
        Faults {
            context: Arc::clone(self.context()),
            registry: Arc::clone(self.registry()),
        }
    }
}

/// Faults for one manager (and its clones), for tests: see
/// [`LeaseManager::faults`].
#[derive(Clone)]
pub struct Faults {
    context: Arc<Context>,
    registry: Arc<Registry>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("renewals_failing", &self.context.faults.is_failing())
            .field("renewals_paused", &self.context.faults.is_paused())
            .finish()
    }
}

impl Faults {
    /// From now on every renewal statement fails as if the server refused
    /// connections: the manager retries with its backoff, and a lease
    /// whose deadline passes is lost with
    /// [`LossReason::Unreachable`](crate::LossReason::Unreachable) (its
    /// release is tried in the background, as in production). Until
    /// [`Faults::restore_renewals`]. Only renewals fail: acquisitions,
    /// releases and fenced transactions still reach the database.
    pub fn fail_renewals(&self) {
        self.context.faults.set_failing(true);
    }

    /// Renewals reach the database again; leases not yet lost are renewed
    /// at their next retry ([`Faults::renew_now`]: at once).
    pub fn restore_renewals(&self) {
        self.context.faults.set_failing(false);
        self.registry.wake.notify_one();
    }

    /// Pauses the manager's renewal task, as if it were starved or its
    /// process stopped: nothing is renewed, the leases expire in the
    /// database, and each holder loses its lease at its local deadline
    /// with [`LossReason::Expired`](crate::LossReason::Expired). Until
    /// [`Faults::resume_renewals`].
    pub fn pause_renewals(&self) {
        self.context.faults.set_paused(true);
        self.registry.wake.notify_one();
    }

    /// Resumes the renewal task; a lease taken over meanwhile is then lost
    /// with [`LossReason::Stale`](crate::LossReason::Stale) at its next
    /// renewal.
    pub fn resume_renewals(&self) {
        self.context.faults.set_paused(false);
    }

    /// Makes every lease the manager holds due for renewal now, so that a
    /// test learns at once what the database says of them (after
    /// [`expire_now`](super::expire_now), say) instead of at the next renewal.
    pub fn renew_now(&self) {
        self.registry.make_due(tokio::time::Instant::now());
    }
}
