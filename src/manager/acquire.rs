//! Acquiring, holding and working under a lease.

use tokio::time::Instant;

use super::LeaseManager;
use crate::error::{Error, Result};
use crate::hold::{self, HeldLease};
use crate::lease::{Lease, interval};
use crate::options::AcquireOptions;

impl LeaseManager {
    /// Acquires lease `name` as `how` says: for its TTL, for its holder,
    /// and waiting up to its [`wait`](AcquireOptions::wait) for the current holder
    /// to release it or let it expire (by default, one attempt).
    ///
    /// Each success carries a new token, greater than every token issued
    /// before for `name`. An attempt on a held, unexpired lease is
    /// read-only in the database. On a lease that has ended but is still
    /// locked by transactions fenced under an earlier token, the database
    /// ends those transactions first; each attempt answers within about
    /// 2 s. An answer that came later than a renewal period is confirmed
    /// with a renewal before it is returned (a term handed over counts as
    /// late by what it lacks of the TTL).
    ///
    /// A waiting acquisition wakes as soon as the holder releases (the
    /// manager starts listening for releases when a first attempt fails,
    /// see [`ManagerOptions::notify`](crate::ManagerOptions::notify)),
    /// otherwise retries when the holder's lease expires, with jitter; when
    /// it cannot listen it polls, backing off from 10 ms up to the
    /// configured maximum.
    ///
    /// ```no_run
    /// # async fn f(leases: pglease::LeaseManager) -> Result<(), pglease::Error> {
    /// use std::time::Duration;
    /// use pglease::{AcquireOptions, Error};
    ///
    /// match leases.acquire("nightly-report", AcquireOptions::ttl(Duration::from_secs(30))).await {
    ///     Ok(lease) => println!("mine under token {}", lease.token()),
    ///     Err(Error::Held { holder, .. }) => println!("{holder} has it"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Held`] (with the last holder seen) if someone holds it when
    /// the wait is over, including this holder itself: leases are not
    /// re-entrant. [`Error::Pinned`] if it has ended but a stale fenced
    /// transaction that could not be ended still holds it.
    /// [`Error::GrantDelayed`] during the grant delay an administrator set
    /// for after a failover or a restore (`pglease.set_grant_delay`), when
    /// the wait ends before it does.
    /// [`Error::InvalidInput`] (nothing sent), [`Error::ShutDown`],
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future leaves nothing held (an attempt in
    /// flight at that moment is released if it succeeded).
    pub async fn acquire(&self, name: &str, how: AcquireOptions) -> Result<Lease> {
        Ok(self.acquire_sent(name, &how).await?.0)
    }

    /// Acquires every lease of `names`, each with its own token, or none,
    /// in one statement (`pglease.acquire_all`): the names are taken in
    /// byte order, so two calls over overlapping sets, in whatever order
    /// their callers list them, never deadlock; the first name that
    /// cannot be taken undoes the others. Returns the leases in byte order
    /// of their names; each is an ordinary lease (renew, release, fence
    /// and hold it by its name and token). Waits as `how` allows (see
    /// [`LeaseManager::acquire`]), on the name that blocked the last
    /// attempt, then tries the whole set again; waiters are not served in
    /// arrival order.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] before connecting: no names, more than
    /// [`MAX_SET_NAMES`](crate::limits::MAX_SET_NAMES), a name twice, a
    /// name, holder or TTL that [`LeaseManager::acquire`] would refuse, or
    /// a counted limit, a value or session binding (a single lease's
    /// options). [`Error::Held`], [`Error::Pinned`] or
    /// [`Error::GrantDelayed`] naming the first name that could not be
    /// taken, once the wait is over; [`Error::NotPermitted`] if a name is
    /// granted to other roles (nothing taken); [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, nothing stays held (a set
    /// acquired in flight is released in the background).
    pub async fn acquire_all(&self, names: &[&str], how: AcquireOptions) -> Result<Vec<Lease>> {
        Ok(self.shared.acquirer.acquire_all(names, &how).await?.0)
    }

    /// [`LeaseManager::acquire`], and the instant its term is counted from
    /// (its confirming statement's send, see `wait::plan::counted_from`).
    async fn acquire_sent(&self, name: &str, how: &AcquireOptions) -> Result<(Lease, Instant)> {
        self.shared.acquirer.acquire(name, how).await
    }

    /// Acquires lease `name` as `how` says (waiting as long as it allows,
    /// see [`LeaseManager::acquire`]) and keeps it renewed in the
    /// background until every clone of the returned handle is dropped, one
    /// is released, or the lease is lost.
    ///
    /// # Errors
    ///
    /// Those of [`LeaseManager::acquire`]; and [`Error::InvalidInput`] if
    /// the renewal period (TTL × renew fraction) would not come before the
    /// local deadline (TTL − safety margin).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, nothing stays held (an
    /// acquisition in flight is released in the background).
    pub async fn hold(&self, name: &str, how: AcquireOptions) -> Result<HeldLease> {
        let shared = &self.shared;
        // The TTL as renewals send it, validated and converted once.
        let pg_ttl = interval(how.get_ttl())?;
        let timing = shared.context.options.timing(how.get_ttl())?;
        // Until the lease is registered (or released, if a shutdown came
        // first), `shutdown` waits for this call.
        let _busy = shared.context.background.token();
        let (lease, sent) = self.acquire_sent(name, &how).await?;
        Ok(hold::register(
            &shared.context,
            &shared.registry,
            &self.keepalive,
            lease,
            sent,
            timing,
            pg_ttl,
        ))
    }

    /// Acquires every lease of `names` or none, as
    /// [`LeaseManager::acquire_all`] does, and keeps each renewed in the
    /// background as [`LeaseManager::hold`] does (the renewals of leases
    /// due together go out together). Returns the held leases in byte
    /// order of their names. Each is lost on its own: a caller whose work
    /// needs the whole set stops when any is lost (`HeldLease::lost` on
    /// each, or `is_lost` on any).
    ///
    /// # Errors
    ///
    /// Those of [`LeaseManager::acquire_all`]; and [`Error::InvalidInput`]
    /// if the renewal period would not come before the local deadline (see
    /// [`LeaseManager::hold`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, nothing stays held.
    pub async fn hold_all(&self, names: &[&str], how: AcquireOptions) -> Result<Vec<HeldLease>> {
        let shared = &self.shared;
        let pg_ttl = interval(how.get_ttl())?;
        let timing = shared.context.options.timing(how.get_ttl())?;
        let _busy = shared.context.background.token();
        let (leases, sent) = shared.acquirer.acquire_all(names, &how).await?;
        Ok(leases
            .into_iter()
            .map(|lease| {
                hold::register(
                    &shared.context,
                    &shared.registry,
                    &self.keepalive,
                    lease,
                    sent,
                    timing,
                    pg_ttl,
                )
            })
            .collect())
    }

    /// Runs `work` while holding lease `name`: acquires it as `how` says,
    /// renews it in the background, and releases it when `work` finishes.
    ///
    /// If the lease is lost first, `work` is dropped at its next await
    /// point (stopped) and this returns [`Error::Lost`] with the reason,
    /// converted into `work`'s error type: one `?` handles both. `work`
    /// gets a clone of the held lease (move it into spawned tasks freely)
    /// for its token and loss signal; fenced writes inside it should use
    /// [`HeldLease::begin_fenced`].
    ///
    /// ```no_run
    /// # async fn f(leases: pglease::LeaseManager) -> Result<(), pglease::Error> {
    /// use std::time::Duration;
    /// use pglease::AcquireOptions;
    ///
    /// let rows = leases
    ///     .with_lease("nightly-report", AcquireOptions::ttl(Duration::from_secs(30)), async |held| {
    ///         let mut tx = held.begin_fenced().await?;
    ///         let rows = sqlx::query("DELETE FROM outbox").execute(&mut *tx).await?;
    ///         tx.commit().await?;
    ///         Ok::<_, pglease::Error>(rows.rows_affected())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Those of [`LeaseManager::hold`] and [`Error::Lost`], converted into
    /// `E`; `work`'s own error. When `work` fails, the lease is checked in
    /// the database (one read): if it is no longer held under its token,
    /// the failure is a consequence of the loss (a takeover ends the old
    /// holder's fenced transactions, whose next statement then fails with
    /// `57P01` or a broken connection) and this returns [`Error::Lost`]
    /// instead of `work`'s error. A failed release after the work is
    /// logged, not returned (the lease then ends at its expiry).
    ///
    /// # Cancel safety
    ///
    /// Dropped early, `work` is dropped with it and the lease is released
    /// in the background.
    pub async fn with_lease<T, E, F>(
        &self,
        name: &str,
        how: AcquireOptions,
        work: F,
    ) -> Result<T, E>
    where
        F: AsyncFnOnce(HeldLease) -> Result<T, E>,
        E: From<Error>,
    {
        let held = self.hold(name, how).await?;
        let outcome = {
            let work = work(held.clone());
            tokio::select! {
                biased;
                reason = held.lost() => Err(reason),
                value = work => Ok(value),
            }
        };
        match outcome {
            Ok(value) => {
                // Work that failed because its lease ended (a takeover ends
                // the holder's fenced transactions: its statement fails with
                // 57P01 or a broken connection, before the renewal task has
                // heard of the takeover) reports the loss, not the symptom.
                if value.is_err()
                    && let Some(reason) = held.confirm().await
                {
                    tracing::debug!(name, ?reason, "the work failed after its lease was lost");
                    return Err(held.lost_error(reason).into());
                }
                if let Err(error) = held.release().await {
                    // The work is done; an unreleased lease only delays the
                    // next holder until it expires.
                    tracing::warn!(name, %error, "could not release the lease after the work");
                }
                value
            }
            Err(reason) => Err(held.lost_error(reason).into()),
        }
    }
}
