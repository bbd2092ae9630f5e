//! What an observer knows of its lease, and how what it reads becomes
//! changes: no I/O and no clock of its own (instants come in as
//! arguments), so it is unit-tested alone.

use tokio::time::Instant;

use super::Change;
use crate::lease::LeaseStatus;

/// What the observer knows of the lease, and how it turns what it reads
/// into changes.
pub(super) struct Tracker {
    known: LeaseStatus,
    /// When the known acquisition expires, on this machine's clock.
    pub(super) deadline: Option<Instant>,
}

impl Tracker {
    pub(super) fn new(status: LeaseStatus) -> Tracker {
        let mut tracker = Tracker {
            known: LeaseStatus::never_acquired(&status.name),
            deadline: None,
        };
        tracker.set(status, Instant::now());
        tracker
    }

    /// Takes `status`, read at about `at`, as what is known.
    pub(super) fn set(&mut self, status: LeaseStatus, at: Instant) {
        self.deadline = status.remaining.map(|r| at + r);
        self.known = status;
    }

    /// The changes between what is known and `status`, read at about
    /// `at`: exact when the acquisition is the same or the known one had
    /// ended; [`Change::Current`] when several changes may lie between.
    pub(super) fn read(&mut self, status: LeaseStatus, at: Instant) -> Vec<Change> {
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
