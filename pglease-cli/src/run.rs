//! `pglease run`: hold a lease while a command runs.

use std::process::{ExitCode, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use pglease::{AcquireOptions, HeldLease, LeaseManager};
use tokio::signal::unix::{SignalKind, signal};

use crate::commands::{announced, not_acquired};
use crate::{EXIT_CANNOT_START, EXIT_DATABASE, EXIT_LOST, Outcome, note};

/// The exit status that reports `status` of CMD: its code, or 128+N for
/// signal N.
fn child_code(status: std::process::ExitStatus) -> ExitCode {
    ExitCode::from(status_number(status))
}

/// [`child_code`] as a number.
pub(crate) fn status_number(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
        (None, None) => 1,
    }
}

fn signal_group(pgid: Pid, signal: Signal) {
    // The group may already be gone; nothing else to do then.
    let _ = killpg(pgid, signal);
}

/// The durations of `run`, each with its own role.
pub(crate) struct RunTiming {
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    pub(crate) grace: Duration,
    pub(crate) timeout: Option<Duration>,
    pub(crate) min_hold: Option<Duration>,
    pub(crate) limit: Option<u32>,
}

/// Exit status when CMD ran out of `--timeout` (as timeout(1)).
const EXIT_TIMED_OUT: u8 = 124;

pub(crate) async fn run(
    manager: &LeaseManager,
    database_url: &Option<String>,
    name: &str,
    holder: &str,
    timing: RunTiming,
    cmd: &[String],
) -> Outcome {
    let RunTiming {
        ttl,
        wait,
        grace,
        timeout,
        min_hold,
        limit,
    } = timing;
    // Signals are watched from the start, so that none is lost while
    // waiting for the lease.
    let Some((mut sigterm, mut sigint, mut sighup)) = stop_signals() else {
        return Ok(ExitCode::from(EXIT_DATABASE));
    };
    // The first attempt, and the wait if one is allowed. A signal ends
    // either at once (also while an attempt is stuck in the database) and
    // CMD never starts; the server abandons an attempt still waiting in it
    // once this process has exited (see `ABANDON_WHEN_GONE`).
    let acquisition = announced(name, wait, |wait| {
        let how = AcquireOptions::ttl(ttl).holder(holder).wait(wait);
        manager.hold(
            name,
            match limit {
                Some(limit) => how.limit(limit),
                None => how,
            },
        )
    });
    let held: HeldLease = tokio::select! {
        held = acquisition => match held {
            Ok(held) => held,
            Err(e) => return not_acquired(e, "run"),
        },
        _ = sigterm.recv() => return interrupted(name, 15),
        _ = sigint.recv() => return interrupted(name, 2),
        _ = sighup.recv() => return interrupted(name, 1),
    };
    // After the database's decision: a minimum hold counted from here ends
    // no earlier than acquisition + min_hold on the database clock.
    let acquired = tokio::time::Instant::now();

    let mut command = tokio::process::Command::new(&cmd[0]);
    command
        .args(&cmd[1..])
        .process_group(0)
        .stdin(Stdio::inherit())
        // The lease held: NAME, or with --limit the slot NAME#k.
        .env("PGLEASE_NAME", held.name())
        .env("PGLEASE_TOKEN", held.token().to_string())
        .env("PGLEASE_HOLDER", holder);
    if let Some(url) = database_url {
        command.env("PGLEASE_DATABASE_URL", url);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("pglease: cannot start {:?}: {e}", cmd[0]);
            let _ = held.release().await;
            return Ok(ExitCode::from(EXIT_CANNOT_START));
        }
    };
    let Some(pgid) = child.id().map(|id| Pid::from_raw(id as i32)) else {
        let _ = held.release().await;
        return Ok(ExitCode::from(EXIT_CANNOT_START));
    };

    // Wait for CMD, whatever else happens meanwhile: a lost lease stops it
    // (SIGTERM, SIGKILL after the grace period); a signal to pglease is
    // forwarded, and a second one kills the group.
    let mut lost: Option<pglease::LossReason> = None;
    let mut forwarded = false;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let out_of_time = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut timed_out = false;
    let status = loop {
        let deadline =
            kill_at.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86400));
        let time_up = out_of_time.unwrap_or(deadline);
        tokio::select! {
            biased;
            status = child.wait() => break status,
            () = tokio::time::sleep_until(time_up), if out_of_time.is_some() && !timed_out && kill_at.is_none() => {
                eprintln!(
                    "pglease: the command ran out of time (--timeout {}); stopping it (SIGTERM, \
                     then SIGKILL after {})",
                    humantime::format_duration(timeout.unwrap_or_default()),
                    humantime::format_duration(grace)
                );
                timed_out = true;
                signal_group(pgid, Signal::SIGTERM);
                kill_at = Some(tokio::time::Instant::now() + grace);
            }
            reason = held.lost(), if lost.is_none() => {
                eprintln!(
                    "pglease: lease {name:?} (token {}) lost: {reason}; stopping the command \
                     (SIGTERM, then SIGKILL after {})",
                    held.token(),
                    humantime::format_duration(grace)
                );
                lost = Some(reason);
                signal_group(pgid, Signal::SIGTERM);
                kill_at = Some(tokio::time::Instant::now() + grace);
            }
            () = tokio::time::sleep_until(deadline), if kill_at.is_some() => {
                signal_group(pgid, Signal::SIGKILL);
                kill_at = None;
            }
            _ = sigterm.recv() => forward(pgid, Signal::SIGTERM, &mut forwarded),
            _ = sigint.recv() => forward(pgid, Signal::SIGINT, &mut forwarded),
            _ = sighup.recv() => forward(pgid, Signal::SIGHUP, &mut forwarded),
        }
    };
    if lost.is_some() || timed_out {
        // Members of the group that outlived its leader go too.
        signal_group(pgid, Signal::SIGKILL);
    }
    let keep = min_hold
        .filter(|_| lost.is_none())
        .and_then(|hold| hold.checked_sub(acquired.elapsed()))
        .filter(|left| *left >= Duration::from_micros(1));
    match keep {
        Some(left) => expire_after(held, left).await,
        // After a loss the lease is gone or about to end: try to give it
        // back, but do not wait long for a database that may be down.
        None if lost.is_some() => release_after(held, RELEASE_AFTER_LOSS).await,
        None => release_after(held, RELEASE_LIMIT).await,
    }
    if lost.is_some() {
        return Ok(ExitCode::from(EXIT_LOST));
    }
    if timed_out {
        return Ok(ExitCode::from(EXIT_TIMED_OUT));
    }
    match status {
        Ok(status) => Ok(child_code(status)),
        Err(e) => {
            eprintln!("pglease: lost track of the command: {e}; killed its process group");
            signal_group(pgid, Signal::SIGKILL);
            Ok(ExitCode::from(1))
        }
    }
}

/// SIGTERM, SIGINT and SIGHUP, watched from now on; `None` (said on
/// stderr) if they cannot be.
pub(crate) fn stop_signals() -> Option<(SignalStream, SignalStream, SignalStream)> {
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(term), Ok(int), Ok(hup)) => Some((term, int, hup)),
        _ => {
            eprintln!("pglease: cannot watch for signals");
            None
        }
    }
}

/// A stream of one kind of signal.
type SignalStream = tokio::signal::unix::Signal;

/// A signal before CMD started: exit 128 + the signal's number.
fn interrupted(name: &str, signal: u8) -> Outcome {
    eprintln!("pglease: interrupted before {name:?} was acquired; the command did not run");
    Ok(ExitCode::from(128 + signal))
}

/// Forwards `signal` to CMD's group; a second signal kills the group.
fn forward(pgid: Pid, signal: Signal, forwarded: &mut bool) {
    if *forwarded {
        signal_group(pgid, Signal::SIGKILL);
    } else {
        signal_group(pgid, signal);
        *forwarded = true;
    }
}

/// The minimum hold: the lease is left to expire `left` from now instead of
/// being released.
async fn expire_after(held: HeldLease, left: Duration) {
    let name = held.name().to_owned();
    match tokio::time::timeout(Duration::from_secs(10), held.expire_in(left)).await {
        Ok(Ok(expires_at)) => note!(
            "pglease: keeping {name:?} until {} (--min-hold)",
            expires_at.to_rfc3339()
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

async fn release_after(held: HeldLease, limit: Duration) {
    let name = held.name().to_owned();
    match tokio::time::timeout(limit, held.release()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => eprintln!("pglease: could not release {name:?} ({e}); it ends at its expiry"),
        Err(_) => eprintln!("pglease: no answer to the release of {name:?}; it ends at its expiry"),
    }
}
