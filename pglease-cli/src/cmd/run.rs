//! `pglease run NAME --ttl D -- CMD`: hold a lease while a command runs,
//! like `flock` across hosts.

use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::Signal;
use pglease::{AcquireOptions, Error, HeldLease, LeaseManager, LossReason};
use tokio::time::Instant;

use super::{announced, not_acquired};
use crate::args::RunArgs;
use crate::child::{Child, Forwarding, LeaseEnv, StopSignals, signalled, status_number};
use crate::exit::{self, Outcome};
use crate::output::{human, note};

/// Why CMD is being stopped.
enum Stopping {
    TimedOut,
    Lost(LossReason),
}

pub(crate) async fn run(
    manager: &LeaseManager,
    database_url: Option<&str>,
    args: RunArgs,
) -> Outcome {
    let RunArgs {
        name,
        holder,
        ttl,
        wait,
        grace,
        timeout,
        min_hold,
        limit,
        session_bound,
        cmd,
    } = args;
    let holder = holder.unwrap_or_else(AcquireOptions::default_holder);
    // Signals are watched from the start, so that none is lost while
    // waiting for the lease.
    let Some(mut signals) = StopSignals::watch() else {
        return Ok(ExitCode::from(exit::DATABASE));
    };
    // The first attempt, and the wait if one is allowed. A signal ends
    // either at once (also while an attempt is stuck in the database) and
    // CMD never starts; the server abandons an attempt still waiting in it
    // once this process has exited (see `pglease::connect::pool_options`).
    let acquisition = announced(&name, wait, |wait| {
        let how = AcquireOptions::ttl(ttl)
            .holder(&holder)
            .wait(wait)
            .session_bound(session_bound);
        manager.hold(
            &name,
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
        signal = signals.next() => {
            eprintln!("pglease: interrupted before {name:?} was acquired; the command did not run");
            return Ok(ExitCode::from(signalled(signal)));
        }
    };
    // After the database's decision: a minimum hold counted from here ends
    // no earlier than acquisition + min_hold on the database clock.
    let acquired = Instant::now();
    let lease = LeaseEnv {
        name: held.name(),
        token: held.token(),
        holder: &holder,
        value: None,
        database_url,
    };
    let mut child = match Child::spawn(&cmd, &lease, true) {
        Ok(child) => child,
        Err(e) => {
            eprintln!("pglease: cannot start {:?}: {e}", cmd[0]);
            release_after(held, RELEASE_AFTER_LOSS).await;
            return Ok(ExitCode::from(exit::CANNOT_START));
        }
    };
    let group = child.group();

    // Wait for CMD, whatever else happens meanwhile: a signal to pglease
    // is forwarded (a second one kills the group); running out of time or
    // losing the lease stops CMD.
    let mut forwarding = Forwarding::default();
    let out_of_time = timeout.map(|t| Instant::now() + t);
    let ran = {
        let report = super::report_renewals(&held);
        tokio::pin!(report);
        loop {
            tokio::select! {
                biased;
                status = child.wait() => break Ok(status),
                () = sleep_until(out_of_time) => break Err(Stopping::TimedOut),
                reason = held.lost() => break Err(Stopping::Lost(reason)),
                signal = signals.next() => forwarding.forward(group, signal),
                () = &mut report => {}
            }
        }
    };
    let (status, lost, timed_out) = match ran {
        Ok(status) => (status, None, false),
        Err(stopping) => {
            let lost = match stopping {
                Stopping::TimedOut => {
                    eprintln!(
                        "pglease: the command ran out of time (--timeout {}); stopping it \
                         (SIGTERM, then SIGKILL after {})",
                        human(timeout.unwrap_or_default()),
                        human(grace)
                    );
                    None
                }
                Stopping::Lost(reason) => {
                    eprintln!(
                        "pglease: lease {name:?} (token {}) lost: {reason}; stopping the command \
                         (SIGTERM, then SIGKILL after {})",
                        held.token(),
                        human(grace)
                    );
                    Some(reason)
                }
            };
            // A signal meanwhile kills the group at once.
            let status = tokio::select! {
                status = child.stop(Signal::SIGTERM, grace) => status,
                _ = signals.next() => {
                    group.signal(Signal::SIGKILL);
                    child.wait().await
                }
            };
            // Members of the group that outlived its leader go too.
            group.signal(Signal::SIGKILL);
            let timed_out = lost.is_none();
            (status, lost, timed_out)
        }
    };
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
        return Ok(ExitCode::from(exit::LOST));
    }
    if timed_out {
        return Ok(ExitCode::from(exit::TIMED_OUT));
    }
    match status {
        Ok(status) => Ok(ExitCode::from(status_number(status))),
        Err(e) => {
            eprintln!("pglease: lost track of the command: {e}; killed its process group");
            group.signal(Signal::SIGKILL);
            Ok(ExitCode::from(1))
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
        // Lost (the database forgot the acquisition): said already.
        Ok(Ok(_) | Err(Error::Lost { .. })) => {}
        Ok(Err(e)) => eprintln!("pglease: could not release {name:?} ({e}); it ends at its expiry"),
        Err(_) => eprintln!("pglease: no answer to the release of {name:?}; it ends at its expiry"),
    }
}
