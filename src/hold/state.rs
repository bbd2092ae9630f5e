//! The state of one held lease that the holder's handles and the renewal
//! task both see: the local deadline, the database's expiry, and the loss
//! signal with its reason.
//!
//! The local deadline is the instant the last confirmed renewal (or the
//! acquisition) was *sent*, plus the TTL, minus the safety margin. The
//! database set its expiry to *its* clock at the moment it ran the
//! statement, plus the same TTL, and that moment is after the send: so the
//! local deadline passes before the database's expiry, as long as the two
//! clocks' rates differ by less than the margin. The deadline moves
//! forward only when a renewal is confirmed.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, LossReason};
use crate::lease::Lease;
use crate::options::Timing;

pub(crate) struct HeldState {
    pub(crate) lease: Lease,
    pub(crate) timing: Timing,
    /// The TTL as an interval, for the renewal statement.
    pub(crate) pg_ttl: PgInterval,
    pub(crate) view: watch::Sender<View>,
    pub(crate) lost: CancellationToken,
    renewal: Mutex<RenewalStatus>,
}

#[derive(Debug, Clone)]
pub(crate) struct View {
    pub(crate) deadline: Instant,
    pub(crate) expires_at: DateTime<Utc>,
    pub(crate) lost: Option<LossReason>,
    pub(crate) lost_at: Option<Instant>,
    /// Since when renewals have failed, with the last error; `None` while
    /// the last renewal (or the acquisition) was confirmed.
    pub(crate) failing: Option<(Instant, Arc<Error>)>,
}

/// The renewal in progress, for the reason of a loss at the deadline.
#[derive(Default)]
struct RenewalStatus {
    last_error: Option<Arc<Error>>,
    sent_at: Option<Instant>,
}

impl HeldState {
    /// A lease acquired by a statement sent at `sent`.
    pub(crate) fn new(lease: Lease, sent: Instant, timing: Timing, pg_ttl: PgInterval) -> Self {
        let (view, _) = watch::channel(View {
            deadline: sent + timing.ttl - timing.margin,
            expires_at: lease.expires_at(),
            lost: None,
            lost_at: None,
            failing: None,
        });
        HeldState {
            lease,
            timing,
            pg_ttl,
            view,
            lost: CancellationToken::new(),
            renewal: Mutex::new(RenewalStatus::default()),
        }
    }

    fn renewal(&self) -> MutexGuard<'_, RenewalStatus> {
        crate::sync::lock(&self.renewal)
    }

    /// When the loss fires: a little before the deadline, so that a timer
    /// that wakes late still fires by the deadline.
    pub(crate) fn fire_at(&self) -> Instant {
        let deadline = self.view.borrow().deadline;
        deadline.checked_sub(self.timing.early).unwrap_or(deadline)
    }

    pub(crate) fn loss(&self) -> Option<LossReason> {
        self.view.borrow().lost.clone()
    }

    /// Marks the lease lost at `now` (once; later reasons are ignored) and
    /// cancels its token. Returns whether this call was the one that did it.
    pub(crate) fn fire(&self, reason: LossReason, now: Instant) -> bool {
        let fired = self.view.send_if_modified(|v| {
            if v.lost.is_some() {
                return false;
            }
            // Released is the holder's own doing (release, handover,
            // shutdown): said, not warned of.
            if matches!(reason, LossReason::Released) {
                tracing::debug!(name = self.lease.name(), token = self.lease.token().get(), "lease released");
            } else {
                tracing::warn!(name = self.lease.name(), token = self.lease.token().get(), %reason, "lease lost");
            }
            v.lost = Some(reason);
            v.lost_at = Some(now);
            true
        });
        if fired {
            if let Some(reason) = &self.view.borrow().lost {
                crate::telemetry::lease_ended(reason);
            }
            self.lost.cancel();
        }
        fired
    }

    /// The reason for a loss at the local deadline, at `now`.
    pub(crate) fn deadline_reason(&self, now: Instant) -> LossReason {
        let status = self.renewal();
        if let Some(error) = &status.last_error {
            return LossReason::Unreachable {
                error: error.clone(),
            };
        }
        if let Some(sent) = status.sent_at {
            return LossReason::Unreachable {
                error: Arc::new(Error::Timeout {
                    operation: "renewal",
                    after: Some(now.saturating_duration_since(sent)),
                }),
            };
        }
        LossReason::Expired
    }

    /// Fires the loss at the local deadline if it has passed by `now`;
    /// returns the reason if the lease is lost.
    pub(crate) fn loss_by(&self, now: Instant) -> Option<LossReason> {
        if let Some(reason) = self.loss() {
            return Some(reason);
        }
        if now >= self.fire_at() {
            self.fire(self.deadline_reason(now), now);
        }
        self.loss()
    }

    /// A renewal is on its way (the first send since the last outcome is
    /// the one a timeout is counted from).
    pub(crate) fn sending(&self, now: Instant) {
        self.renewal().sent_at.get_or_insert(now);
    }

    /// A renewal failed at `now`: the error is the reason if the deadline
    /// comes. Returns whether this is the first failure since the last
    /// confirmation (renewals have started failing).
    pub(crate) fn failed(&self, error: Arc<Error>, now: Instant) -> bool {
        let mut status = self.renewal();
        status.last_error = Some(error.clone());
        status.sent_at = None;
        drop(status);
        self.failing(error, now)
    }

    /// Renewals count as failing from `now` with `error` (a failure, or a
    /// statement still unanswered when it is late); whether they were not
    /// already.
    pub(crate) fn failing(&self, error: Arc<Error>, now: Instant) -> bool {
        let mut started = false;
        self.view.send_if_modified(|v| {
            if v.lost.is_some() {
                return false;
            }
            match &mut v.failing {
                Some((_, last)) => {
                    // A new error; not a change watchers wait for.
                    *last = error;
                    false
                }
                None => {
                    v.failing = Some((now, error));
                    started = true;
                    true
                }
            }
        });
        started
    }

    /// A renewal sent at `sent` was confirmed with `expires_at`. Returns
    /// how long renewals had been failing, if they had.
    pub(crate) fn confirm(
        &self,
        sent: Instant,
        expires_at: DateTime<Utc>,
        now: Instant,
    ) -> Option<Duration> {
        let deadline = sent + self.timing.ttl - self.timing.margin;
        let mut recovered = None;
        self.view.send_if_modified(|v| {
            if v.lost.is_some() {
                return false;
            }
            let mut changed = false;
            if let Some((since, _)) = v.failing.take() {
                recovered = Some(now.saturating_duration_since(since));
                changed = true;
            }
            if deadline > v.deadline {
                v.deadline = deadline;
                v.expires_at = expires_at;
                changed = true;
            }
            changed
        });
        *self.renewal() = RenewalStatus::default();
        recovered
    }
}
