//! Lease groups on the manager: joining one, and reading one.

use super::LeaseManager;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::group::{self, GroupMember, GroupOptions, GroupStatus};

impl LeaseManager {
    /// Joins lease group `group` (creating it with
    /// [`GroupOptions::partitions`] partitions on first use) and returns
    /// the membership, whose events say which partitions this member owns.
    /// The group's members share its partitions evenly: each of N members
    /// owns M/N, rounded up or down, once membership has settled; a
    /// partition that must move to another member is revoked first
    /// ([`GroupEvent::Revoking`](crate::GroupEvent::Revoking)), then handed
    /// over under a new token, so the old owner's late writes are refused.
    /// Every lease (the membership, each partition) is renewed with the
    /// manager's other leases, in one statement per period.
    ///
    /// ```no_run
    /// # async fn f(leases: pglease::LeaseManager) -> Result<(), pglease::Error> {
    /// use std::time::Duration;
    /// use pglease::{GroupEvent, GroupOptions};
    ///
    /// let mut member = leases
    ///     .join("outbox", GroupOptions::partitions(16).ttl(Duration::from_secs(10)))
    ///     .await?;
    /// while let Some(event) = member.next_event().await {
    ///     match event {
    ///         GroupEvent::Assigned { partition, lease } => { /* start partition's work */ }
    ///         GroupEvent::Revoking(revoke) => { /* stop its work */ revoke.done() }
    ///         GroupEvent::Lost { partition, reason } => { /* stop its work */ }
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad group or member name, a partition
    /// count out of range or different from the group's, or timing the
    /// TTL does not allow; [`Error::NotPermitted`] if the group's names are
    /// under another role's name grant; [`Error::Held`] if another process
    /// is this member now; [`Error::ShutDown`] after
    /// [`LeaseManager::shutdown`]; [`Error::Database`] or
    /// [`Error::Timeout`] if the join failed.
    ///
    /// # Cancel safety
    ///
    /// Dropped before it returns, a membership it got is released in the
    /// background (it owned no partition yet).
    pub async fn join(&self, group: &str, options: GroupOptions) -> Result<GroupMember> {
        let setup = group::member::Setup {
            context: self.shared.context.clone(),
            registry: self.shared.registry.clone(),
            keepalive: self.keepalive.clone(),
        };
        group::join(setup, group, options).await
    }

    /// Lease group `group` now: its partition count, live members, and
    /// each partition's valid owner (database clock).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name or a group that does not
    /// exist; [`Error::NotPermitted`] if its names are under another
    /// role's name grant; [`Error::Database`] if the read failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn group(&self, group: &str) -> Result<GroupStatus> {
        group::status(self.pool(), group).await
    }
}
