//! The one-statement operations on leases, on the manager's pool:
//! renew, release, hand over, inspect, fence. Each is one round trip.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::LeaseManager;
use crate::db;
use crate::error::{Error, Result};
use crate::fencing::{self, FencedTransaction};
use crate::lease::{Fence, LeaseStatus, ListFilter, interval};
use crate::limits::{check_text, check_value};
use crate::options::WithoutSuccessor;
use crate::token::Token;

impl LeaseManager {
    /// Extends the lease to database-now + `ttl`, and returns the new
    /// expiry (database clock). Renewal is keyed on (name, token), so a
    /// retry after a lost answer succeeds while the lease is still valid.
    /// A [`HeldLease`](crate::HeldLease) is renewed in the background; this
    /// is for leases held by hand.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if the token is no longer valid (expired, released,
    /// or taken over; or [`LossReason::Forgotten`](crate::LossReason::Forgotten):
    /// the database failed over or was restored and does not know the
    /// acquisition; the reason says which); [`Error::NotHeld`] for a
    /// token the lease never had (`NotIssued`, `NeverAcquired`);
    /// [`Error::InvalidInput`] for a bad `ttl` (nothing sent);
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the renewal may or may not commit; either way the
    /// lease stays valid until the later of the two expiries.
    pub async fn renew(&self, lease: impl AsRef<Fence>, ttl: Duration) -> Result<DateTime<Utc>> {
        let ttl = interval(ttl)?;
        db::renew(self.context(), lease.as_ref(), ttl).await
    }

    /// Publishes `value` with the lease (at most
    /// [`MAX_VALUE_BYTES`](crate::limits::MAX_VALUE_BYTES); `None` clears it), for
    /// anyone to read in the status view ([`LeaseStatus::value`]): a
    /// leader's address, say. Only the current holder can: the update is
    /// keyed on (name, token) and decided on the database clock, like a
    /// renewal. The value stays after a release or expiry, until the next
    /// acquisition, which starts without one (or with its own,
    /// [`AcquireOptions::value`](crate::AcquireOptions::value)).
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if the token is no longer valid (nothing changed;
    /// with [`LossReason::Forgotten`](crate::LossReason::Forgotten) for an
    /// acquisition the database forgot in a failover or a restore);
    /// [`Error::NotHeld`] for a token the lease never had;
    /// [`Error::InvalidInput`] for a value that is too long or holds a NUL
    /// byte (nothing sent); [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the value may or may not be published: call it
    /// again (it is idempotent).
    pub async fn set_value(&self, lease: impl AsRef<Fence>, value: Option<&str>) -> Result<()> {
        if let Some(value) = value {
            check_value(value)?;
        }
        db::set_value(self.pool(), lease.as_ref(), value).await
    }

    /// Asks the current holder of `name` to step down, on behalf of `by`
    /// (a candidate or an operator): the request is shown in the status
    /// view ([`LeaseStatus::step_down_requested_by`]) and reported to
    /// observers, and an [`Elector`](crate::elect::Elector) that leads hears it
    /// ([`Elector::step_down_requested`](crate::elect::Elector::step_down_requested)).
    /// It changes nothing else: a holder that ignores it keeps the lease.
    /// Returns the token of the acquisition asked, or `None` if nobody
    /// holds the lease.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name or requester (nothing sent);
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the request may or may not be made: call it
    /// again (a repeated request changes only its time).
    #[tracing::instrument(name = "pglease.request_step_down", level = "debug", skip(self))]
    pub async fn request_step_down(&self, name: &str, by: &str) -> Result<Option<Token>> {
        check_text("name", name)?;
        check_text("requested_by", by)?;
        db::request_step_down(self.pool(), name, by).await
    }

    /// Ends the lease at once, and wakes acquirers waiting for it.
    ///
    /// Returns `true` if this call ended it, `false` if the lease had
    /// already ended under that token (released, expired, or taken over:
    /// the token is stale). A delayed duplicate release carrying an older
    /// token never ends a newer acquisition, also when the holder name is
    /// the same.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] for a token the lease never had
    /// ([`NotHeldReason::NotIssued`](crate::NotHeldReason::NotIssued), or
    /// [`NotHeldReason::NeverAcquired`](crate::NotHeldReason::NeverAcquired)):
    /// a mistake, not an ended lease (nothing changed); [`Error::Lost`]
    /// with [`LossReason::Forgotten`](crate::LossReason::Forgotten) for an
    /// acquisition the database forgot in a failover or a restore;
    /// [`Error::Database`] if the database cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the release may or may not commit; call it again
    /// (it is idempotent) or let the lease expire.
    pub async fn release(&self, lease: impl AsRef<Fence>) -> Result<bool> {
        db::release_checked(self.context(), lease.as_ref()).await
    }

    /// Hands `lease` over to `successor` for `ttl`, in one step: when a
    /// holder named `successor` waits in the lease's line (an acquisition
    /// with [`AcquireOptions::fair`](crate::AcquireOptions::fair) and
    /// [`holder`](crate::AcquireOptions::holder) `successor`), the lease
    /// gets a new token and that waiter gets the lease at once (its
    /// acquisition returns it), and `lease`'s token is refused from now on:
    /// the holder's fenced transactions still open are ended first (their
    /// commits fail), so nothing is written under it after the move.
    /// Returns the successor's token.
    ///
    /// When no such holder waits, `otherwise` decides, and the call returns
    /// `None`: with [`WithoutSuccessor::Release`] the lease is released, as
    /// [`release`](LeaseManager::release) would (its token is refused and
    /// its fenced transactions ended, as above); with
    /// [`WithoutSuccessor::Keep`] nothing is changed, its fenced
    /// transactions are not ended, and it stays valid under its token
    /// (what a mistyped successor should cost: nothing). See
    /// docs/design.md, "Handover".
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad successor or TTL (nothing sent);
    /// [`Error::NotHeld`] if the lease is not held under its token;
    /// [`Error::NotPermitted`] for another role's lease;
    /// [`Error::Database`] with SQLSTATE 55P03 during a grant delay or when
    /// a fenced transaction cannot be ended.
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the handover may or may not commit: read the
    /// lease ([`inspect`](LeaseManager::inspect)) to know.
    pub async fn hand_over(
        &self,
        lease: impl AsRef<Fence>,
        successor: &str,
        ttl: Duration,
        otherwise: WithoutSuccessor,
    ) -> Result<Option<Token>> {
        let fence = lease.as_ref();
        check_hand_over(fence, successor)?;
        let ttl = crate::lease::interval(ttl)?;
        let or_release = otherwise == WithoutSuccessor::Release;
        db::hand_over(self.pool(), fence, successor, &ttl, or_release).await
    }

    /// Whether [`hand_over`](LeaseManager::hand_over) would hand `lease`
    /// over to `successor` now (it waits in the lease's line): a read,
    /// what an [`Elector`](crate::elect::Elector) that leads and prefers a
    /// candidate asks every second. Its errors are those of `hand_over`
    /// but 55P03; cancel-safe (it only reads).
    pub(crate) async fn successor_waits(
        &self,
        lease: impl AsRef<Fence>,
        successor: &str,
    ) -> Result<bool> {
        let fence = lease.as_ref();
        check_hand_over(fence, successor)?;
        db::successor_waits(self.pool(), fence, successor).await
    }

    /// The status of lease `name`; a name never acquired is reported with
    /// no holder and no token.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name (nothing sent);
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn inspect(&self, name: &str) -> Result<LeaseStatus> {
        check_text("name", name)?;
        db::inspect(self.pool(), name).await
    }

    /// Who waits in line for lease `name` (first come, first served, see
    /// [`AcquireOptions::fair`](crate::AcquireOptions::fair)), from the
    /// front: ended places (their waiter's session gone, or not kept
    /// within their TTL) are left out. Needs SELECT on `pglease.line`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name (nothing sent);
    /// [`Error::NotPermitted`] without SELECT on the view;
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn line(&self, name: &str) -> Result<Vec<crate::LinePlace>> {
        check_text("name", name)?;
        crate::wait::places(&self.shared.context, name).await
    }

    /// The status of the leases `filter` keeps (every lease ever acquired
    /// with [`ListFilter::default()`]), ordered by name, filtered and
    /// limited in the database (one statement).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a prefix with a NUL byte (nothing
    /// sent); [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    #[tracing::instrument(name = "pglease.list", level = "debug", skip(self))]
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<LeaseStatus>> {
        if filter.get_prefix().is_some_and(|p| p.contains('\0')) {
            return Err(Error::invalid(
                "prefix",
                "must not contain NUL bytes (PostgreSQL text cannot store them)",
            ));
        }
        db::list(self.pool(), filter).await
    }

    /// Separate-resource fencing: records `token` for `resource` and
    /// returns `true` iff it is at least the highest token seen there.
    ///
    /// This detects a stale token only after a newer one was seen: an
    /// expired lease whose token is still the highest is accepted.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad `resource`; [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the mark may or may not have moved: call it again
    /// with the same token (a token equal to the highest is accepted).
    #[tracing::instrument(name = "pglease.admit", level = "debug", skip(self), fields(token = token.get()))]
    pub async fn admit(&self, resource: &str, token: Token) -> Result<bool> {
        check_text("resource", resource)?;
        db::admit(self.pool(), resource, token).await
    }

    /// Begins a transaction and declares `lease` in it
    /// ([`assert_held`](crate::assert_held)): its writes can commit only
    /// while the lease is held under that token. `BEGIN` and the check go
    /// to the server together, in one round trip.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] (after rolling back) unless the token is current
    /// and unexpired on the database clock; [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, its connection is closed
    /// rather than returned to the pool, and the server rolls the
    /// transaction back (at once, or within `client_connection_check_interval`
    /// while the check waits for a lock; [`pool_options`](crate::connect::pool_options)
    /// sets it to 1 s).
    #[tracing::instrument(name = "pglease.begin_fenced", level = "debug", skip_all,
                          fields(name = lease.as_ref().name(), token = lease.as_ref().token().get()))]
    pub async fn begin_fenced(&self, lease: impl AsRef<Fence>) -> Result<FencedTransaction> {
        fencing::begin(self.pool(), lease.as_ref()).await
    }

    /// Runs `work` in a fenced transaction for `lease`, committing if it
    /// returns `Ok` and rolling back if it returns `Err`.
    ///
    /// # Errors
    ///
    /// `work`'s error, or the errors of [`LeaseManager::begin_fenced`] and
    /// [`FencedTransaction::commit`] converted into `E`.
    ///
    /// # Cancel safety
    ///
    /// Dropped before the commit is sent, the transaction rolls back.
    pub async fn fenced<T, E, F>(&self, lease: impl AsRef<Fence>, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
        E: From<Error>,
    {
        let mut tx = self.begin_fenced(lease).await?;
        match work(&mut tx).await {
            Ok(value) => {
                tx.commit().await?;
                Ok(value)
            }
            Err(e) => {
                // The caller's error is the one worth reporting; a failed
                // rollback leaves nothing committed either way.
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }
}

/// What a handover checks before anything is sent: a successor's name, and
/// an exclusive holder's fence (a shared holder's term is its own alone).
pub(crate) fn check_hand_over(fence: &Fence, successor: &str) -> Result<()> {
    check_text("successor", successor)?;
    if fence.is_shared() {
        return Err(crate::error::Error::invalid(
            "shared",
            "a shared holder's lease cannot be handed over",
        ));
    }
    Ok(())
}
