//! `pglease run NAME... --ttl D -- CMD`: hold a lease (or every lease of
//! a set) while a command runs, like `flock` across hosts.

use std::io;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use nix::sys::signal::Signal;
use pglease::{AcquireOptions, Error, HeldLease, LeaseManager, LossReason, Token};
use tokio::time::Instant;

use super::{Asked, announced, first_of, not_acquired};
use crate::args::RunArgs;
use crate::child::{Child, Forwarding, Group, LeaseEnv, StopSignals, signalled, status_number};
use crate::exit::{self, Outcome};
use crate::output::{human, note};
use crate::sidecar::board::{Board, Phase};
use crate::sidecar::metrics;

/// Why CMD is being stopped.
enum Stopping {
    TimedOut,
    /// Which lease (name, token) was lost, and why.
    Lost(String, Token, LossReason),
}

impl Stopping {
    /// Says why CMD is being stopped, and how.
    fn announce(&self, args: &RunArgs) {
        let grace = human(args.grace);
        match self {
            Stopping::TimedOut => eprintln!(
                "pglease: the command ran out of time (--timeout {}); stopping it \
                 (SIGTERM, then SIGKILL after {grace})",
                human(args.timeout.unwrap_or_default()),
            ),
            Stopping::Lost(name, token, reason) => eprintln!(
                "pglease: lease {name:?} (token {token}) lost: {reason}; stopping the command \
                 (SIGTERM, then SIGKILL after {grace})",
            ),
        }
    }
}

/// `pglease run`: holds the lease (every lease of the set, or none) while
/// CMD runs, stops CMD when a lease is lost or CMD runs out of time, then
/// releases the leases (or leaves them to expire at the end of
/// `--min-hold`).
pub(crate) async fn run(
    manager: &LeaseManager,
    database_url: Option<&str>,
    args: RunArgs,
    board: &Board,
) -> Outcome {
    let holder = args
        .holder
        .clone()
        .unwrap_or_else(AcquireOptions::default_holder);
    // Signals are watched from the start, so that none is lost while
    // waiting for the lease.
    let Some(mut signals) = StopSignals::watch() else {
        return Ok(ExitCode::from(exit::DATABASE));
    };
    let held = match acquire(manager, &args, &holder, &mut signals).await {
        Ok(held) => held,
        Err(outcome) => return outcome,
    };
    // After the database's decision: a minimum hold counted from here ends
    // no earlier than acquisition + min_hold on the database clock.
    let acquired = Instant::now();
    let lease = LeaseEnv {
        leases: held.iter().map(|h| (h.name(), h.token())).collect(),
        shared: args.shared,
        holder: &holder,
        value: None,
        database_url,
        declare: args.declare,
        extra: Vec::new(),
    };
    board.hold(Phase::Running, &held);
    let mut child = match Child::spawn(&args.cmd, &lease, true) {
        Ok(child) => {
            metrics::cmd_started(board.kind(), false);
            child
        }
        Err(e) => {
            board.set_phase(Phase::Stopping);
            eprintln!("pglease: cannot start {:?}: {e}", args.cmd[0]);
            release_after(held, RELEASE_AFTER_LOSS).await;
            return Ok(ExitCode::from(exit::CANNOT_START));
        }
    };
    let group = child.group();
    let (status, stopped) = match supervise(&mut child, &held, &mut signals, args.timeout).await {
        // CMD ended after the lease was lost, before the loss was seen (this
        // process was frozen, say, and resumed with it): what CMD did after
        // the loss was not under the lease, whatever its status says.
        Ok(status) => match lost_by_now(&held) {
            Some(lost) => {
                if let Stopping::Lost(name, token, reason) = &lost {
                    eprintln!(
                        "pglease: lease {name:?} (token {token}) was lost before the command \
                         ended ({reason}); exiting 4 whatever its status"
                    );
                }
                // What is left of CMD's group goes, as after a stop.
                group.signal(Signal::SIGKILL);
                (status, Some(lost))
            }
            None => (status, None),
        },
        Err(stopping) => {
            board.set_phase(Phase::Stopping);
            stopping.announce(&args);
            (
                stop(&mut child, &mut signals, args.grace).await,
                Some(stopping),
            )
        }
    };
    board.set_phase(Phase::Stopping);
    let lost = matches!(stopped, Some(Stopping::Lost(..)));
    match kept_for(args.min_hold, acquired.elapsed(), lost) {
        Some(left) => expire_after(held, left).await,
        // After a loss that lease is gone or about to end: try to give the
        // set back, but do not wait long for a database that may be down.
        None if lost => release_after(held, RELEASE_AFTER_LOSS).await,
        None => release_after(held, RELEASE_LIMIT).await,
    }
    Ok(match stopped {
        Some(Stopping::Lost(..)) => ExitCode::from(exit::LOST),
        Some(Stopping::TimedOut) => ExitCode::from(exit::TIMED_OUT),
        None => exited(status, group),
    })
}

/// The first attempt, and the wait if one is allowed; how `run` ends if
/// the leases were not acquired. The held leases come in the order their
/// names were given. A signal ends either at once (also while an attempt
/// is stuck in the database) and CMD never starts; the server abandons an
/// attempt still waiting in it once this process has exited (see
/// `pglease::connect::pool_options`).
async fn acquire(
    manager: &LeaseManager,
    args: &RunArgs,
    holder: &str,
    signals: &mut StopSignals,
) -> Result<Vec<HeldLease>, Outcome> {
    let asked = Asked {
        manager,
        limit: args.limit,
        exclusive: !args.shared,
    };
    let acquisition = announced(asked, args.wait, |wait| async move {
        let mut how = AcquireOptions::ttl(args.ttl)
            .holder(holder)
            .wait(wait)
            .session_bound(args.session_bound)
            .fair(args.fair)
            .shared(args.shared);
        if let Some(n) = args.max_waiting {
            how = how.max_waiting(n);
        }
        match (&args.names[..], args.limit) {
            ([name], Some(limit)) => Ok(vec![manager.hold(name, how.limit(limit)).await?]),
            ([name], None) => Ok(vec![manager.hold(name, how).await?]),
            (names, _) => {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let mut held = manager.hold_all(&names, how).await?;
                held.sort_by_key(|h| names.iter().position(|n| *n == h.name()));
                Ok(held)
            }
        }
    });
    let positions = report_positions(manager, args, holder);
    tokio::select! {
        held = acquisition => match held {
            Ok(held) => Ok(held),
            Err(e) => Err(not_acquired(asked, e, "run").await),
        },
        () = positions => unreachable!("the position report never ends"),
        signal = signals.next() => {
            eprintln!(
                "pglease: interrupted before {} was acquired; the command did not run",
                args.quoted()
            );
            Err(Ok(ExitCode::from(signalled(signal))))
        }
    }
}

/// With `--fair` and `--wait`: says on stderr where this run stands in the
/// line of its first name each time that changes ("2nd of 3 in line"),
/// reading `pglease.line` twice a second. Never completes; stops reading
/// (silently) if the view cannot be read.
async fn report_positions(manager: &LeaseManager, args: &RunArgs, holder: &str) {
    if args.fair && !args.wait.is_zero() {
        let name = &args.names[0];
        let mut last = None;
        while let Ok(line) = manager.line(name).await {
            let place = line
                .iter()
                .find(|p| p.holder == holder)
                .map(|p| (p.position, line.len()));
            if let (Some((position, waiting)), true) = (place, place != last) {
                note!(
                    "pglease: {name:?}: {} of {waiting} in line",
                    ordinal(position)
                );
            }
            last = place;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    std::future::pending().await
}

/// 1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st, ...
fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// Waits for CMD, whatever else happens meanwhile: a signal to pglease is
/// forwarded (a second one kills the group); running out of time
/// (`timeout`) or losing any of the leases ends the wait, to stop CMD.
async fn supervise(
    child: &mut Child,
    held: &[HeldLease],
    signals: &mut StopSignals,
    timeout: Option<Duration>,
) -> Result<io::Result<ExitStatus>, Stopping> {
    let group = child.group();
    let mut forwarding = Forwarding::default();
    let out_of_time = timeout.map(|t| Instant::now() + t);
    let report = first_of(held.iter().map(super::report_renewals));
    tokio::pin!(report);
    let lost = first_of(held.iter().map(HeldLease::lost));
    tokio::pin!(lost);
    loop {
        tokio::select! {
            biased;
            status = child.wait() => return Ok(status),
            () = sleep_until(out_of_time) => return Err(Stopping::TimedOut),
            (i, reason) = &mut lost => {
                return Err(Stopping::Lost(held[i].name().to_owned(), held[i].token(), reason));
            }
            signal = signals.next() => forwarding.forward(group, signal),
            _ = &mut report => {}
        }
    }
}

/// The first of the leases found lost now (its local deadline passed, or
/// the renewal task said so), if any.
fn lost_by_now(held: &[HeldLease]) -> Option<Stopping> {
    held.iter().find_map(|h| {
        h.loss_reason()
            .map(|reason| Stopping::Lost(h.name().to_owned(), h.token(), reason))
    })
}

/// Stops CMD: SIGTERM, then SIGKILL after `grace` (at once if a signal
/// comes meanwhile); then the members of its group that outlived it.
async fn stop(
    child: &mut Child,
    signals: &mut StopSignals,
    grace: Duration,
) -> io::Result<ExitStatus> {
    let group = child.group();
    let status = tokio::select! {
        status = child.stop(Signal::SIGTERM, grace) => status,
        _ = signals.next() => {
            group.signal(Signal::SIGKILL);
            child.wait().await
        }
    };
    group.signal(Signal::SIGKILL);
    status
}

/// How long the lease is still to be kept after CMD, which ran for
/// `held_for` since the acquisition: the rest of `--min-hold`, unless the
/// lease was lost (or less than a microsecond is left).
fn kept_for(min_hold: Option<Duration>, held_for: Duration, lost: bool) -> Option<Duration> {
    min_hold
        .filter(|_| !lost)
        .and_then(|hold| hold.checked_sub(held_for))
        .filter(|left| *left >= Duration::from_micros(1))
}

/// The exit code of CMD that exited by itself: its own, or 1 (with its
/// group killed) if pglease lost track of it.
fn exited(status: io::Result<ExitStatus>, group: Group) -> ExitCode {
    match status {
        Ok(status) => ExitCode::from(status_number(status)),
        Err(e) => {
            eprintln!("pglease: lost track of the command: {e}; killed its process group");
            group.signal(Signal::SIGKILL);
            ExitCode::from(1)
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The minimum hold: the leases are left to expire `left` from now instead
/// of being released.
async fn expire_after(held: Vec<HeldLease>, left: Duration) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for lease in held {
        expire_one(lease, left, deadline).await;
    }
}

async fn expire_one(held: HeldLease, left: Duration, deadline: Instant) {
    let name = held.name().to_owned();
    match tokio::time::timeout_at(deadline, held.expire_in(left)).await {
        Ok(Ok(expires_at)) => note!(
            "pglease: keeping {name:?} {} (--min-hold)",
            crate::output::from_now(expires_at)
        ),
        Ok(Err(e)) => eprintln!("pglease: could not keep {name:?} for --min-hold ({e})"),
        Err(_) => eprintln!(
            "pglease: no answer when keeping {name:?} for --min-hold; it ends at its expiry"
        ),
    }
}

/// The longest wait for the final release after CMD ended.
const RELEASE_LIMIT: Duration = Duration::from_secs(10);
/// The same after the lease was lost (the database may be unreachable).
const RELEASE_AFTER_LOSS: Duration = Duration::from_secs(2);

/// Releases the leases one after the other, waiting at most `limit` for
/// all the answers.
async fn release_after(held: Vec<HeldLease>, limit: Duration) {
    let deadline = Instant::now() + limit;
    for lease in held {
        release_one(lease, deadline).await;
    }
}

async fn release_one(held: HeldLease, deadline: Instant) {
    let name = held.name().to_owned();
    match tokio::time::timeout_at(deadline, held.release()).await {
        // Lost (the database forgot the acquisition): said already.
        Ok(Ok(_) | Err(Error::Lost { .. })) => {}
        Ok(Err(e)) => eprintln!("pglease: could not release {name:?} ({e}); it ends at its expiry"),
        Err(_) => eprintln!("pglease: no answer to the release of {name:?}; it ends at its expiry"),
    }
}
