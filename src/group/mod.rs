//! Lease groups: members sharing a group's partitions, each partition an
//! ordinary fenced lease, balanced among the live members and handed
//! over, not stolen, when it must move.
//!
//! [`LeaseManager::join`](crate::LeaseManager::join) makes this process a
//! member and returns a [`GroupMember`], whose events say which
//! partitions it owns: [`GroupEvent::Assigned`] with the partition's
//! [`HeldLease`] (fence writes with it as with any lease),
//! [`GroupEvent::Revoking`] when the partition must move to another
//! member (finish the current work, then call [`Revoke::done`]; at the
//! grace's end it moves anyway, and the old token is refused from then
//! on), and [`GroupEvent::Lost`] when a partition's lease was lost.
//!
//! Which partition goes where is decided by each member from the same
//! read of the group (`assign.rs`: balanced, sticky, a join moves only
//! what the newcomer should own); `plan.rs` turns a read into what one
//! member does; `member.rs` is the member's task.

mod assign;
pub(crate) mod member;
mod plan;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use crate::error::{Error, LossReason, Result};
use crate::hold::HeldLease;
use crate::limits::{MAX_NAME_BYTES, MAX_PARTITIONS, check_text};
use crate::options::AcquireOptions;
use crate::token::Token;

pub(crate) use member::join;

/// The default TTL of a member's leases.
const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// The default grace of a revoked partition's owner.
const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// The lease name of partition `partition` of group `group`:
/// `GROUP/PARTITION`. Protect a table with it, or fence a write under it,
/// as with any lease name.
pub fn partition_name(group: &str, partition: u32) -> String {
    format!("{group}/{partition}")
}

/// The lease name of member `member`'s membership of group `group`:
/// `GROUP/members/MEMBER`.
pub fn member_name(group: &str, member: &str) -> String {
    format!("{group}/members/{member}")
}

/// How to join a lease group (see
/// [`LeaseManager::join`](crate::LeaseManager::join)).
///
/// ```
/// use std::time::Duration;
/// use pglease::GroupOptions;
///
/// let options = GroupOptions::partitions(16)
///     .ttl(Duration::from_secs(10))
///     .grace(Duration::from_secs(5))
///     .member("relay-1");
/// ```
#[derive(Debug, Clone)]
pub struct GroupOptions {
    partitions: u32,
    ttl: Duration,
    grace: Duration,
    member: Option<String>,
}

impl GroupOptions {
    /// A group of `partitions` partitions (1 to
    /// [`MAX_PARTITIONS`](crate::limits::MAX_PARTITIONS)), numbered from 0.
    /// The first member to join creates the group with this count; every
    /// other member must join with the same one.
    pub fn partitions(partitions: u32) -> GroupOptions {
        GroupOptions {
            partitions,
            ttl: DEFAULT_TTL,
            grace: DEFAULT_GRACE,
            member: None,
        }
    }

    /// The TTL of the membership and of every partition lease (default
    /// 10 s): a member that stops renewing is gone, and its partitions
    /// move, this long after its last renewal.
    pub fn ttl(mut self, ttl: Duration) -> GroupOptions {
        self.ttl = ttl;
        self
    }

    /// How long a revoked partition's owner may finish its work before
    /// the partition moves anyway (default 5 s).
    pub fn grace(mut self, grace: Duration) -> GroupOptions {
        self.grace = grace;
        self
    }

    /// This member's name, unique in the group (default: the default
    /// holder name, `HOST:PID`, and a number counting this process's
    /// joins).
    pub fn member(mut self, member: impl Into<String>) -> GroupOptions {
        self.member = Some(member.into());
        self
    }

    /// The partition count.
    pub fn get_partitions(&self) -> u32 {
        self.partitions
    }

    /// The TTL.
    pub fn get_ttl(&self) -> Duration {
        self.ttl
    }

    /// The grace.
    pub fn get_grace(&self) -> Duration {
        self.grace
    }

    /// Checks a join of `group` as this says, before anything is sent;
    /// the member name.
    fn check(&self, group: &str) -> Result<String> {
        check_text("group", group)?;
        if !(1..=MAX_PARTITIONS).contains(&self.partitions) {
            return Err(Error::invalid(
                "partitions",
                format!("must be 1 to {MAX_PARTITIONS}, got {}", self.partitions),
            ));
        }
        crate::limits::check_duration("grace", self.grace)?;
        let member = match &self.member {
            Some(member) => member.clone(),
            None => default_member(),
        };
        check_text("member", &member)?;
        for name in [
            member_name(group, &member),
            partition_name(group, self.partitions - 1),
        ] {
            if name.len() > MAX_NAME_BYTES {
                return Err(Error::invalid(
                    "group",
                    format!(
                        "makes the lease name {name:?}, {} bytes long; the limit is \
                         {MAX_NAME_BYTES} bytes",
                        name.len()
                    ),
                ));
            }
        }
        Ok(member)
    }
}

/// `HOST:PID#N`, N counting this process's joins, trimmed from the front
/// to the name limit.
fn default_member() -> String {
    static JOINS: AtomicU64 = AtomicU64::new(0);
    let n = JOINS.fetch_add(1, Ordering::Relaxed) + 1;
    let mut member = format!("{}#{n}", AcquireOptions::default_holder());
    while member.len() > MAX_NAME_BYTES / 2 {
        member.remove(0);
    }
    member
}

/// What happened to one of a member's partitions.
#[derive(Debug)]
#[non_exhaustive]
pub enum GroupEvent {
    /// The member owns `partition` now, under `lease` (renewed in the
    /// background with the manager's other leases).
    Assigned {
        /// The partition number.
        partition: u32,
        /// Its lease: fence the partition's writes with it.
        lease: HeldLease,
    },
    /// The partition must move to another member: finish or abandon its
    /// work, then call [`Revoke::done`] (or drop the `Revoke`). It moves at
    /// the grace's end in any case; from then on its lease's token is
    /// refused.
    Revoking(Revoke),
    /// The partition's lease was lost (it expired, was taken over, or
    /// the membership itself was lost): stop its work.
    Lost {
        /// The partition number.
        partition: u32,
        /// Why.
        reason: LossReason,
    },
}

/// A partition being revoked (see [`GroupEvent::Revoking`]).
#[derive(Debug)]
pub struct Revoke {
    partition: u32,
    token: Token,
    deadline: std::time::Instant,
    done: mpsc::UnboundedSender<(usize, Token)>,
}

impl Revoke {
    /// The partition number.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// When the partition moves even if its work has not finished.
    pub fn deadline(&self) -> std::time::Instant {
        self.deadline
    }

    /// The partition's work has finished: hand it over now. Dropping the
    /// `Revoke` says the same.
    pub fn done(self) {}
}

impl Drop for Revoke {
    fn drop(&mut self) {
        // The member's task may have ended: nothing to tell then.
        let _ = self.done.send((self.partition as usize, self.token));
    }
}

/// What the caller asks of the member's task.
pub(crate) enum Command {
    /// Leave the group, revoking every partition with its grace.
    Leave,
    /// Leave, and answer here once the member has stopped.
    LeaveAndTell(oneshot::Sender<Result<()>>),
}

/// This process's membership of a lease group, from
/// [`LeaseManager::join`](crate::LeaseManager::join).
///
/// Read its events with [`GroupMember::next_event`]. To leave, either
/// call [`GroupMember::begin_leave`] and keep reading events (each
/// partition is revoked with its grace) until `None`, or call
/// [`GroupMember::leave`] once the partitions' work has stopped. Dropping
/// it leaves the group in the background, as `leave` does.
#[derive(Debug)]
pub struct GroupMember {
    group: String,
    member: String,
    events: mpsc::UnboundedReceiver<GroupEvent>,
    commands: mpsc::UnboundedSender<Command>,
    /// Why the member's task stopped, once it has, if not by leaving.
    stopped: Arc<Mutex<Option<Error>>>,
    /// The membership lease held now.
    membership: watch::Receiver<Option<HeldLease>>,
}

impl GroupMember {
    /// The group's name.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// This member's name.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// The membership lease held now (the lease `GROUP/members/MEMBER`),
    /// or `None` while the member joins again after losing it, and once
    /// it has stopped. Its [`HeldLease::renewal_health`] says whether the
    /// member's renewals (which renew its partitions in the same
    /// statement) are confirmed; a sidecar's health check reads it. The
    /// lease is the member's: do not release it, leave instead.
    pub fn membership(&self) -> Option<HeldLease> {
        self.membership.borrow().clone()
    }

    /// Every change of [`GroupMember::membership`], as a watch channel
    /// (a joining again is a change).
    pub fn watch_membership(&self) -> watch::Receiver<Option<HeldLease>> {
        self.membership.clone()
    }

    /// The next event, or `None` once the member has stopped: it left, the
    /// manager shut down, or it could not join again after losing its
    /// membership ([`GroupMember::leave`] then says why).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: an event is removed only when it is returned.
    pub async fn next_event(&mut self) -> Option<GroupEvent> {
        self.events.recv().await
    }

    /// Starts leaving the group: every partition it owns is revoked
    /// ([`GroupEvent::Revoking`], with the grace), then handed over to the
    /// member that should own it, and the membership ends; then
    /// [`GroupMember::next_event`] answers `None`. Partitions are no
    /// longer assigned to it meanwhile.
    pub fn begin_leave(&self) {
        // The task may have stopped already: then there is nothing to leave.
        let _ = self.commands.send(Command::Leave);
    }

    /// Leaves the group at once: every partition it owns is handed over
    /// to the member that should own it now (their revokes count as done:
    /// stop the partitions' work first), then the membership ends.
    ///
    /// # Errors
    ///
    /// The error the member stopped with, if it had stopped (it could not
    /// join again after losing its membership: [`Error::NotPermitted`],
    /// [`Error::InvalidInput`]), or [`Error::ShutDown`] if the manager
    /// shut down first (which released everything).
    ///
    /// # Cancel safety
    ///
    /// Dropped before it returns, the member goes on leaving in the
    /// background.
    pub async fn leave(self) -> Result<()> {
        let GroupMember {
            mut events,
            commands,
            stopped,
            ..
        } = self;
        let (reply, outcome) = oneshot::channel();
        if commands.send(Command::LeaveAndTell(reply)).is_err() {
            return Err(crate::sync::lock(&stopped)
                .take()
                .unwrap_or(Error::ShutDown));
        }
        drop(commands);
        // Each revoke is answered by being dropped.
        let drain = async move { while events.recv().await.is_some() {} };
        let (outcome, ()) = tokio::join!(outcome, drain);
        outcome.unwrap_or(Err(Error::ShutDown))
    }
}

/// A lease group now, on the database clock (see
/// [`LeaseManager::group`](crate::LeaseManager::group)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GroupStatus {
    /// The group's name.
    pub name: String,
    /// Its partition count.
    pub partitions: u32,
    /// Its live members, by name.
    pub members: Vec<MemberStatus>,
    /// Each partition's valid owner, by partition number (`None`: free).
    pub owners: Vec<Option<PartitionStatus>>,
}

/// One lease group in [`Admin::groups`](crate::Admin::groups).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GroupSummary {
    /// The group's name.
    pub name: String,
    /// Its partition count.
    pub partitions: u32,
    /// Its live members.
    pub members: u32,
    /// Its partitions with a valid owner.
    pub owned: u32,
    /// The role that created it (it may change the partition count).
    pub created_by: String,
    /// When it was created.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// A live member of a lease group.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MemberStatus {
    /// Its name.
    pub name: String,
    /// Its membership lease's token.
    pub token: Token,
    /// How long its membership stays valid unless renewed.
    pub remaining: Duration,
    /// The partitions it owns now.
    pub owns: Vec<u32>,
}

/// A partition's valid owner.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PartitionStatus {
    /// The owner's member name.
    pub member: String,
    /// The partition lease's token.
    pub token: Token,
    /// How long the lease stays valid unless renewed.
    pub remaining: Duration,
    /// Handed over to `member`, which has not picked it up yet.
    pub handed: bool,
}

/// Group `group` now.
pub(crate) async fn status(pool: &sqlx::PgPool, group: &str) -> Result<GroupStatus> {
    check_text("group", group)?;
    let read = member::read(pool, group, true).await?;
    let owners: Vec<Option<PartitionStatus>> = read
        .owners
        .unwrap_or_default()
        .into_iter()
        .map(|o| {
            o.map(|o| PartitionStatus {
                member: o.member,
                token: Token::issued(o.token),
                remaining: o.remaining,
                handed: o.handed,
            })
        })
        .collect();
    let members = read
        .members
        .into_iter()
        .map(|m| MemberStatus {
            owns: owners
                .iter()
                .enumerate()
                .filter(|(_, o)| o.as_ref().is_some_and(|o| o.member == m.name))
                .map(|(k, _)| k as u32)
                .collect(),
            name: m.name,
            token: Token::issued(m.token),
            remaining: m.remaining,
        })
        .collect();
    Ok(GroupStatus {
        name: group.to_owned(),
        partitions: read.partitions as u32,
        members,
        owners,
    })
}
