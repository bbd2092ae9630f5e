//! One acquisition's wait between two attempts: how it hears of a
//! release (the manager's listener), of the holder's session's end (a
//! wait in the server), and what plan.rs is told.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use super::attempt::{Refusal, SessionWait, session_ended};
use super::plan::{self, Heard};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::notify::{Listener, Listening, Subscription, Topic};

/// How long a waiter waits for the listener to confirm a watch before it
/// falls back to polling for that round.
const WATCH_CONFIRM: Duration = Duration::from_secs(1);

/// One acquisition's state from one attempt to the next: how it hears of
/// a release or of the holder's end, and what its plan needs to know.
pub(super) struct Waiter<'a> {
    pub(super) context: &'a Arc<Context>,
    pub(super) name: &'a str,
    pub(super) deadline: Instant,
    /// The manager's release listener, once this waiter started it.
    pub(super) listener: Option<&'a Listener>,
    /// Names whose release the listener heard (`None` in a message: it
    /// connected again).
    pub(super) releases: Option<broadcast::Receiver<Option<String>>>,
    /// Whether the listener is connected.
    pub(super) listening: Option<watch::Receiver<Listening>>,
    /// The previous holder's expiry as last seen, for the takeover delay.
    pub(super) seen_expiry: Option<DateTime<Utc>>,
    /// The backoffs' steps (see plan.rs).
    pub(super) counts: plan::Counts,
    /// Releases are notified only for names a session watches: watched
    /// on the listening connection after the first failed attempt.
    pub(super) watching: Option<Subscription>,
    /// Whether that watch took hold (a release would be heard).
    pub(super) watched: bool,
    /// The session-bound holder whose session's end last woke us (see
    /// plan.rs).
    pub(super) woken_by: Option<i32>,
    /// The wait in the server for that holder's session to end, kept from
    /// one nap to the next while the holder stays the same.
    pub(super) session_wait: Option<(i32, SessionWait<'a>)>,
}

impl<'a> Waiter<'a> {
    /// A waiter for `name` until `deadline`, not yet listening.
    pub(super) fn new(context: &'a Arc<Context>, name: &'a str, deadline: Instant) -> Waiter<'a> {
        Waiter {
            context,
            name,
            deadline,
            listener: None,
            releases: None,
            listening: None,
            seen_expiry: None,
            counts: plan::Counts::default(),
            watching: None,
            watched: false,
            woken_by: None,
            session_wait: None,
        }
    }

    /// Starts the manager's release listener for this waiter, unless it
    /// has already or the manager does not listen. A `counted` lease's
    /// slots are released under their own names: its waiters poll.
    pub(super) fn listen(&mut self, counted: bool) {
        if self.listener.is_none() && self.context.options.get_notify() && !counted {
            let started = self.context.listener();
            self.releases = Some(started.releases.subscribe());
            self.listening = Some(started.listening.subscribe());
            self.listener = Some(started);
        }
    }

    /// Watches the name for releases, if listening and it is not watched
    /// yet (nor `pinned`: no release would announce that lease's end);
    /// whether a watch took hold now, confirmed within [`WATCH_CONFIRM`].
    pub(super) async fn watch(&mut self, pinned: bool) -> Result<bool> {
        let Some(listener) = self.listener.filter(|_| !self.watched && !pinned) else {
            return Ok(false);
        };
        let watching = self
            .watching
            .get_or_insert_with(|| listener.subscribe(Topic::Releases, self.name));
        let until = (Instant::now() + WATCH_CONFIRM).min(self.deadline);
        let confirmed = tokio::select! {
            confirmed = watching.confirmed(listener.is_listening(), until) => confirmed,
            () = self.context.stop.cancelled() => return Err(Error::ShutDown),
        };
        self.watched = confirmed;
        Ok(confirmed)
    }

    /// The plan for the nap after `refusal`; starts (or keeps, or drops) the
    /// wait in the server for the holder's session that it blocks on.
    pub(super) fn next_nap(&mut self, refusal: &Refusal) -> plan::NextNap {
        // Read (and mark seen) the listener's state whether or not this
        // waiter is watched, so that an old change does not wake it.
        let connected = self
            .listening
            .as_mut()
            .is_some_and(|w| *w.borrow_and_update() == Listening::Yes);
        let seen = plan::Seen {
            expires_at: refusal.expires_at,
            checked_at: refusal.checked_at,
            delayed_until: refusal.delayed_until,
            pinned: refusal.pinned(),
            holder_session: refusal.holder_session,
            woken_by: self.woken_by,
            heard: self.watched && connected,
        };
        let plan = plan::next_nap(&seen, &mut self.counts);
        if self.session_wait.as_ref().map(|(pid, _)| *pid) != plan.block_on {
            let context = self.context;
            self.session_wait = plan.block_on.map(|pid| {
                let wait: SessionWait<'a> = Box::pin(session_ended(context, pid));
                (pid, wait)
            });
        }
        plan
    }

    /// Naps until `wake`, or until sooner: the name's release, the end of
    /// the holder's session blocked on, or a change in what the listener
    /// hears (then the name is watched again).
    pub(super) async fn nap(&mut self, wake: Instant) -> Result<()> {
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(wake) => return Ok(()),
                () = session_over(&mut self.session_wait) => {
                    self.woken_by = self.session_wait.take().map(|(pid, _)| pid);
                    self.counts.exit_polls = 0;
                    return Ok(());
                }
                () = self.context.stop.cancelled() => return Err(Error::ShutDown),
                released = next_release(&mut self.releases) => match plan::heard(&released, self.name) {
                    Heard::Other => continue,
                    Heard::This => return Ok(()),
                    Heard::Rewatch => {
                        self.watched = false;
                        return Ok(());
                    }
                    Heard::Closed => {
                        self.releases = None;
                        return Ok(());
                    }
                },
                () = listening_changed(&mut self.listening) => {
                    self.watched = false;
                    return Ok(());
                }
            }
        }
    }
}

/// Resolves when the wait in the server for a holder's session does;
/// never without one.
pub(super) async fn session_over(wait: &mut Option<(i32, SessionWait<'_>)>) {
    match wait {
        Some((_, wait)) => wait.as_mut().await,
        None => std::future::pending().await,
    }
}

/// The listener's next message about releases; never without a listener.
pub(super) async fn next_release(
    releases: &mut Option<broadcast::Receiver<Option<String>>>,
) -> std::result::Result<Option<String>, broadcast::error::RecvError> {
    match releases {
        Some(receiver) => receiver.recv().await,
        None => std::future::pending().await,
    }
}

/// Resolves when whether the listener is connected changes (or it is
/// gone, then not again); never without a listener.
pub(super) async fn listening_changed(listening: &mut Option<watch::Receiver<Listening>>) {
    match listening {
        Some(receiver) => {
            if receiver.changed().await.is_err() {
                *listening = None;
            }
        }
        None => std::future::pending().await,
    }
}
