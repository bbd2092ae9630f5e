//! CMD under a lease, as `run` and `elect` start and stop it: in a process
//! group of its own with the lease in its environment, signals forwarded
//! to the group, and a stop that escalates SIGTERM, then SIGKILL after a
//! grace period, to every process of the group. Started from a terminal
//! on stdin in the foreground, CMD gets the terminal, as a shell's job
//! does: the terminal's foreground process group is handed to CMD's
//! group, taken back when CMD stops or exits, and given again when the
//! job is continued (see [`Terminal`]).

use std::io::IsTerminal;
use std::os::fd::BorrowedFd;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{SigHandler, Signal, killpg, raise};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::{Pid, getpgrp, getpid, tcgetpgrp, tcsetpgrp};
use pglease::Token;
use tokio::signal::unix::{SignalKind, signal};

use crate::output::{human, note};

/// What CMD learns of its leases, as environment variables: how many it
/// runs under (`PGLEASE_LEASES`), each one's name and the token that
/// fences its writes (`PGLEASE_NAME_k`, `PGLEASE_TOKEN_k` for k = 1..N,
/// in the order given; a counted lease's name is its slot NAME#k), and
/// with a single lease the same as `PGLEASE_NAME` and `PGLEASE_TOKEN`
/// (unset with several, so that a script written for one lease fails
/// instead of fencing on one of them); the holder (`PGLEASE_HOLDER`), the
/// value published with it (`PGLEASE_VALUE`), the database URL pglease
/// was given (`PGLEASE_DATABASE_URL`), and `PGLEASE_SHARED=1` for a shared
/// lease (whose token `pglease.assert_shared` checks). With `declare`, the
/// settings that make every session CMD opens declare its one lease
/// (`PGOPTIONS`, `PGAPPNAME`, `PGLEASE_OPTIONS`, `PGLEASE_URL_QUERY`; see
/// [`crate::declare`]).
pub(crate) struct LeaseEnv<'a> {
    pub(crate) leases: Vec<(&'a str, Token)>,
    pub(crate) shared: bool,
    pub(crate) holder: &'a str,
    pub(crate) value: Option<&'a str>,
    pub(crate) database_url: Option<&'a str>,
    pub(crate) declare: bool,
    /// More variables, set as they are (`share`'s group, member and
    /// partition).
    pub(crate) extra: Vec<(&'static str, String)>,
}

impl LeaseEnv<'_> {
    /// The variables, as (name, value) pairs.
    fn variables(&self) -> Vec<(String, String)> {
        let mut variables = vec![
            ("PGLEASE_LEASES".to_owned(), self.leases.len().to_string()),
            ("PGLEASE_HOLDER".to_owned(), self.holder.to_owned()),
        ];
        if let [(name, token)] = self.leases[..] {
            variables.push(("PGLEASE_NAME".to_owned(), name.to_owned()));
            variables.push(("PGLEASE_TOKEN".to_owned(), token.to_string()));
        }
        for (k, (name, token)) in self.leases.iter().enumerate() {
            variables.push((format!("PGLEASE_NAME_{}", k + 1), (*name).to_owned()));
            variables.push((format!("PGLEASE_TOKEN_{}", k + 1), token.to_string()));
        }
        if let Some(value) = self.value {
            variables.push(("PGLEASE_VALUE".to_owned(), value.to_owned()));
        }
        if self.shared {
            variables.push(("PGLEASE_SHARED".to_owned(), "1".to_owned()));
        }
        if let Some(url) = self.database_url {
            variables.push(("PGLEASE_DATABASE_URL".to_owned(), url.to_owned()));
        }
        variables.extend(
            self.extra
                .iter()
                .map(|(key, value)| ((*key).to_owned(), value.clone())),
        );
        if let (true, [(name, token)]) = (self.declare, &self.leases[..]) {
            variables.extend(crate::declare::variables(
                name,
                *token,
                std::env::var("PGOPTIONS").ok().as_deref(),
                std::env::var("PGAPPNAME").ok().as_deref(),
            ));
        }
        variables
    }
}

/// The terminal on pglease's stdin, when pglease runs in its foreground
/// (a shell's foreground job): CMD's group gets it while CMD runs, so
/// that CMD can read it (`read`, `psql`), and Ctrl-C, Ctrl-Z and the
/// terminal's other signals go to CMD as they would without pglease.
/// pglease ignores SIGTTOU from then on, so that it can take the terminal
/// back from the background, as shells do.
#[derive(Clone, Copy)]
struct Terminal {
    /// pglease's own process group, the job's.
    own: Pid,
}

impl Terminal {
    /// The terminal on stdin, if pglease leads its process group (a shell
    /// started it as a job) and that group is the terminal's foreground,
    /// with stdout on a terminal too (in a pipeline, `run ... | less`, the
    /// other commands share pglease's group and must keep the terminal).
    /// Started by another program in that program's group (make, a test
    /// harness), pglease leaves the terminal to it: Ctrl-C still reaches
    /// that program.
    fn foreground() -> Option<Terminal> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() || !std::io::stdout().is_terminal() {
            return None;
        }
        let own = getpgrp();
        if own != getpid() || tcgetpgrp(&stdin).ok()? != own {
            return None;
        }
        // SAFETY: setting a signal's disposition to "ignore" runs no code
        // of ours in a signal handler.
        unsafe { nix::sys::signal::signal(Signal::SIGTTOU, SigHandler::SigIgn) }.ok()?;
        Some(Terminal { own })
    }

    /// Whether the shell has given the job the terminal (`fg`).
    fn is_ours(self) -> bool {
        tcgetpgrp(std::io::stdin()).ok() == Some(self.own)
    }

    /// Hands the terminal to `group` (a failure leaves it where it is:
    /// CMD then stops if it reads it, as a background job does).
    fn give(self, group: Pid) {
        let _ = tcsetpgrp(std::io::stdin(), group);
    }

    /// Takes the terminal back for pglease's group if `group` (CMD's) has
    /// it; not otherwise: a job the shell put in the background must not
    /// take the terminal from the shell.
    fn take_back_from(self, group: Pid) {
        if tcgetpgrp(std::io::stdin()).ok() == Some(group) {
            let _ = tcsetpgrp(std::io::stdin(), self.own);
        }
    }
}

/// Whether CMD would be given the terminal (see [`Terminal`]): `elect`
/// gives each term's CMD its stdin only then.
pub(crate) fn in_terminal_foreground() -> bool {
    Terminal::foreground().is_some()
}

/// The terminal CMD was given, and the signals that say what became of
/// the job: SIGCHLD (CMD stopped) and SIGCONT (the job continued).
struct Job {
    terminal: Terminal,
    stops: tokio::signal::unix::Signal,
    continues: tokio::signal::unix::Signal,
}

/// A running CMD and its process group.
pub(crate) struct Child {
    child: tokio::process::Child,
    group: Pid,
    /// The terminal CMD was given, if it was.
    job: Option<Job>,
}

impl Child {
    /// Starts `cmd` (program and arguments) in a process group of its own
    /// with `lease` in its environment; its standard input is this one's
    /// when `stdin` is set, else closed. With stdin a terminal whose
    /// foreground pglease is in, CMD's group is made the foreground.
    pub(crate) fn spawn(
        cmd: &[String],
        lease: &LeaseEnv<'_>,
        stdin: bool,
    ) -> std::io::Result<Child> {
        let (program, args) = cmd
            .split_first()
            .ok_or_else(|| std::io::Error::other("no command given"))?;
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .process_group(0)
            .stdin(if stdin {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .envs(lease.variables());
        // Those of a run this one runs inside do not leak through.
        for (key, _) in std::env::vars_os() {
            let ours = key.to_str().is_some_and(|k| k.starts_with("PGLEASE_"));
            if ours && !lease.variables().iter().any(|(set, _)| key == set.as_str()) {
                command.env_remove(key);
            }
        }
        let terminal = if stdin { Terminal::foreground() } else { None };
        let job = match terminal {
            // Registered before CMD starts, so that nothing is missed.
            Some(terminal) => Some(Job {
                terminal,
                stops: signal(SignalKind::child())?,
                continues: signal(SignalKind::from_raw(Signal::SIGCONT as i32))?,
            }),
            None => None,
        };
        let take_terminal = terminal.is_some();
        // SAFETY: between fork and exec the closure only calls
        // async-signal-safe functions (getpid, tcsetpgrp, sigaction) and
        // allocates nothing.
        unsafe {
            command.pre_exec(move || {
                if take_terminal {
                    // In its own group already (process_group runs
                    // first): take the terminal as a shell's child does,
                    // SIGTTOU ignored as in pglease.
                    let _ = tcsetpgrp(BorrowedFd::borrow_raw(0), getpid());
                }
                // SIGTTOU as CMD expects it, whether or not an earlier
                // term's handover made pglease ignore it.
                nix::sys::signal::signal(Signal::SIGTTOU, SigHandler::SigDfl)
                    .map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        let child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                // CMD may have taken the terminal before its exec failed.
                if let Some(terminal) = terminal
                    && tcgetpgrp(std::io::stdin()).ok() != Some(terminal.own)
                {
                    let _ = tcsetpgrp(std::io::stdin(), terminal.own);
                }
                return Err(e);
            }
        };
        let group = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| std::io::Error::other("the command exited at once"))?;
        if let Some(job) = &job {
            // Also from this side, whichever runs first (as shells do).
            job.terminal.give(group);
        }
        Ok(Child { child, group, job })
    }

    /// Whether CMD was given the terminal.
    pub(crate) fn has_terminal(&self) -> bool {
        self.job.is_some()
    }

    /// Sends `signal` to CMD's whole group (a group already gone is
    /// nothing to report).
    pub(crate) fn signal(&self, signal: Signal) {
        self.group().signal(signal);
    }

    /// A handle that signals CMD's group without borrowing CMD (while a
    /// [`Child::stop`] is under way, say).
    pub(crate) fn group(&self) -> Group {
        Group(self.group)
    }

    /// Waits for CMD to exit; with the terminal, follows CMD's stops
    /// meanwhile (see [`Child::follow_stop`]) and takes the terminal back
    /// when CMD has exited.
    ///
    /// Cancel-safe: CMD keeps running.
    pub(crate) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        loop {
            let Some(job) = self.job.as_mut() else {
                return self.child.wait().await;
            };
            let terminal = job.terminal;
            let stopped = tokio::select! {
                status = self.child.wait() => {
                    terminal.take_back_from(self.group);
                    return status;
                }
                _ = job.stops.recv() => true,
                // `fg` after `bg`: the shell gave the job the terminal.
                _ = job.continues.recv() => false,
            };
            if stopped {
                self.follow_stop(terminal);
            } else if terminal.is_ours() {
                terminal.give(self.group);
            }
        }
    }

    /// After a SIGCHLD: if CMD has stopped (Ctrl-Z, or reading the
    /// terminal without it), the job stops with it, as a shell's would:
    /// pglease takes the terminal back and stops itself (SIGTSTP), so that
    /// the shell sees the job stopped. Continued (`fg` or `bg`), it gives
    /// the terminal to CMD again if the shell gave it to the job, and
    /// continues CMD; a later `fg` of a job continued with `bg` is seen by
    /// its SIGCONT ([`Child::wait`]). While pglease is stopped its leases are not renewed:
    /// one that has expired meanwhile is lost when it continues, and CMD
    /// is stopped then. In an orphaned process group the stop is not taken
    /// (POSIX), and CMD is continued at once.
    fn follow_stop(&self, terminal: Terminal) {
        // Stops only: WEXITED is not asked for, so an exit is left to
        // `wait`, which reaps it.
        let stopped = waitid(
            Id::Pid(self.group),
            WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG,
        );
        let Ok(WaitStatus::Stopped(_, signal)) = stopped else {
            return;
        };
        // CMD read (or wrote) the terminal just before it got it back
        // after `fg`: not a stop of the job; hand it over and go on.
        if matches!(signal, Signal::SIGTTIN | Signal::SIGTTOU) && terminal.is_ours() {
            terminal.give(self.group);
            self.signal(Signal::SIGCONT);
            return;
        }
        terminal.take_back_from(self.group);
        let _ = raise(Signal::SIGTSTP);
        // Continued.
        if terminal.is_ours() {
            terminal.give(self.group);
        }
        self.signal(Signal::SIGCONT);
    }

    /// Stops CMD: `signal` to its group, SIGKILL to the group if it has
    /// not exited after `grace`, and SIGKILL to what is left of the group
    /// once it has; its status.
    pub(crate) async fn stop(
        &mut self,
        signal: Signal,
        grace: Duration,
    ) -> std::io::Result<ExitStatus> {
        self.signal(signal);
        // A stopped CMD takes the signal only once continued.
        self.signal(Signal::SIGCONT);
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => {
                self.signal(Signal::SIGKILL);
                status
            }
            Err(_) => {
                note!(
                    "pglease: the command did not stop within {}; killing it",
                    human(grace)
                );
                self.signal(Signal::SIGKILL);
                self.child.wait().await
            }
        };
        if let Some(job) = &self.job {
            job.terminal.take_back_from(self.group);
        }
        status
    }
}

/// CMD's process group, to signal.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Group(Pid);

impl Group {
    /// Sends `signal` to every process of the group.
    pub(crate) fn signal(self, signal: Signal) {
        let _ = killpg(self.0, signal);
    }
}

/// The exit status that reports CMD's `status`: its code, or 128+N for
/// signal N.
pub(crate) fn status_number(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
        (None, None) => 1,
    }
}

/// SIGTERM, SIGINT and SIGHUP to pglease, watched from when this is made,
/// so that none is lost while a lease is awaited.
pub(crate) struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Starts watching; `None` (said on stderr) if the signals cannot be
    /// watched.
    pub(crate) fn watch() -> Option<StopSignals> {
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) {
            (Ok(term), Ok(int), Ok(hup)) => Some(StopSignals { term, int, hup }),
            _ => {
                eprintln!("pglease: cannot watch for signals");
                None
            }
        }
    }

    /// The next of them to arrive.
    ///
    /// Cancel-safe: a signal is taken only when it is returned.
    pub(crate) async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// The exit status of pglease stopped by `signal` (128 + its number).
pub(crate) fn signalled(signal: Signal) -> u8 {
    u8::try_from(128 + signal as i32).unwrap_or(255)
}

/// Forwards the signals pglease gets to CMD's group: the first as it is,
/// a second one as SIGKILL; each said on stderr (unless `-q`), so that a
/// user who pressed Ctrl-C knows pglease waits for the command.
#[derive(Default)]
pub(crate) struct Forwarding {
    forwarded: bool,
}

impl Forwarding {
    pub(crate) fn forward(&mut self, group: Group, signal: Signal) {
        if self.forwarded {
            note!("pglease: {signal} again: killing the command (SIGKILL)");
            group.signal(Signal::SIGKILL);
        } else {
            note!(
                "pglease: {signal} sent on to the command; waiting for it to exit \
                 (a second signal kills it)"
            );
            group.signal(signal);
            crate::sidecar::metrics::signal_forwarded(signal);
            self.forwarded = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LeaseEnv;
    use pglease::Token;

    fn env(leases: Vec<(&str, Token)>, declare: bool) -> Vec<(String, String)> {
        LeaseEnv {
            leases,
            shared: false,
            holder: "h",
            value: None,
            database_url: None,
            declare,
            extra: Vec::new(),
        }
        .variables()
    }

    fn has(vars: &[(String, String)], key: &str) -> bool {
        vars.iter().any(|(k, _)| k == key)
    }

    #[test]
    fn only_a_declared_single_lease_sets_the_session_settings() {
        let t = |n| Token::new(n).expect("a token");
        let declared = env(vec![("m", t(5))], true);
        for key in [
            "PGOPTIONS",
            "PGAPPNAME",
            "PGLEASE_OPTIONS",
            "PGLEASE_URL_QUERY",
        ] {
            assert!(has(&declared, key), "{key} in {declared:?}");
        }
        let plain = env(vec![("m", t(5))], false);
        assert!(!has(&plain, "PGOPTIONS") && !has(&plain, "PGAPPNAME"));
        // Several leases: no declaration (run refuses --declare with them).
        let set = env(vec![("a", t(5)), ("b", t(6))], true);
        assert!(!has(&set, "PGOPTIONS"), "{set:?}");
    }
}
