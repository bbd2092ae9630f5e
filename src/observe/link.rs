//! The observing task: hears the lease's changes through the manager's
//! listening connection (`crate::notify`) while it is subscribed there,
//! reads the lease when its known expiry passes or at each poll, and
//! subscribes again after a gap.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Change;
use super::tracker::Tracker;
use crate::backoff;
use crate::context::Context;
use crate::db;
use crate::notify::{Listening, Subscription, Topic};

/// How long an observer waits for the listener to connect and subscribe
/// its name (`pglease.observe` alone may wait 2 s for its key) before it
/// reads the lease instead.
const CONFIRM: Duration = Duration::from_secs(5);

/// Sends `changes`; false once the observer is gone.
async fn report(send: &mpsc::Sender<Change>, changes: Vec<Change>) -> bool {
    for change in changes {
        if send.send(change).await.is_err() {
            return false;
        }
    }
    true
}

/// An observer's subscription to its name's changes on the manager's
/// listening connection.
struct Subscribed {
    /// Every name the listener forwards a change notification for, and
    /// `None` after a gap.
    changes: broadcast::Receiver<Option<String>>,
    listening: watch::Receiver<Listening>,
    subscription: Subscription,
}

/// How the observer hears of changes: through the listener, or not at all
/// (it polls).
pub(super) struct Link {
    subscribed: Option<Subscribed>,
    /// Whether the listener has confirmed the subscription since the last
    /// gap: every change committed since then is notified.
    pub(super) heard: bool,
    /// Confirmations failed in a row (the key held by another session, a
    /// listener that cannot connect), for the backoff between tries.
    failures: u32,
    /// When to ask the listener to subscribe the name again.
    retry_at: Instant,
}

impl Link {
    /// Subscribes to the changes of `name`, unless the manager does not
    /// listen (then the observer polls).
    pub(super) fn new(context: &Context, name: &str) -> Link {
        let subscribed = context.options.get_notify().then(|| {
            let listener = context.listener();
            // Receivers first: no gap after this can go unseen.
            let changes = listener.changes.subscribe();
            let listening = listener.listening.subscribe();
            Subscribed {
                changes,
                listening,
                subscription: listener.subscribe(Topic::Changes, name),
            }
        });
        Link {
            subscribed,
            heard: false,
            failures: 0,
            retry_at: Instant::now(),
        }
    }

    /// Whether the observer should ask to be heard now.
    fn due(&self) -> bool {
        self.subscribed.is_some() && !self.heard && Instant::now() >= self.retry_at
    }

    /// Waits (up to `CONFIRM`) for the listener to be connected and
    /// subscribed to the name; sets `heard`. After a failure the next try
    /// waits a backoff: a refused `pglease.observe` holds the shared
    /// connection for 2 s.
    pub(super) async fn confirm(&mut self) -> bool {
        let Some(subscribed) = self.subscribed.as_mut() else {
            return false;
        };
        let until = Instant::now() + CONFIRM;
        loop {
            let listening = *subscribed.listening.borrow_and_update();
            match listening {
                Listening::Yes => {}
                Listening::Never => {
                    // A transaction pooler: poll from now on.
                    self.subscribed = None;
                    self.heard = false;
                    return false;
                }
                Listening::No => {
                    tokio::select! {
                        changed = subscribed.listening.changed() => if changed.is_err() { return false },
                        () = tokio::time::sleep_until(until) => {
                            self.failed();
                            return false;
                        }
                    }
                    continue;
                }
            }
            if !subscribed.subscription.confirmed(true, until).await {
                self.failed();
                return false;
            }
            // What was forwarded before now is covered by the read that
            // follows; but a gap among it means that the confirmation may
            // have come from a connection since lost: confirm again.
            let mut gap = false;
            loop {
                match subscribed.changes.try_recv() {
                    Ok(Some(_)) => {}
                    Err(
                        broadcast::error::TryRecvError::Empty
                        | broadcast::error::TryRecvError::Closed,
                    ) => break,
                    Ok(None) | Err(broadcast::error::TryRecvError::Lagged(_)) => gap = true,
                }
            }
            if !gap {
                self.heard = true;
                self.failures = 0;
                return true;
            }
        }
    }

    fn failed(&mut self) {
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Instant::now() + backoff::resubscribe(self.failures);
    }
}

/// What woke an observer that was not told of its name's changes.
enum Woken {
    /// Time to read (a poll, or the known expiry).
    Read,
    /// The listener connected again: ask to be heard, then read.
    Connected,
    Stopped,
}

/// The observing task: follows the notifications while it is heard, reads
/// the lease when its known expiry passes or at each poll, and asks to be
/// heard again after a gap.
pub(super) async fn observe(
    context: Arc<Context>,
    name: String,
    mut tracker: Tracker,
    mut link: Link,
    send: mpsc::Sender<Change>,
    stop: CancellationToken,
) {
    loop {
        if link.heard {
            if !follow(&context, &name, &mut tracker, &mut link, &send, &stop).await {
                return;
            }
            tracing::debug!(
                name,
                "the observer may have missed changes; reading the lease"
            );
        } else {
            match pause(&context, &tracker, &mut link, &send, &stop).await {
                Woken::Stopped => return,
                Woken::Connected => link.retry_at = Instant::now(),
                Woken::Read => {}
            }
        }
        // After a gap, or at a poll: ask to be heard again when it is due.
        let mut gap = false;
        if link.due() {
            let confirm = link.confirm();
            tokio::select! {
                () = stop.cancelled() => return,
                heard = confirm => gap = heard,
            }
        }
        // Whatever happened while nobody told us: read it now.
        let at = Instant::now();
        match db::inspect(&context.pool, &name).await {
            Ok(status) => {
                let changes = if gap {
                    tracker.set(status.clone(), at);
                    vec![Change::Current(status)]
                } else {
                    tracker.read(status, at)
                };
                if !report(&send, changes).await {
                    return;
                }
            }
            Err(error) => {
                tracing::debug!(name, %error, "cannot read the observed lease");
                link.heard = false;
                link.failed();
            }
        }
    }
}

/// Waits, while not heard, for the next poll, the known expiry, or the
/// listener to connect again.
async fn pause(
    context: &Context,
    tracker: &Tracker,
    link: &mut Link,
    send: &mpsc::Sender<Change>,
    stop: &CancellationToken,
) -> Woken {
    let pause = context.options.get_max_poll_interval();
    let now = Instant::now();
    let wake = tracker.deadline.map_or(now + pause, |d| {
        (d + Duration::from_millis(1)).min(now + pause)
    });
    let listening = link.subscribed.as_mut().map(|s| &mut s.listening);
    tokio::select! {
        () = stop.cancelled() => Woken::Stopped,
        () = send.closed() => Woken::Stopped,
        () = tokio::time::sleep_until(wake) => Woken::Read,
        () = connected(listening) => Woken::Connected,
    }
}

/// Resolves when the listener connects (again) after this call.
async fn connected(listening: Option<&mut watch::Receiver<Listening>>) {
    let Some(listening) = listening else {
        return std::future::pending().await;
    };
    listening.borrow_and_update();
    loop {
        if listening.changed().await.is_err() {
            return std::future::pending().await;
        }
        if *listening.borrow_and_update() == Listening::Yes {
            return;
        }
    }
}

/// Reads the lease at each notification for its name, and when its known
/// expiry passes, and reports what changed, until a gap (true: the
/// listener lost its connection or this observer fell behind) or the
/// observer stops (false).
async fn follow(
    context: &Context,
    name: &str,
    tracker: &mut Tracker,
    link: &mut Link,
    send: &mpsc::Sender<Change>,
    stop: &CancellationToken,
) -> bool {
    let Some(subscribed) = link.subscribed.as_mut() else {
        link.heard = false;
        return true;
    };
    loop {
        let expiry = tracker.deadline.map(|d| d + Duration::from_millis(1));
        tokio::select! {
            () = stop.cancelled() => return false,
            () = send.closed() => return false,
            () = sleep_until(expiry) => {
                let at = Instant::now();
                match db::inspect(&context.pool, name).await {
                    Ok(status) => {
                        let changes = tracker.read(status, at);
                        if !report(send, changes).await {
                            return false;
                        }
                    }
                    Err(error) => {
                        tracing::debug!(name, %error, "cannot read the observed lease");
                        tracker.deadline = Some(Instant::now() + backoff::reconnect(1));
                    }
                }
            }
            received = subscribed.changes.recv() => {
                match received {
                    // A hint, from anyone who can NOTIFY: believe only what
                    // the read shows.
                    Ok(Some(changed)) if changed == name => {}
                    Ok(Some(_)) => continue,
                    // The listener lost its connection or connected again,
                    // or this observer fell behind: it may have missed
                    // changes.
                    Ok(None) | Err(_) => {
                        link.heard = false;
                        return true;
                    }
                }
                // One read stands for every notification already here.
                loop {
                    match subscribed.changes.try_recv() {
                        Ok(Some(_)) => {}
                        Err(broadcast::error::TryRecvError::Empty) => break,
                        Ok(None) | Err(_) => {
                            link.heard = false;
                            return true;
                        }
                    }
                }
                let at = Instant::now();
                let changes = match db::inspect(&context.pool, name).await {
                    Ok(status) => tracker.read(status, at),
                    Err(error) => {
                        tracing::debug!(name, %error, "cannot read the observed lease");
                        link.heard = false;
                        return true;
                    }
                };
                if !report(send, changes).await {
                    return false;
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
