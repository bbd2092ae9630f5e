//! What an observer knows of its lease, and how what it hears or reads
//! becomes changes: no I/O and no clock of its own (instants come in as
//! arguments), so it is unit-tested alone.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::Change;
use super::payload::Heard;
use crate::lease::LeaseStatus;

/// What the observer knows of the lease, and how it turns what it hears
/// or reads into changes.
pub(super) struct Tracker {
    known: LeaseStatus,
    /// When the known acquisition expires, on this machine's clock.
    pub(super) deadline: Option<Instant>,
    /// A database time and the local instant it was read at, to turn an
    /// `expires_at` into a local deadline.
    clock: Option<(DateTime<Utc>, Instant)>,
}

impl Tracker {
    pub(super) fn new(status: LeaseStatus) -> Tracker {
        let mut tracker = Tracker {
            known: LeaseStatus::never_acquired(&status.name),
            deadline: None,
            clock: None,
        };
        tracker.set(status, Instant::now());
        tracker
    }

    /// Takes `status`, read at about `at`, as what is known.
    pub(super) fn set(&mut self, status: LeaseStatus, at: Instant) {
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
    pub(super) fn hear(&mut self, heard: Heard) -> (Vec<Change>, bool) {
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
