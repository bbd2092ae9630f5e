//! `pglease share GROUP --partitions M --ttl D -- CMD`: a member of a lease
//! group, running CMD once for each partition it owns, as a worker pool
//! spread over hosts.
//!
//! Each partition owned has a worker task: it starts CMD (with the
//! partition's lease in its environment), starts it again when it exits
//! by itself, and stops it when told to (the partition revoked or lost, or
//! `share` ending). A revoked partition is handed over once its CMD has
//! exited: the worker drops the [`Revoke`] then. A partition assigned
//! again starts its CMD only once the earlier one has exited.

use std::collections::BTreeMap;
use std::io;
use std::process::{ExitCode, ExitStatus};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use pglease::{GroupEvent, GroupMember, GroupOptions, HeldLease, LeaseManager, Revoke, Token};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Asked, not_acquired};
use crate::args::ShareArgs;
use crate::child::{Child, LeaseEnv, StopSignals, signalled};
use crate::exit::{self, Outcome};
use crate::output::{human, note, short};
use crate::sidecar::board::{Board, Phase};
use crate::sidecar::metrics;

/// The longest wait for the group to be left once every CMD has stopped
/// (the database may be unreachable: the partitions then move when their
/// leases expire).
const LEAVE_LIMIT: Duration = Duration::from_secs(10);

/// What every worker needs, the same for all.
struct Common {
    cmd: Vec<String>,
    group: String,
    member: String,
    database_url: Option<String>,
    grace: Duration,
    restart_delay: Duration,
    /// Cancelled by a second signal: every CMD is killed at once.
    kill: CancellationToken,
    reports: mpsc::UnboundedSender<Report>,
    /// What `--http` reports.
    board: Arc<Board>,
}

/// What a worker is told: stop CMD.
struct Stop {
    /// SIGTERM now, SIGKILL at this instant if CMD has not exited.
    deadline: Instant,
    /// The partition's revoke, answered (dropped) once CMD has exited.
    revoke: Option<Revoke>,
}

/// What a worker tells `share`.
enum Report {
    /// CMD could not be started (for partition k).
    CannotStart(u32, io::Error),
}

/// A partition's worker, while its partition is owned.
struct Worker {
    token: Token,
    stop: mpsc::UnboundedSender<Stop>,
    handle: JoinHandle<()>,
}

/// Why `share` ends.
enum Ending {
    /// A stop signal: leave, exit 0.
    Signal,
    /// CMD cannot be started: leave, exit 127.
    CannotStart,
    /// The member stopped by itself (it could not join again): why is
    /// `leave`'s answer.
    Stopped,
}

/// `pglease share`: joins the group, runs CMD per partition owned until a
/// signal, then stops every CMD and leaves.
pub(crate) async fn share(
    manager: &LeaseManager,
    database_url: Option<&str>,
    args: ShareArgs,
    board: Arc<Board>,
) -> Outcome {
    // Signals are watched from the start, so that none is lost while
    // joining.
    let Some(mut signals) = StopSignals::watch() else {
        return Ok(ExitCode::from(exit::DATABASE));
    };
    let mut options = GroupOptions::partitions(args.partitions)
        .ttl(args.ttl)
        .grace(args.grace);
    if let Some(member) = &args.member {
        options = options.member(member.clone());
    }
    let asked = Asked {
        manager,
        limit: None,
        exclusive: true,
    };
    let mut member = tokio::select! {
        joined = manager.join(&args.group, options) => match joined {
            Ok(member) => member,
            Err(e) => return not_acquired(asked, e, "share").await,
        },
        signal = signals.next() => {
            eprintln!(
                "pglease: interrupted before joining group {:?}; no command ran",
                args.group
            );
            return Ok(ExitCode::from(signalled(signal)));
        }
    };
    board.joined(member.group(), member.member(), member.watch_membership());
    note!(
        "pglease: joined group {:?} as member {:?} ({} partitions)",
        member.group(),
        member.member(),
        args.partitions
    );
    let (reports, mut reported) = mpsc::unbounded_channel();
    let common = Arc::new(Common {
        cmd: args.cmd.clone(),
        group: member.group().to_owned(),
        member: member.member().to_owned(),
        database_url: database_url.map(str::to_owned),
        grace: args.grace,
        restart_delay: args.restart_delay,
        kill: CancellationToken::new(),
        reports,
        board,
    });
    let mut pool = Pool {
        common: Arc::clone(&common),
        workers: BTreeMap::new(),
        stopping: BTreeMap::new(),
    };
    let ending = loop {
        tokio::select! {
            event = member.next_event() => match event {
                Some(event) => pool.on_event(event),
                None => break Ending::Stopped,
            },
            Some(Report::CannotStart(k, e)) = reported.recv() => {
                eprintln!(
                    "pglease: cannot start {:?} for partition {k}: {e}; stopping every command \
                     and leaving the group",
                    args.cmd[0]
                );
                break Ending::CannotStart;
            }
            signal = signals.next() => {
                note!(
                    "pglease: {signal}: stopping every command (SIGTERM, then SIGKILL after {}; \
                     a second signal kills them), then leaving the group",
                    human(args.grace)
                );
                break Ending::Signal;
            }
        }
    };
    common.board.set_phase(Phase::Stopping);
    pool.stop_all(&mut signals).await;
    leave(member, ending).await
}

/// Leaves the group once every CMD has stopped; how `share` exits.
async fn leave(member: GroupMember, ending: Ending) -> Outcome {
    let group = member.group().to_owned();
    let left = tokio::time::timeout(LEAVE_LIMIT, member.leave()).await;
    match (ending, left) {
        (Ending::Stopped, Ok(Err(e))) => Err((e, "share")),
        (Ending::Stopped, _) => {
            eprintln!("pglease: the membership of group {group:?} ended");
            Ok(ExitCode::from(exit::DATABASE))
        }
        (ending, left) => {
            match left {
                Ok(Ok(())) => note!("pglease: left group {group:?}"),
                Ok(Err(e)) => eprintln!(
                    "pglease: could not leave group {group:?} ({e}); its partitions move when \
                     their leases expire"
                ),
                Err(_) => eprintln!(
                    "pglease: no answer when leaving group {group:?}; its partitions move when \
                     their leases expire"
                ),
            }
            Ok(match ending {
                Ending::CannotStart => ExitCode::from(exit::CANNOT_START),
                _ => ExitCode::SUCCESS,
            })
        }
    }
}

/// The workers of the partitions owned, and those still stopping.
struct Pool {
    common: Arc<Common>,
    workers: BTreeMap<u32, Worker>,
    /// Workers told to stop, by partition: a partition assigned again
    /// starts its CMD once this one has ended.
    stopping: BTreeMap<u32, JoinHandle<()>>,
}

impl Pool {
    fn on_event(&mut self, event: GroupEvent) {
        match event {
            GroupEvent::Assigned { partition, lease } => {
                note!(
                    "pglease: assigned partition {partition} of {:?} (token {})",
                    self.common.group,
                    lease.token()
                );
                self.common.board.owns(partition, &lease);
                self.start(partition, lease);
            }
            GroupEvent::Revoking(revoke) => {
                let k = revoke.partition();
                self.common.board.disowns(k);
                let deadline = Instant::from_std(revoke.deadline());
                match self.workers.get(&k) {
                    Some(worker) => note!(
                        "pglease: revoking partition {k} (token {}): stopping its command \
                         (SIGTERM, then SIGKILL after {}), then handing it over",
                        worker.token,
                        short(deadline.saturating_duration_since(Instant::now()))
                    ),
                    None => note!("pglease: revoking partition {k}: handing it over"),
                }
                self.stop(k, deadline, Some(revoke));
            }
            GroupEvent::Lost { partition, reason } => {
                self.common.board.disowns(partition);
                let token = self
                    .workers
                    .get(&partition)
                    .map_or(String::new(), |w| format!(" (token {})", w.token));
                eprintln!(
                    "pglease: lost partition {partition}{token}: {reason}; stopping its command \
                     (SIGTERM, then SIGKILL after {})",
                    human(self.common.grace)
                );
                self.stop(partition, Instant::now() + self.common.grace, None);
            }
            _ => {}
        }
    }

    /// Starts partition `k`'s worker, after the CMD of its earlier
    /// ownership, if any, has ended.
    fn start(&mut self, k: u32, lease: HeldLease) {
        if self.workers.contains_key(&k) {
            self.stop(k, Instant::now() + self.common.grace, None);
        }
        let previous = self.stopping.remove(&k);
        let (stop, stops) = mpsc::unbounded_channel();
        let token = lease.token();
        let handle = tokio::spawn(work(Arc::clone(&self.common), k, lease, previous, stops));
        self.workers.insert(
            k,
            Worker {
                token,
                stop,
                handle,
            },
        );
    }

    /// Tells partition `k`'s worker to stop its CMD (`revoke` answered
    /// once it has); without a worker, `revoke` is answered at once.
    fn stop(&mut self, k: u32, deadline: Instant, revoke: Option<Revoke>) {
        match self.workers.remove(&k) {
            Some(worker) => {
                // A worker that has ended drops the revoke with the message.
                let _ = worker.stop.send(Stop { deadline, revoke });
                self.stopping.insert(k, worker.handle);
            }
            None => drop(revoke),
        }
    }

    /// Stops every CMD (SIGTERM, SIGKILL after the grace; at once on a
    /// second signal) and waits for every worker to end.
    async fn stop_all(&mut self, signals: &mut StopSignals) {
        let deadline = Instant::now() + self.common.grace;
        let ks: Vec<u32> = self.workers.keys().copied().collect();
        for k in ks {
            self.stop(k, deadline, None);
        }
        for (_, mut handle) in std::mem::take(&mut self.stopping) {
            loop {
                tokio::select! {
                    _ = &mut handle => break,
                    signal = signals.next(), if !self.common.kill.is_cancelled() => {
                        note!("pglease: {signal} again: killing every command (SIGKILL)");
                        self.common.kill.cancel();
                    }
                }
            }
        }
    }
}

/// Partition `k`'s worker: once `previous` (the worker of its earlier
/// ownership) has ended, runs CMD under `lease`, again after each exit,
/// until told to stop; then stops CMD and answers the revoke.
async fn work(
    common: Arc<Common>,
    k: u32,
    lease: HeldLease,
    previous: Option<JoinHandle<()>>,
    mut stops: mpsc::UnboundedReceiver<Stop>,
) {
    if let Some(previous) = previous {
        let _ = previous.await;
    }
    let name = lease.name().to_owned();
    let env = LeaseEnv {
        leases: vec![(&name, lease.token())],
        shared: false,
        holder: &common.member,
        value: None,
        database_url: common.database_url.as_deref(),
        declare: false,
        extra: vec![
            ("PGLEASE_GROUP", common.group.clone()),
            ("PGLEASE_MEMBER", common.member.clone()),
            ("PGLEASE_PARTITION", k.to_string()),
        ],
    };
    let mut starts = 0_u32;
    let stop = loop {
        // Told to stop meanwhile (during the restart delay's last moment,
        // or before the previous CMD ended): CMD does not start.
        if let Ok(stop) = stops.try_recv() {
            break stop;
        }
        let mut child = match Child::spawn(&common.cmd, &env, false) {
            Ok(child) => {
                metrics::cmd_started(common.board.kind(), starts > 0);
                child
            }
            Err(e) => {
                let _ = common.reports.send(Report::CannotStart(k, e));
                break stops.recv().await.unwrap_or(Stop {
                    deadline: Instant::now(),
                    revoke: None,
                });
            }
        };
        starts += 1;
        let told = tokio::select! {
            status = child.wait() => {
                said_exit(k, &status, common.restart_delay, starts);
                None
            }
            stop = stops.recv() => Some(stop.unwrap_or(Stop {
                deadline: Instant::now() + common.grace,
                revoke: None,
            })),
        };
        if let Some(stop) = told {
            let status = stop_child(&mut child, stop.deadline, &common.kill).await;
            say_stopped(k, &status, stop.revoke.is_some());
            break stop;
        }
        tokio::select! {
            () = tokio::time::sleep(common.restart_delay) => {}
            stop = stops.recv() => break stop.unwrap_or(Stop {
                deadline: Instant::now(),
                revoke: None,
            }),
        }
    };
    // Answered now: CMD has exited.
    drop(stop);
    stops.close();
    while let Ok(later) = stops.try_recv() {
        drop(later);
    }
}

/// Says that partition `k`'s CMD exited by itself, and when it starts
/// again (its `restart`th restart).
fn said_exit(k: u32, status: &io::Result<ExitStatus>, delay: Duration, restart: u32) {
    let how = match status {
        Ok(status) => describe(*status),
        Err(e) => format!("could not be waited for ({e})"),
    };
    eprintln!(
        "pglease: partition {k}: the command {how}; starting it again in {} (restart {restart})",
        human(delay)
    );
}

/// Says that partition `k`'s CMD was stopped, and whether the partition
/// is handed over now.
fn say_stopped(k: u32, status: &io::Result<ExitStatus>, handing: bool) {
    let how = match status {
        Ok(status) => describe(*status),
        Err(e) => format!("could not be waited for ({e})"),
    };
    let then = if handing {
        "; handing the partition over"
    } else {
        ""
    };
    note!("pglease: partition {k}: the command {how}{then}");
}

/// `exited with status N`, or `was killed by SIGNAL`.
fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(signal) => format!("ended by {signal}"),
            Err(_) => format!("ended by signal {signal}"),
        },
        (None, None) => "ended".to_owned(),
    }
}

/// Stops CMD: SIGTERM, SIGKILL at `deadline` (at once if `kill` is
/// cancelled meanwhile); then what is left of its group.
async fn stop_child(
    child: &mut Child,
    deadline: Instant,
    kill: &CancellationToken,
) -> io::Result<ExitStatus> {
    let group = child.group();
    let grace = deadline.saturating_duration_since(Instant::now());
    let status = tokio::select! {
        status = child.stop(Signal::SIGTERM, grace) => status,
        () = kill.cancelled() => {
            group.signal(Signal::SIGKILL);
            child.wait().await
        }
    };
    group.signal(Signal::SIGKILL);
    status
}
