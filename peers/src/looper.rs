//! What the scenarios share to drive pg_lease's `LeaseLooper`: its
//! settings, one-shot signals its functions send, the functions more than
//! one scenario runs, and who holds a lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_lease::LeaseContext;
use tokio::sync::oneshot;

use crate::BoxError;

/// Attempts every 100 ms, a lease of `ttl`, a heartbeat every third of
/// it (as pg_lease's own tests configure it: its defaults are all zero).
pub(crate) fn options(ttl: Duration) -> pg_lease::LeaseLooperOptions {
    pg_lease::LeaseLooperOptions {
        loop_interval: Duration::from_millis(100),
        loop_interval_jitter: Duration::ZERO,
        lease_duration: ttl,
        lease_heartbeat_interval: ttl / 3,
    }
}

/// A signal a looper's function sends once (later sends do nothing),
/// with the moment: it must be `Clone` to be the looper's state.
pub(crate) type Signal = Arc<std::sync::Mutex<Option<oneshot::Sender<Instant>>>>;

/// A signal and its receiver.
pub(crate) fn slot() -> (Signal, oneshot::Receiver<Instant>) {
    let (tx, rx) = oneshot::channel();
    (Arc::new(std::sync::Mutex::new(Some(tx))), rx)
}

/// Sends `slot`'s signal, the first time.
pub(crate) fn signal(slot: &Signal) {
    if let Some(tx) = slot.lock().ok().and_then(|mut s| s.take()) {
        let _ = tx.send(Instant::now());
    }
}

/// Signals when dropped: when pg_lease aborts the function holding it.
pub(crate) struct OnDrop(pub(crate) Signal);

impl Drop for OnDrop {
    fn drop(&mut self) {
        signal(&self.0);
    }
}

/// A looper's function that signals `held` once its looper holds the
/// lease, then works without the database until pg_lease aborts it.
pub(crate) async fn holds(_ctx: LeaseContext, held: Signal) -> Result<(), BoxError> {
    signal(&held);
    std::future::pending::<()>().await;
    Ok(())
}
