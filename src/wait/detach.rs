//! Attempts (and joins of the line) awaited where they are called, with
//! no task of their own, that are finished in the background when their
//! caller stops waiting, so that what they acquired for nobody is given
//! back.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use super::attempt::{Attempt, Won};
use super::line;
use crate::context::Context;
use crate::error::{Error, Result};

/// What an attempt acquired, given back when nobody takes delivery.
pub(super) trait GiveBack: Send + 'static {
    /// Releases in the background whatever the outcome holds.
    fn give_back(self, context: &Context);
}

impl GiveBack for (line::Ticket, u32) {
    /// A place joined for a waiter that stopped waiting: dropping it
    /// leaves the line in the background.
    fn give_back(self, _context: &Context) {
        drop(self);
    }
}

impl<W: Won> GiveBack for Attempt<W> {
    fn give_back(self, context: &Context) {
        if let Attempt::Acquired { won, .. } = self {
            for lease in won.leases() {
                context.release_in_background(lease.fence());
            }
        }
    }
}

/// An attempt polled where it is awaited, with no task of its own. If
/// the waiter stops waiting while the attempt's statement is in flight
/// (the future is dropped), the attempt is finished on a tracked task
/// instead, so that `shutdown` waits for it, and what it acquired for
/// nobody is given back; without a runtime to finish it on (the runtime
/// itself is shutting down), it is dropped and what it may have acquired
/// expires.
pub(super) struct InFlight<T: GiveBack> {
    pub(super) running: Option<Pin<Box<dyn Future<Output = Result<T>> + Send>>>,
    pub(super) context: Arc<Context>,
}

impl<T: GiveBack> Future for InFlight<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Result<T>> {
        let Some(running) = self.running.as_mut() else {
            // Polled again after its answer: nothing is in flight.
            return Poll::Ready(Err(Error::ShutDown));
        };
        let outcome = std::task::ready!(running.as_mut().poll(cx));
        // Answered: nothing is left to finish when this is dropped.
        self.running = None;
        Poll::Ready(outcome)
    }
}

impl<T: GiveBack> Drop for InFlight<T> {
    fn drop(&mut self) {
        let Some(running) = self.running.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let context = Arc::clone(&self.context);
        self.context.background.spawn_on(
            async move {
                if let Ok(acquired) = running.await {
                    acquired.give_back(&context);
                }
            },
            &runtime,
        );
    }
}

/// Runs `attempt` in place, so that a caller who stops waiting while its
/// statement is in flight leaves nothing held (see [`InFlight`]): no task
/// is spawned unless the caller goes.
pub(super) async fn detached<T, F>(
    context: &Arc<Context>,
    attempt: impl FnOnce(Arc<Context>) -> F,
) -> Result<T>
where
    T: GiveBack + Send + 'static,
    F: Future<Output = Result<T>> + Send + 'static,
{
    InFlight {
        running: Some(Box::pin(attempt(Arc::clone(context)))),
        context: Arc::clone(context),
    }
    .await
}
