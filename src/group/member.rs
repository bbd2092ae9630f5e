//! A member's task: it reads its group, takes what the plan gives it,
//! revokes and hands over what the plan moves, and tells its
//! [`GroupMember`] each change. The decisions are `plan.rs`'s; this file
//! only carries them out.
//!
//! Statements: besides the renewals (the manager's batch, one statement
//! per period for every lease it holds), a member sends one read of its
//! group when a membership could have expired (the soonest of the other
//! members' expiries), or when a join, a leave or a handover to it is
//! notified; while it waits for a handover, at most one read a renewal
//! period (every [`UNSETTLED_LOOK`] without notifications); one take per round (at most [`MAX_TAKE`] partitions),
//! and after a take that missed some, another read from 25 to 50 ms
//! later, backing off to 2 s while they keep being missed; one statement
//! per [`MAX_TAKE`] partitions handed over or released at once. A read names the owners only when the
//! members changed since the last full read, a notification came, a
//! partition was lost, or the member is not settled.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::types::PgInterval;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::DropGuard;

use super::plan::{self, Live, Owner, Read};
use super::{Command, GroupEvent, GroupMember, GroupOptions, Revoke, member_name, partition_name};
use crate::backoff;
use crate::context::Context;
use crate::error::{Error, LossReason, Result};
use crate::hold::{self, HeldLease, Registry};
use crate::lease::{Lease, interval};
use crate::limits::MAX_TAKE;
use crate::notify::Topic;
use crate::options::Timing;
use crate::sql;
use crate::token::Token;

/// The longest a member that waits for a handover waits between reads
/// without notifications (behind a pooler). With them, a handover to it
/// is notified, and it reads once a renewal period as a fallback.
const UNSETTLED_LOOK: Duration = Duration::from_millis(250);

/// How soon a member reads again when its read showed free partitions
/// that the target gives another member (doubling while they stay free,
/// up to a renewal period).
const UNOWNED_LOOK: Duration = Duration::from_millis(100);

/// Added to an expiry the member waits for, so that the read comes after
/// it on the database clock.
const EXPIRY_MARGIN: Duration = Duration::from_millis(5);

/// What a member's task needs of its manager.
pub(crate) struct Setup {
    pub(crate) context: Arc<Context>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) keepalive: Arc<DropGuard>,
}

/// Joins `group` as `options` say and starts the member's task.
pub(crate) async fn join(setup: Setup, group: &str, options: GroupOptions) -> Result<GroupMember> {
    let me = options.check(group)?;
    let pg_ttl = interval(options.ttl)?;
    let timing = setup.context.options.timing(options.ttl)?;
    let _busy = setup.context.background.token();
    if setup.context.is_shut_down() {
        return Err(Error::ShutDown);
    }
    let (events, events_rx) = mpsc::unbounded_channel();
    let (commands, commands_rx) = mpsc::unbounded_channel();
    let (done, done_rx) = mpsc::unbounded_channel();
    let (lost, lost_rx) = mpsc::unbounded_channel();
    let (shown, membership) = watch::channel(None);
    let mut task = Task {
        setup,
        group: group.to_owned(),
        me: me.clone(),
        partitions: options.partitions,
        grace: options.grace,
        timing,
        pg_ttl,
        membership: None,
        held: BTreeMap::new(),
        revoking: BTreeMap::new(),
        leaving: false,
        replies: Vec::new(),
        last: None,
        need_full: true,
        events,
        commands: commands_rx,
        done,
        done_rx,
        lost,
        lost_rx,
        shown,
    };
    task.membership = Some(task.join_once().await?);
    task.show_membership();
    let stopped = Arc::new(std::sync::Mutex::new(None));
    tokio::spawn(task.run(Arc::clone(&stopped)));
    Ok(GroupMember {
        group: group.to_owned(),
        member: me,
        events: events_rx,
        commands,
        stopped,
        membership,
    })
}

struct Task {
    setup: Setup,
    group: String,
    me: String,
    partitions: u32,
    grace: Duration,
    timing: Timing,
    pg_ttl: PgInterval,
    membership: Option<HeldLease>,
    held: BTreeMap<usize, HeldLease>,
    /// Partitions revoked and not handed over yet, with their deadline.
    revoking: BTreeMap<usize, Instant>,
    leaving: bool,
    replies: Vec<tokio::sync::oneshot::Sender<Result<()>>>,
    /// The last read with owners.
    last: Option<Read>,
    need_full: bool,
    events: mpsc::UnboundedSender<GroupEvent>,
    commands: mpsc::UnboundedReceiver<Command>,
    done: mpsc::UnboundedSender<(usize, Token)>,
    done_rx: mpsc::UnboundedReceiver<(usize, Token)>,
    /// The membership as [`GroupMember::membership`] shows it.
    shown: watch::Sender<Option<HeldLease>>,
    lost: mpsc::UnboundedSender<(usize, Token)>,
    lost_rx: mpsc::UnboundedReceiver<(usize, Token)>,
}

/// What woke the member.
enum Wake {
    Stop,
    Look,
    Lost(usize, Token),
    Done(usize, Token),
    Command(Option<Command>),
    Membership,
}

impl Task {
    fn context(&self) -> &Context {
        &self.setup.context
    }

    /// One statement, bounded by the renewal timeout.
    async fn send<T>(
        &self,
        operation: &'static str,
        work: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let limit = self.context().options.get_renew_timeout();
        self.count();
        tokio::time::timeout(limit, work)
            .await
            .unwrap_or(Err(Error::Timeout {
                operation,
                after: Some(limit),
            }))
    }

    /// Counts one statement of this member (`ManagerStats::group_statements`).
    fn count(&self) {
        self.context()
            .counters
            .group_statements
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Joins (or joins again): the membership lease, renewed in the
    /// background. [`Error::Held`] while another process is this member.
    async fn join_once(&self) -> Result<HeldLease> {
        let name = member_name(&self.group, &self.me);
        let statement = sql::join_group(&self.group, &self.me, self.partitions, &self.pg_ttl);
        let sent = Instant::now();
        let row = self
            .send("join", async {
                Ok(sql::query(statement)
                    .fetch_one(&self.context().pool)
                    .await?)
            })
            .await?;
        let token: Option<i64> = row.try_get("token")?;
        let expires_at: DateTime<Utc> = row.try_get("expires_at")?;
        let Some(token) = token else {
            let holder: Option<String> = row.try_get("holder")?;
            return Err(Error::Held {
                name,
                holder: holder.unwrap_or_default(),
                expires_at,
            });
        };
        let checked_at: DateTime<Utc> = row.try_get("checked_at")?;
        let lease = Lease::new(
            &name,
            self.me.clone(),
            Token::issued(token),
            expires_at,
            checked_at,
        );
        Ok(self.register(lease, sent))
    }

    fn register(&self, lease: Lease, sent: Instant) -> HeldLease {
        hold::register(
            &self.setup.context,
            &self.setup.registry,
            &self.setup.keepalive,
            lease,
            sent,
            self.timing,
            self.pg_ttl,
        )
    }

    /// The group now: owners too when `full`.
    async fn read(&self, full: bool) -> Result<Read> {
        self.send(
            "read the group",
            read(&self.context().pool, &self.group, full),
        )
        .await
    }

    /// Reads the group, with owners when they are needed (the members
    /// changed since the last full read, or something said to).
    async fn look(&mut self) -> Result<Read> {
        if !self.need_full
            && let Some(last) = &self.last
        {
            let now = self.read(false).await?;
            if plan::same_members(last, &now) {
                return Ok(now);
            }
        }
        let read = self.read(true).await?;
        self.need_full = false;
        self.last = Some(read.clone());
        Ok(read)
    }

    /// Takes `partitions` (at most [`MAX_TAKE`] at once) and tells of each.
    async fn take(&mut self, partitions: &[usize]) -> Result<()> {
        let Some(membership) = &self.membership else {
            return Ok(());
        };
        let member_token = membership.token();
        for chunk in partitions.chunks(MAX_TAKE) {
            let statement =
                sql::take_partitions(&self.group, &self.me, member_token, chunk, &self.pg_ttl);
            let sent = Instant::now();
            let rows = self
                .send("take partitions", async {
                    Ok(sql::query(statement)
                        .fetch_all(&self.context().pool)
                        .await?)
                })
                .await?;
            crate::telemetry::group_moves(&self.group, "taken", rows.len());
            for row in &rows {
                let k: i32 = row.try_get("partition")?;
                let token: i64 = row.try_get("token")?;
                let expires_at: DateTime<Utc> = row.try_get("expires_at")?;
                let acquired_at: DateTime<Utc> = row.try_get("acquired_at")?;
                let Ok(k) = usize::try_from(k) else { continue };
                let name = partition_name(&self.group, k as u32);
                let lease = Lease::new(
                    &name,
                    self.me.clone(),
                    Token::issued(token),
                    expires_at,
                    acquired_at,
                );
                let held = self.register(lease, sent);
                self.watch_loss(k, &held);
                self.held.insert(k, held.clone());
                crate::telemetry::group_partitions(&self.group, self.held.len());
                let _ = self.events.send(GroupEvent::Assigned {
                    partition: k as u32,
                    lease: held,
                });
            }
        }
        Ok(())
    }

    /// Forwards the loss of partition `k`'s lease to the task.
    fn watch_loss(&self, k: usize, held: &HeldLease) {
        let loss = held.loss_token();
        let token = held.token();
        let lost = self.lost.clone();
        tokio::spawn(async move {
            loss.cancelled().await;
            let _ = lost.send((k, token));
        });
    }

    /// Revokes partitions `ks`: tells the caller, who answers with
    /// [`Revoke::done`]; a caller that no longer listens is done at once.
    fn revoke(&mut self, ks: &[usize]) {
        let now = Instant::now();
        for &k in ks {
            let Some(held) = self.held.get(&k) else {
                continue;
            };
            self.revoking.insert(k, now + self.grace);
            let revoke = Revoke {
                partition: k as u32,
                token: held.token(),
                deadline: (now + self.grace).into_std(),
                done: self.done.clone(),
            };
            // A caller gone drops the event, which answers done.
            let _ = self.events.send(GroupEvent::Revoking(revoke));
        }
    }

    /// Hands over every revoked partition in `ks` to the member the
    /// target gives it now (read afresh), or releases it.
    async fn hand_over(&mut self, ks: &[usize]) {
        let read = match self.read(true).await {
            Ok(read) => read,
            Err(error) => {
                tracing::warn!(group = %self.group, %error,
                               "could not read the group to hand partitions over: releasing them");
                Read::default()
            }
        };
        let mut moving = Vec::new();
        for &k in ks {
            self.revoking.remove(&k);
            if let Some(held) = self.held.remove(&k) {
                // Not renewed from here on, whatever the statement's fate.
                held.forget();
                let successor = plan::successor(&read, &self.me, self.leaving, k);
                moving.push((k, held, successor.unwrap_or_default()));
            }
        }
        for chunk in moving.chunks(MAX_TAKE) {
            let partitions: Vec<usize> = chunk.iter().map(|(k, _, _)| *k).collect();
            let tokens: Vec<i64> = chunk.iter().map(|(_, h, _)| h.token().get()).collect();
            let successors: Vec<&str> = chunk.iter().map(|(_, _, s)| s.as_str()).collect();
            let statement = sql::hand_over_partitions(
                &self.group,
                &partitions,
                &tokens,
                &successors,
                &self.pg_ttl,
            );
            let moved = self
                .send("hand partitions over", async {
                    Ok(sql::query(statement)
                        .fetch_all(&self.context().pool)
                        .await?)
                })
                .await;
            match moved {
                Ok(rows) => {
                    let handed = rows
                        .iter()
                        .filter(|row| {
                            row.try_get::<Option<i64>, _>("token")
                                .ok()
                                .flatten()
                                .is_some()
                        })
                        .count();
                    crate::telemetry::group_moves(&self.group, "handed_over", handed);
                    crate::telemetry::group_moves(&self.group, "released", rows.len() - handed);
                }
                Err(error) => {
                    tracing::warn!(group = %self.group, ?partitions, %error,
                                   "could not hand the partitions over: releasing them in the background");
                    for (_, held, _) in chunk {
                        self.context().release_in_background(held.as_ref());
                    }
                }
            }
        }
        crate::telemetry::group_partitions(&self.group, self.held.len());
        self.need_full = true;
    }

    /// Shows the membership held now to [`GroupMember::membership`], if it
    /// changed.
    fn show_membership(&self) {
        let now = self.membership.as_ref().map(HeldLease::token);
        self.shown.send_if_modified(|shown| {
            let changed = shown.as_ref().map(HeldLease::token) != now;
            if changed {
                shown.clone_from(&self.membership);
            }
            changed
        });
    }

    /// The membership was lost: every partition goes with it (held, they
    /// would keep the others from taking them), and the member joins again.
    fn membership_lost(&mut self) {
        let reason = self
            .membership
            .take()
            .and_then(|m| m.loss_reason())
            .unwrap_or(LossReason::Expired);
        self.show_membership();
        tracing::warn!(group = %self.group, member = %self.me, ?reason,
                       "lost the group membership: giving up its partitions and joining again");
        self.revoking.clear();
        for (k, held) in std::mem::take(&mut self.held) {
            // Dropped: released in the background.
            drop(held);
            let _ = self.events.send(GroupEvent::Lost {
                partition: k as u32,
                reason: reason.clone(),
            });
        }
        crate::telemetry::group_partitions(&self.group, 0);
        self.need_full = true;
    }

    async fn run(mut self, stopped: Arc<std::sync::Mutex<Option<Error>>>) {
        let outcome = self.serve().await;
        self.membership = None;
        self.show_membership();
        match &outcome {
            Err(Error::ShutDown) | Ok(()) => {}
            Err(error) => {
                tracing::warn!(group = %self.group, member = %self.me, %error,
                               "the group member stopped");
            }
        }
        // A leave asked while the member was stopping is answered too.
        while let Ok(command) = self.commands.try_recv() {
            if let Command::LeaveAndTell(reply) = command {
                self.replies.push(reply);
            }
        }
        let mut replies = std::mem::take(&mut self.replies).into_iter();
        match (outcome, replies.next()) {
            (outcome, Some(first)) => {
                let _ = first.send(outcome);
            }
            (Err(error), None) => *crate::sync::lock(&stopped) = Some(error),
            (Ok(()), None) => {}
        }
        for reply in replies {
            let _ = reply.send(Ok(()));
        }
        // Dropping the task ends the events: next_event answers None.
    }

    /// Starts leaving: the others stop counting this member (so that none
    /// hands it a partition while it hands its own over), and the next
    /// plan revokes everything it owns.
    async fn start_leaving(&mut self) {
        if self.leaving {
            return;
        }
        self.leaving = true;
        self.need_full = true;
        let Some(membership) = &self.membership else {
            return;
        };
        let statement = sql::start_leaving(&self.group, &self.me, membership.token());
        let said = self
            .send("start leaving the group", async {
                Ok(sql::query(statement).execute(&self.context().pool).await?)
            })
            .await;
        if let Err(error) = said {
            // The others then go on counting it until it has left.
            tracing::warn!(group = %self.group, %error, "could not say that the member leaves");
        }
    }

    /// Ends the membership, once every partition has been handed over.
    async fn finish_leaving(&mut self) -> Result<()> {
        let Some(membership) = self.membership.take() else {
            return Ok(());
        };
        self.show_membership();
        membership.forget();
        if membership.loss_reason() != Some(LossReason::Released) {
            return Ok(());
        }
        let statement = sql::leave_group(&self.group, &self.me, membership.token());
        let left = self
            .send("leave the group", async {
                Ok(sql::query(statement).execute(&self.context().pool).await?)
            })
            .await;
        if let Err(error) = left {
            // The membership then ends at its expiry.
            tracing::warn!(group = %self.group, %error, "could not leave the group");
        }
        Ok(())
    }

    /// The member's rounds until it leaves or the manager stops.
    async fn serve(&mut self) -> Result<()> {
        let context = Arc::clone(&self.setup.context);
        let stop = context.stop.clone();
        let my_key = member_name(&self.group, &self.me);
        let listener = context.options.get_notify().then(|| context.listener());
        let _watching = listener.map(|l| {
            (
                l.subscribe(Topic::Releases, &self.group),
                l.subscribe(Topic::Releases, &my_key),
            )
        });
        let mut releases = listener.map(|l| l.releases.subscribe());
        let mut commands_open = true;
        let mut failures = 0u32;
        let mut take_misses = 0u32;
        let mut unowned_looks = 0u32;
        loop {
            // Joined, or joining (again).
            let membership_loss = match &self.membership {
                Some(m) if !m.is_lost() => m.loss_token(),
                _ => {
                    if stop.is_cancelled() || context.is_shut_down() {
                        // The manager shut down (which released everything).
                        return Err(Error::ShutDown);
                    }
                    if self.membership.is_some() {
                        self.membership_lost();
                    }
                    if self.leaving {
                        return Ok(());
                    }
                    match self.join_once().await {
                        Ok(m) => {
                            self.membership = Some(m);
                            self.show_membership();
                            failures = 0;
                        }
                        Err(error @ (Error::InvalidInput { .. } | Error::NotPermitted { .. })) => {
                            return Err(error);
                        }
                        Err(error) => {
                            failures += 1;
                            tracing::debug!(group = %self.group, %error, "could not join again yet");
                            tokio::select! {
                                () = stop.cancelled() => return Err(Error::ShutDown),
                                () = tokio::time::sleep(backoff::group_retry(failures)) => {}
                            }
                        }
                    }
                    continue;
                }
            };

            // Read, and do what the plan says.
            let now = Instant::now();
            let mut wake_at = now + self.timing.ttl;
            match self.look().await {
                Ok(read) => {
                    failures = 0;
                    // Joining again uses the group's count as it is now.
                    if let Ok(partitions) = u32::try_from(read.partitions)
                        && partitions > 0
                    {
                        self.partitions = partitions;
                    }
                    let look_in = if read.owners.is_some() {
                        let held: BTreeSet<usize> = self.held.keys().copied().collect();
                        let revoking: BTreeSet<usize> = self.revoking.keys().copied().collect();
                        let plan = plan::plan(&read, &self.me, self.leaving, &held, &revoking);
                        if !plan.take.is_empty()
                            && let Err(error) = self.take(&plan.take).await
                        {
                            tracing::debug!(group = %self.group, %error, "could not take partitions");
                            self.need_full = true;
                        }
                        self.revoke(&plan.revoke);
                        let missed = plan.take.iter().any(|k| !self.held.contains_key(k));
                        if missed {
                            // Another member took one first (from a read
                            // older than ours), or the take failed: read
                            // again shortly, backing off while it lasts.
                            take_misses += 1;
                            self.need_full = true;
                            wake_at = wake_at.min(now + backoff::group_retry(take_misses));
                        } else {
                            take_misses = 0;
                        }
                        if plan.gone > 0 {
                            // The next look (at their expiry) reads the
                            // owners again.
                            self.need_full = true;
                        }
                        if plan.unowned > 0 {
                            // Free partitions another member should take:
                            // if a read of another moment targets them
                            // here, this member takes them then. Soon at
                            // first, then less and less often (up to a
                            // renewal period), so that a large group
                            // waiting for a few partitions does not read
                            // itself to a standstill.
                            unowned_looks += 1;
                            self.need_full = true;
                            let soon =
                                backoff::backoff(UNOWNED_LOOK, unowned_looks, self.timing.period);
                            wake_at = wake_at.min(now + soon);
                        } else {
                            unowned_looks = 0;
                        }
                        if plan.awaited > 0 {
                            // Waiting for a handover: look again soon.
                            self.need_full = true;
                            let soon = if context.is_listening() {
                                self.timing.period
                            } else {
                                UNSETTLED_LOOK
                            };
                            wake_at = wake_at.min(now + soon);
                        }
                        plan.look_in
                    } else {
                        read.members
                            .iter()
                            .filter(|m| m.name != self.me)
                            .map(|m| m.remaining)
                            .min()
                    };
                    if let Some(look_in) = look_in {
                        wake_at = wake_at.min(now + look_in + EXPIRY_MARGIN);
                    }
                }
                Err(error) => {
                    failures += 1;
                    tracing::debug!(group = %self.group, %error, "could not read the group");
                    self.need_full = true;
                    wake_at = now + backoff::group_retry(failures);
                }
            }
            if self.leaving && self.held.is_empty() {
                return self.finish_leaving().await;
            }
            if let Some(first) = self.revoking.values().min() {
                wake_at = wake_at.min(*first);
            }

            // Wait for what comes first.
            let wake = loop {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => break Wake::Stop,
                    () = membership_loss.cancelled() => break Wake::Membership,
                    Some((k, token)) = self.lost_rx.recv() => break Wake::Lost(k, token),
                    Some((k, token)) = self.done_rx.recv() => break Wake::Done(k, token),
                    command = self.commands.recv(), if commands_open => break Wake::Command(command),
                    heard = next_release(&mut releases) => match heard {
                        Ok(Some(name)) if name == self.group || name == my_key => {
                            self.need_full = true;
                            break Wake::Look;
                        }
                        Ok(Some(_)) => {}
                        Ok(None) | Err(broadcast::error::RecvError::Lagged(_)) => {
                            self.need_full = true;
                            break Wake::Look;
                        }
                        Err(broadcast::error::RecvError::Closed) => releases = None,
                    },
                    () = tokio::time::sleep_until(wake_at) => break Wake::Look,
                }
            };
            match wake {
                Wake::Stop => return Err(Error::ShutDown),
                Wake::Membership | Wake::Look => {}
                Wake::Lost(k, token) => {
                    if self.held.get(&k).is_some_and(|h| h.token() == token)
                        && let Some(held) = self.held.remove(&k)
                    {
                        self.revoking.remove(&k);
                        crate::telemetry::group_partitions(&self.group, self.held.len());
                        crate::telemetry::group_moves(&self.group, "lost", 1);
                        let _ = self.events.send(GroupEvent::Lost {
                            partition: k as u32,
                            reason: held.loss_reason().unwrap_or(LossReason::Expired),
                        });
                    }
                    self.need_full = true;
                }
                Wake::Done(k, token) => {
                    let mut ready = vec![(k, token)];
                    while let Ok(more) = self.done_rx.try_recv() {
                        ready.push(more);
                    }
                    let ks: Vec<usize> = ready
                        .into_iter()
                        .filter(|(k, token)| {
                            self.revoking.contains_key(k)
                                && self.held.get(k).is_some_and(|h| h.token() == *token)
                        })
                        .map(|(k, _)| k)
                        .collect();
                    self.hand_over(&ks).await;
                }
                Wake::Command(Some(Command::Leave)) => self.start_leaving().await,
                Wake::Command(Some(Command::LeaveAndTell(reply))) => {
                    self.replies.push(reply);
                    self.start_leaving().await;
                }
                Wake::Command(None) => {
                    // The caller dropped its member: leave.
                    commands_open = false;
                    self.start_leaving().await;
                }
            }
            // Revokes whose grace has run out move now.
            let now = Instant::now();
            let overdue: Vec<usize> = self
                .revoking
                .iter()
                .filter(|&(_, deadline)| *deadline <= now)
                .map(|(&k, _)| k)
                .collect();
            if !overdue.is_empty() {
                tracing::info!(group = %self.group, partitions = ?overdue,
                               "revoked partitions not done within the grace: moving them anyway");
                self.hand_over(&overdue).await;
            }
        }
    }
}

/// Group `group` now (`pglease.group_state`): owners too when `full`.
pub(crate) async fn read(pool: &sqlx::PgPool, group: &str, full: bool) -> Result<Read> {
    let rows = sql::query(sql::group_state(group, full))
        .fetch_all(pool)
        .await?;
    let mut read = Read {
        owners: full.then(Vec::new),
        ..Read::default()
    };
    for row in &rows {
        let kind: String = row.try_get("kind")?;
        let remaining = Duration::from_micros(
            u64::try_from(row.try_get::<Option<i64>, _>("remaining_us")?.unwrap_or(0)).unwrap_or(0),
        );
        match kind.as_str() {
            "group" => {
                let partitions: i32 = row.try_get("partition")?;
                read.partitions = usize::try_from(partitions).unwrap_or(0);
                if let Some(owners) = &mut read.owners {
                    owners.resize(read.partitions, None);
                }
            }
            "member" => read.members.push(Live {
                name: row.try_get("member")?,
                token: row.try_get("token")?,
                remaining,
            }),
            _ => {
                let k: i32 = row.try_get("partition")?;
                if let (Some(owners), Ok(k)) = (&mut read.owners, usize::try_from(k))
                    && k < owners.len()
                {
                    owners[k] = Some(Owner {
                        member: row.try_get("member")?,
                        token: row.try_get("token")?,
                        remaining,
                        handed: row.try_get("handed")?,
                    });
                }
            }
        }
    }
    read.members
        .sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    Ok(read)
}

/// The next notification the listener forwards; never without one.
async fn next_release(
    releases: &mut Option<broadcast::Receiver<Option<String>>>,
) -> std::result::Result<Option<String>, broadcast::error::RecvError> {
    match releases {
        Some(receiver) => receiver.recv().await,
        None => std::future::pending().await,
    }
}
