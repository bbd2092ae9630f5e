//! `pglease elect NAME --ttl D -- CMD`: campaign for NAME; while leading,
//! run CMD with the term's token in its environment, restarting it after
//! a failure (up to `--max-restarts`); stop it when the term is lost or
//! the leader is asked to step down, and campaign again. A signal stops
//! CMD, resigns and exits 128 + the signal's number.

use std::process::{ExitCode, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use pglease::elect::Elector;
use pglease::{AcquireOptions, HeldLease, LeaseManager, Token};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::args::ElectArgs;
use crate::child::{Child, Group, LeaseEnv, StopSignals, signalled, status_number};
use crate::exit::{self, Outcome};
use crate::output::{human, note};
use crate::sidecar::board::{Board, Phase};
use crate::sidecar::metrics;
use crate::sync::lock;

/// What the terms of one `elect` share.
struct Shared {
    elector: Elector,
    args: ElectArgs,
    /// Who campaigns (`--holder`, or the host name and process id).
    holder: String,
    database_url: Option<String>,
    /// Cancelled on a signal: the leader stops CMD and `elect` resigns.
    stopping: CancellationToken,
    /// The exit status once CMD is done for good (finished, or failed more
    /// often than allowed).
    finished: watch::Sender<Option<u8>>,
    /// Whether a CMD is running or being stopped (no new one starts
    /// before it is gone).
    busy: watch::Sender<bool>,
    /// CMD's failures so far, over all terms.
    failures: Mutex<u32>,
    /// The process group of the CMD that runs, if one does.
    running: Mutex<Option<Group>>,
    /// What `--http` reports.
    board: Arc<Board>,
}

pub(crate) async fn elect(
    manager: &LeaseManager,
    database_url: Option<&str>,
    args: ElectArgs,
    board: Arc<Board>,
) -> Outcome {
    let Some(mut signals) = StopSignals::watch() else {
        return Ok(ExitCode::from(exit::DATABASE));
    };
    let holder = args
        .holder
        .clone()
        .unwrap_or_else(AcquireOptions::default_holder);
    let mut how = AcquireOptions::ttl(args.ttl).holder(&holder);
    if let Some(value) = &args.value {
        how = how.value(value);
    }
    let mut elector = manager.elector(&args.name, how).map_err(|e| (e, "elect"))?;
    if let Some(candidate) = &args.prefer {
        elector = elector.prefer(candidate.as_str());
    }
    board.follow_leader(elector.watch_leader());
    note!("pglease: campaigning for {:?}", args.name);
    let shared = Arc::new(Shared {
        elector,
        args,
        holder,
        database_url: database_url.map(str::to_owned),
        stopping: CancellationToken::new(),
        finished: watch::Sender::new(None),
        busy: watch::Sender::new(false),
        failures: Mutex::new(0),
        running: Mutex::new(None),
        board,
    });
    let campaign = {
        let shared = Arc::clone(&shared);
        async move {
            let work = Arc::clone(&shared);
            shared
                .elector
                .run(async move |held| term(&work, held).await)
                .await
        }
    };
    let mut campaign = std::pin::pin!(campaign);
    let mut finished = shared.finished.subscribe();
    let mut busy = shared.busy.subscribe();
    let mut code: Option<u8> = None;
    let mut resigned = false;
    loop {
        tokio::select! {
            ran = &mut campaign => {
                ran.map_err(|e| (e, "elect"))?;
                return Ok(ExitCode::from(code.unwrap_or(0)));
            }
            done = finished.wait_for(Option::is_some), if !resigned => {
                code = code.or(done.ok().and_then(|done| *done));
                shared.elector.resign();
                resigned = true;
            }
            signal = signals.next() => stop(&shared, &mut code, signal),
            // After a signal: resign once CMD is gone.
            _ = busy.wait_for(|b| !b), if shared.stopping.is_cancelled() && !resigned => {
                shared.elector.resign();
                resigned = true;
            }
        }
    }
}

/// A signal: stop CMD (the leader's term then resigns), or, if it was
/// stopping already, kill it.
fn stop(shared: &Shared, code: &mut Option<u8>, signal: Signal) {
    // A CMD runs, or is being stopped (the group of an earlier one is
    // not).
    let busy = *shared.busy.borrow();
    if shared.stopping.is_cancelled() {
        let running = *lock(&shared.running);
        if let (Some(group), true) = (running, busy) {
            note!("pglease: {signal} again: killing the command (SIGKILL)");
            group.signal(Signal::SIGKILL);
        }
    } else if busy {
        note!(
            "pglease: {signal}: stopping the command, then resigning \
             (a second signal kills it)"
        );
    }
    code.get_or_insert(signalled(signal));
    shared.board.set_phase(Phase::Stopping);
    shared.stopping.cancel();
}

/// One term: run CMD until it is done, the leader is asked to step down,
/// or a signal comes. Dropped (the term was lost), it stops CMD in the
/// background.
async fn term(shared: &Shared, held: HeldLease) {
    let token = held.token();
    note!(
        "pglease: leading {:?} (token {token}); starting the command",
        shared.args.name
    );
    // The previous term's CMD may still be stopping.
    let mut busy = shared.busy.subscribe();
    let _ = busy.wait_for(|b| !b).await;
    let _leading = Leading::on(&shared.board, &held);
    let report = super::report_renewals(&held);
    tokio::pin!(report);
    let mut again = false;
    loop {
        if shared.stopping.is_cancelled() {
            return;
        }
        let mut running = match Running::start(shared, token, again) {
            Ok(running) => running,
            Err(e) => {
                eprintln!("pglease: cannot start {:?}: {e}", shared.args.cmd[0]);
                shared.finished.send_replace(Some(exit::CANNOT_START));
                return;
            }
        };
        tokio::select! {
            // Never completes: prints when renewals fail and recover.
            () = &mut report => {}
            status = running.wait() => {
                if !restart_after(shared, ended(status, running.terminal)).await {
                    return;
                }
                again = true;
            }
            () = shared.elector.until_handover_due() => {
                note!("pglease: the preferred candidate campaigns; stopping the command to hand over");
                shared.board.set_phase(Phase::Stopping);
                running.stop().await;
                return;
            }
            by = shared.elector.until_step_down_requested() => {
                note!("pglease: {by:?} asked this leader to step down; stopping the command");
                shared.board.set_phase(Phase::Stopping);
                running.stop().await;
                shared.elector.step_down();
                note!(
                    "pglease: stepped down; campaigning again once another candidate leads \
                     (or after a TTL)"
                );
                return;
            }
            () = shared.stopping.cancelled() => {
                running.stop().await;
                return;
            }
        }
    }
}

/// A term on the board: leading under its lease from `on` until dropped
/// (the term ended, or was lost), then campaigning again.
struct Leading<'a>(&'a Board);

impl Leading<'_> {
    fn on<'a>(board: &'a Board, held: &HeldLease) -> Leading<'a> {
        board.hold(Phase::Leading, std::slice::from_ref(held));
        Leading(board)
    }
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        self.0.drop_leases(Phase::Campaigning);
    }
}

/// How a term's CMD ended, as the term acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// It could not be waited for (its group was killed): the term gives
    /// up leading rather than lead with nothing running (exit status 1).
    Lost,
    /// It finished: the term resigns (exit status 0).
    Finished,
    /// Ctrl-C or Ctrl-\ at the terminal CMD had reached CMD only: the
    /// user meant the election, as a shell takes it; the term resigns with
    /// CMD's exit status.
    Interrupted(u8),
    /// It failed with this exit status: it is restarted, unless it has
    /// failed more often than `--max-restarts` allows.
    Failed(u8),
}

/// How CMD ended, from its exit `status` (`None`: lost track of it) and
/// whether it had the `terminal`.
fn ended(status: Option<ExitStatus>, terminal: bool) -> Ended {
    let Some(status) = status else {
        return Ended::Lost;
    };
    if status.success() {
        return Ended::Finished;
    }
    let code = status_number(status);
    if terminal && interrupted(status) {
        Ended::Interrupted(code)
    } else {
        Ended::Failed(code)
    }
}

/// Acts on how CMD `ended`: says so, and either sets the exit status of
/// `elect` (false: the term ends, and resigns) or, for a failure within
/// `--max-restarts`, waits the restart delay (true: CMD starts again;
/// false if a signal came meanwhile).
async fn restart_after(shared: &Shared, ended: Ended) -> bool {
    let code = match ended {
        Ended::Lost => {
            shared.finished.send_replace(Some(1));
            return false;
        }
        Ended::Finished => {
            note!("pglease: the command finished; resigning");
            shared.finished.send_replace(Some(0));
            return false;
        }
        Ended::Interrupted(code) => {
            note!("pglease: the command was interrupted from the terminal; resigning");
            shared.finished.send_replace(Some(code));
            return false;
        }
        Ended::Failed(code) => code,
    };
    let failures = {
        let mut failures = lock(&shared.failures);
        *failures += 1;
        *failures
    };
    let args = &shared.args;
    if failures > args.max_restarts {
        eprintln!("pglease: the command failed (exit status {code}) {failures} times; resigning");
        shared.finished.send_replace(Some(code));
        return false;
    }
    eprintln!(
        "pglease: the command failed (exit status {code}); restarting it in {} \
         ({failures} of {} restarts)",
        human(args.restart_delay),
        args.max_restarts
    );
    tokio::select! {
        () = tokio::time::sleep(args.restart_delay) => true,
        () = shared.stopping.cancelled() => false,
    }
}

/// Whether CMD was ended by SIGINT or SIGQUIT.
fn interrupted(status: ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(Signal::SIGINT as i32)
        || status.signal() == Some(Signal::SIGQUIT as i32)
}

/// The CMD of a term. Dropped while it runs (the term was lost), it is
/// stopped in the background: SIGTERM, SIGKILL after the grace period.
struct Running {
    child: Option<Child>,
    grace: Duration,
    busy: watch::Sender<bool>,
    /// CMD was given the terminal: Ctrl-C reaches it, not `elect`.
    terminal: bool,
}

impl Running {
    /// CMD, in a process group of its own, with the term in its
    /// environment.
    fn start(shared: &Shared, token: Token, again: bool) -> std::io::Result<Running> {
        let args = &shared.args;
        let lease = LeaseEnv {
            leases: vec![(&args.name, token)],
            shared: false,
            holder: &shared.holder,
            value: args.value.as_deref(),
            database_url: shared.database_url.as_deref(),
            declare: args.declare,
            extra: Vec::new(),
        };
        // Standard input only when CMD gets the terminal (as a shell's job
        // does); a pipe or file is not read again by each term's CMD, and
        // a CMD in the background would only stop reading the terminal.
        let child = Child::spawn(&args.cmd, &lease, crate::child::in_terminal_foreground())?;
        metrics::cmd_started(shared.board.kind(), again);
        shared.busy.send_replace(true);
        *lock(&shared.running) = Some(child.group());
        let terminal = child.has_terminal();
        Ok(Running {
            child: Some(child),
            grace: args.grace,
            busy: shared.busy.clone(),
            terminal,
        })
    }

    /// Waits for CMD to exit (and kills what it left in its group);
    /// `None` if it cannot be waited for.
    async fn wait(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let status = child.wait().await;
        child.signal(Signal::SIGKILL);
        self.child = None;
        self.busy.send_replace(false);
        match status {
            Ok(status) => Some(status),
            Err(e) => {
                eprintln!("pglease: lost track of the command: {e}; killed its process group");
                None
            }
        }
    }

    /// Stops CMD: SIGTERM to its group, SIGKILL after the grace period.
    async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.stop(Signal::SIGTERM, self.grace).await;
            self.busy.send_replace(false);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            eprintln!("pglease: leadership lost; stopping the command");
            let (grace, busy) = (self.grace, self.busy.clone());
            tokio::spawn(async move {
                let _ = child.stop(Signal::SIGTERM, grace).await;
                busy.send_replace(false);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    use super::{Ended, ended};

    #[test]
    fn a_failure_is_restarted_unless_the_terminal_interrupted_it() {
        // Wait statuses as the kernel gives them: an exit code in the
        // second byte, a signal in the low bits.
        let exited = |code: i32| Some(ExitStatus::from_raw(code << 8));
        let killed = |signal: i32| Some(ExitStatus::from_raw(signal));
        assert_eq!(ended(None, false), Ended::Lost);
        assert_eq!(ended(exited(0), true), Ended::Finished);
        assert_eq!(ended(exited(3), false), Ended::Failed(3));
        assert_eq!(ended(killed(2), true), Ended::Interrupted(130));
        assert_eq!(ended(killed(3), true), Ended::Interrupted(131));
        assert_eq!(ended(killed(2), false), Ended::Failed(130));
        assert_eq!(ended(killed(15), true), Ended::Failed(143));
    }
}
