//! Leader election from the command line: `leader` (who leads), `observe`
//! (every change, as JSON lines), `step-down` (ask the leader to hand
//! over) and `elect` (campaign and run a command while leading).

use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use pglease::elect::Elector;
use pglease::observe::Change;
use pglease::{AcquireOptions, Error, HeldLease, LeaseManager, Token};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::commands::status_json;
use crate::{EXIT_DATABASE, EXIT_NOT_ACQUIRED, Outcome, note, out};

/// `pglease leader NAME`: the holder, token and value of the current term;
/// exit 3 if nobody leads.
pub(crate) async fn leader(manager: &LeaseManager, name: &str, json: bool) -> Outcome {
    let status = manager.inspect(name).await.map_err(|e| (e, "leader"))?;
    if json {
        out!("{}", status_json(&status));
    }
    let (true, Some(holder), Some(token)) = (status.held, &status.holder, status.token) else {
        if !json {
            eprintln!("pglease: nobody leads {name:?}");
        }
        return Ok(ExitCode::from(EXIT_NOT_ACQUIRED));
    };
    if !json {
        out!(
            "{holder}\ttoken {token}\t{}",
            status.value.as_deref().unwrap_or("-")
        );
        if let Some(by) = &status.step_down_requested_by {
            eprintln!("pglease: {by:?} asked this leader to step down");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `pglease step-down NAME`: ask the current holder to step down; exit 3
/// if nobody holds it.
pub(crate) async fn step_down(manager: &LeaseManager, name: &str, by: &str, json: bool) -> Outcome {
    let asked = match manager.request_step_down(name, by).await {
        Err(Error::InvalidInput {
            argument: "requested_by",
            reason,
        }) => {
            eprintln!("pglease: invalid --by: {reason}");
            if json {
                crate::json_failure(&format!("invalid --by: {reason}"), crate::EXIT_USAGE);
            }
            return Ok(ExitCode::from(crate::EXIT_USAGE));
        }
        asked => asked.map_err(|e| (e, "step-down"))?,
    };
    if json {
        out!("{}", json!({"name": name, "token": asked.map(|t| t.get())}));
    }
    match asked {
        Some(token) => {
            note!("pglease: asked the holder of {name:?} (token {token}) to step down");
            Ok(ExitCode::SUCCESS)
        }
        None => {
            eprintln!("pglease: nobody holds {name:?}: nobody to ask");
            Ok(ExitCode::from(EXIT_NOT_ACQUIRED))
        }
    }
}

/// One change as a JSON object.
fn change_json(name: &str, change: &Change) -> serde_json::Value {
    let token = |t: &Token| t.get();
    match change {
        Change::Current(status) => {
            let mut value = status_json(status);
            value["event"] = json!("current");
            value
        }
        Change::Acquired {
            token: t,
            holder,
            expires_at,
        } => json!({"event": "acquired", "name": name, "token": token(t), "holder": holder,
                     "expires_at": expires_at.to_rfc3339()}),
        Change::ValueChanged { token: t, value } => {
            json!({"event": "value", "name": name, "token": token(t), "value": value})
        }
        Change::StepDownRequested { token: t, by } => {
            json!({"event": "step_down_requested", "name": name, "token": token(t), "by": by})
        }
        Change::Released { token: t } => {
            json!({"event": "released", "name": name, "token": token(t)})
        }
        Change::Expired { token: t } => {
            json!({"event": "expired", "name": name, "token": token(t)})
        }
        other => json!({"event": "unknown", "name": name, "detail": format!("{other:?}")}),
    }
}

/// `pglease observe NAME`: the lease now, then every change, one JSON
/// object per line, until interrupted (exit 0).
pub(crate) async fn observe(manager: &LeaseManager, name: &str) -> Outcome {
    use std::io::Write;
    let (Ok(mut sigterm), Ok(mut sigint)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("pglease: cannot watch for signals");
        return Ok(ExitCode::from(EXIT_DATABASE));
    };
    let mut observer = manager.observe(name).await.map_err(|e| (e, "observe"))?;
    let mut out = std::io::stdout().lock();
    loop {
        let change = tokio::select! {
            change = observer.next() => change.map_err(|e| (e, "observe"))?,
            _ = sigterm.recv() => return Ok(ExitCode::SUCCESS),
            _ = sigint.recv() => return Ok(ExitCode::SUCCESS),
        };
        // A reader that went away (a closed pipe) ends the observation.
        if writeln!(out, "{}", change_json(name, &change))
            .and_then(|()| out.flush())
            .is_err()
        {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// What `elect` is told on the command line.
pub(crate) struct ElectOptions {
    pub(crate) ttl: Duration,
    pub(crate) holder: String,
    pub(crate) value: Option<String>,
    pub(crate) grace: Duration,
    pub(crate) max_restarts: u32,
    pub(crate) restart_delay: Duration,
}

/// What the terms of one `elect` share.
struct Shared {
    elector: Elector,
    name: String,
    holder: String,
    cmd: Vec<String>,
    database_url: Option<String>,
    options: ElectOptions,
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
    running: Mutex<Option<Pid>>,
}

/// `pglease elect NAME --ttl D -- CMD`: campaign for NAME; while leading,
/// run CMD with the term's token in its environment, restarting it after
/// a failure (up to `--max-restarts`); stop it when the term is lost or
/// the leader is asked to step down, and campaign again. A signal stops
/// CMD, resigns and exits 128 + the signal's number.
pub(crate) async fn elect(
    manager: &LeaseManager,
    database_url: &Option<String>,
    name: &str,
    options: ElectOptions,
    cmd: &[String],
) -> Outcome {
    let Some((mut sigterm, mut sigint, mut sighup)) = crate::run::stop_signals() else {
        return Ok(ExitCode::from(EXIT_DATABASE));
    };
    let mut how = AcquireOptions::ttl(options.ttl).holder(&options.holder);
    if let Some(value) = &options.value {
        how = how.value(value);
    }
    let elector = manager.elector(name, how).map_err(|e| (e, "elect"))?;
    let shared = Arc::new(Shared {
        elector,
        name: name.to_owned(),
        holder: options.holder.clone(),
        cmd: cmd.to_vec(),
        database_url: database_url.clone(),
        options,
        stopping: CancellationToken::new(),
        finished: watch::Sender::new(None),
        busy: watch::Sender::new(false),
        failures: Mutex::new(0),
        running: Mutex::new(None),
    });
    note!("pglease: campaigning for {name:?}");
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
            _ = sigterm.recv() => stop(&shared, &mut code, 15),
            _ = sigint.recv() => stop(&shared, &mut code, 2),
            _ = sighup.recv() => stop(&shared, &mut code, 1),
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
fn stop(shared: &Shared, code: &mut Option<u8>, signal: u8) {
    if shared.stopping.is_cancelled() {
        let running = *lock(&shared.running);
        if let Some(pgid) = running {
            eprintln!("pglease: second signal; killing the command");
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
    code.get_or_insert(128 + signal);
    shared.stopping.cancel();
}

/// One term: run CMD until it is done, the leader is asked to step down,
/// or a signal comes. Dropped (the term was lost), it stops CMD in the
/// background.
async fn term(shared: &Shared, held: HeldLease) {
    let token = held.token();
    note!(
        "pglease: leading {:?} (token {token}); starting the command",
        shared.name
    );
    // The previous term's CMD may still be stopping.
    let mut busy = shared.busy.subscribe();
    let _ = busy.wait_for(|b| !b).await;
    loop {
        if shared.stopping.is_cancelled() {
            return;
        }
        let mut child = match spawn(shared, token) {
            Ok(child) => child,
            Err(e) => {
                eprintln!("pglease: cannot start {:?}: {e}", shared.cmd[0]);
                shared.finished.send_replace(Some(crate::EXIT_CANNOT_START));
                return;
            }
        };
        tokio::select! {
            status = child.wait() => {
                let Some(status) = status else {
                    // Lost track of it (its group was killed): give up
                    // leading rather than lead with nothing running.
                    shared.finished.send_replace(Some(1));
                    return;
                };
                if status.success() {
                    note!("pglease: the command finished; resigning");
                    shared.finished.send_replace(Some(0));
                    return;
                }
                let code = crate::run::status_number(status);
                let failures = {
                    let mut failures = lock(&shared.failures);
                    *failures += 1;
                    *failures
                };
                if failures > shared.options.max_restarts {
                    eprintln!(
                        "pglease: the command failed (exit status {code}) {failures} times; resigning"
                    );
                    shared.finished.send_replace(Some(code));
                    return;
                }
                eprintln!(
                    "pglease: the command failed (exit status {code}); restarting it in {} \
                     ({failures} of {} restarts)",
                    humantime::format_duration(shared.options.restart_delay),
                    shared.options.max_restarts
                );
                tokio::select! {
                    () = tokio::time::sleep(shared.options.restart_delay) => {}
                    () = shared.stopping.cancelled() => return,
                }
            }
            by = shared.elector.until_step_down_requested() => {
                note!("pglease: {by:?} asked this leader to step down; stopping the command");
                child.stop(shared.options.grace, Signal::SIGTERM).await;
                shared.elector.step_down();
                return;
            }
            () = shared.stopping.cancelled() => {
                child.stop(shared.options.grace, Signal::SIGTERM).await;
                return;
            }
        }
    }
}

/// CMD, in a process group of its own, with the term in its environment.
fn spawn(shared: &Shared, token: Token) -> std::io::Result<Child> {
    let cmd = &shared.cmd;
    let mut command = tokio::process::Command::new(&cmd[0]);
    command
        .args(&cmd[1..])
        .process_group(0)
        .stdin(Stdio::null())
        .env("PGLEASE_NAME", &shared.name)
        .env("PGLEASE_TOKEN", token.to_string())
        .env("PGLEASE_HOLDER", &shared.holder);
    if let Some(value) = &shared.options.value {
        command.env("PGLEASE_VALUE", value);
    }
    if let Some(url) = &shared.database_url {
        command.env("PGLEASE_DATABASE_URL", url);
    }
    let child = command.spawn()?;
    let pgid = child
        .id()
        .map(|id| Pid::from_raw(id as i32))
        .ok_or_else(|| std::io::Error::other("the command exited at once"))?;
    shared.busy.send_replace(true);
    *lock(&shared.running) = Some(pgid);
    Ok(Child {
        child: Some(child),
        pgid,
        grace: shared.options.grace,
        busy: shared.busy.clone(),
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A running CMD. Dropped while it runs (the term was lost), it is
/// stopped in the background: SIGTERM, SIGKILL after the grace period.
struct Child {
    child: Option<tokio::process::Child>,
    pgid: Pid,
    grace: Duration,
    busy: watch::Sender<bool>,
}

impl Child {
    /// Waits for CMD to exit; `None` if it cannot be waited for (it was
    /// killed).
    async fn wait(&mut self) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        let status = child.wait().await;
        self.child = None;
        let _ = killpg(self.pgid, Signal::SIGKILL);
        self.busy.send_replace(false);
        match status {
            Ok(status) => Some(status),
            Err(e) => {
                eprintln!("pglease: lost track of the command: {e}; killed its process group");
                None
            }
        }
    }

    /// Stops CMD: `signal` to its group, SIGKILL after `grace`.
    async fn stop(&mut self, grace: Duration, signal: Signal) {
        if let Some(mut child) = self.child.take() {
            stop_group(&mut child, self.pgid, grace, signal).await;
            self.busy.send_replace(false);
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            eprintln!("pglease: leadership lost; stopping the command");
            let (pgid, grace, busy) = (self.pgid, self.grace, self.busy.clone());
            tokio::spawn(async move {
                stop_group(&mut child, pgid, grace, Signal::SIGTERM).await;
                busy.send_replace(false);
            });
        }
    }
}

async fn stop_group(child: &mut tokio::process::Child, pgid: Pid, grace: Duration, signal: Signal) {
    let _ = killpg(pgid, signal);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        eprintln!(
            "pglease: the command did not stop within {}; killing it",
            humantime::format_duration(grace)
        );
    }
    // The whole group, also what outlived the command.
    let _ = killpg(pgid, Signal::SIGKILL);
    let _ = child.wait().await;
}
