//! Tying a manager to the process's stop signals, so that a service that
//! is stopped normally hands its leases over at once instead of after a TTL.

use std::future::Future;

/// A future that completes when the process receives SIGTERM or SIGINT
/// (Ctrl-C); on other platforms, Ctrl-C.
///
/// The handlers are installed when this function is called, not when the
/// future is first polled: from then on those signals no longer end the
/// process, so call it early, before the work starts. Then stop the work
/// and call [`LeaseManager::shutdown`](crate::LeaseManager::shutdown),
/// which releases what the work held (also leases dropped with the work's
/// future) and waits for it:
///
/// ```no_run
/// # async fn service(leases: pglease::LeaseManager) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let stop = pglease::shutdown_signal()?;
/// let how = pglease::AcquireOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(60));
/// let work = leases.with_lease("nightly-report", how, async |held| {
///     // ... work under held.token() ...
///     Ok::<_, pglease::Error>(())
/// });
/// tokio::select! {
///     outcome = work => outcome?,
///     () = stop => {} // the work future is dropped here
/// }
/// leases.shutdown().await?; // the next holder gets the lease in milliseconds
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// The I/O error if a handler cannot be installed (call it inside a tokio
/// runtime with signals enabled, as `#[tokio::main]` does).
///
/// # Cancel safety
///
/// Dropping the future removes nothing: the handlers stay installed for
/// the rest of the process, and the signals keep being caught.
#[cfg(unix)]
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

/// A future that completes on Ctrl-C (see the Unix version).
#[cfg(not(unix))]
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    Ok(async {
        // Without a handler there is nothing to wait for: never complete.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    })
}
