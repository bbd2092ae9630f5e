//! `run` and `elect` with a command that reads the terminal, as a user
//! types them into an interactive shell with job control: bash on a
//! pseudo-terminal (made by util-linux's `script`), this test typing into
//! it. CMD reads what is typed, Ctrl-Z stops the job and `fg` resumes it
//! (the lease held meanwhile), Ctrl-C reaches CMD, and the shell gets its
//! terminal back after each.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pglease_formations::SetupError;

use crate::common::{BIN, TestDb, new_db, poll_until};

/// How long a step may take before the test fails.
const STEP: Duration = Duration::from_secs(20);

/// bash -i on a pseudo-terminal, and all it has written.
struct Shell {
    child: Child,
    input: ChildStdin,
    output: Arc<Mutex<String>>,
}

impl Shell {
    fn start(db: &TestDb) -> Result<Shell, SetupError> {
        for tool in ["script", "bash"] {
            let found = Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success());
            if !found {
                return Err(SetupError::Unavailable(format!(
                    "needs {tool}, which is not installed here (apt-get install {})",
                    if tool == "script" { "bsdutils" } else { "bash" }
                )));
            }
        }
        let mut child = Command::new("script")
            .args(["-q", "-e", "-c", "bash --norc --noprofile -i", "/dev/null"])
            .env("DATABASE_URL", db.url())
            .env("PS1", "$ ")
            .env("TERM", "dumb")
            .env("HISTFILE", "/dev/null")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| SetupError::Unavailable(format!("cannot start script: {e}")))?;
        let input = child.stdin.take().expect("stdin is piped");
        let mut out = child.stdout.take().expect("stdout is piped");
        let output = Arc::new(Mutex::new(String::new()));
        let collected = Arc::clone(&output);
        std::thread::spawn(move || {
            let mut buffer = [0_u8; 4096];
            while let Ok(n) = out.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&buffer[..n]).into_owned();
                collected.lock().expect("output").push_str(&text);
            }
        });
        Ok(Shell {
            child,
            input,
            output,
        })
    }

    /// Types `text` (control characters included).
    fn tell(&mut self, text: &str) {
        self.input.write_all(text.as_bytes()).expect("type");
        self.input.flush().expect("flush");
    }

    /// Waits until the terminal shows `text`.
    async fn shows(&self, text: &str) {
        let output = Arc::clone(&self.output);
        let seen = tokio::time::timeout(STEP, async {
            loop {
                if output.lock().expect("output").contains(text) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(
            seen.is_ok(),
            "the terminal never showed {text:?}; it shows:\n{}\nits processes:\n{}",
            self.output.lock().expect("output"),
            self.processes()
        );
    }

    /// Types a command line that prints `mark` and the previous
    /// command's status, and waits for it: the shell has its terminal
    /// back. The status.
    async fn status(&mut self, mark: &str) -> String {
        // Split in the typed text, whole in the output only.
        self.tell(&format!("echo \"{mark}\"\"=$?=\"\n"));
        let shown = format!("{mark}=");
        self.shows(&shown).await;
        let output = self.output.lock().expect("output").clone();
        let after = &output[output.rfind(&shown).unwrap_or(0) + shown.len()..];
        after.split('=').next().unwrap_or_default().to_owned()
    }

    /// The processes on the shell's terminal, with their groups, the
    /// terminal's foreground group and their signal masks (ignored,
    /// blocked, caught): what a step that never came needs to be
    /// understood.
    fn processes(&self) -> String {
        ps(&[
            "-t",
            &self.tty(),
            "-o",
            "pid,ppid,pgid,tpgid,stat,ignored,blocked,caught,args",
        ])
    }

    /// The shell's pseudo-terminal (`pts/N`): the terminal of `script`'s
    /// child, the shell.
    fn tty(&self) -> String {
        let listed = ps(&["--ppid", &self.child.id().to_string(), "-o", "tty="]);
        listed.lines().next().unwrap_or("?").trim().to_owned()
    }

    /// Waits until `program` runs in the terminal's foreground group, so
    /// that a signal typed now reaches it. CMD's `echo ...-ready` is not
    /// enough: until `sh -c` (dash) has started its next command, a
    /// Ctrl-C is caught by the shell, which then starts the command
    /// anyway, and a Ctrl-Z can stop the command's vfork child before its
    /// exec, leaving the shell blocked in vfork, neither running nor
    /// stopped; the same happens without pglease, so the test waits.
    async fn runs_in_foreground(&self, program: &str) {
        let tty = self.tty();
        poll_until(&format!("{program} in the foreground"), STEP, || async {
            let listed = ps(&["-t", &tty, "-o", "pgid=,tpgid=,comm="]);
            listed.lines().any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                matches!(fields.as_slice(), [group, foreground, name]
                    if group == foreground && *name == program)
            })
        })
        .await;
    }
}

/// What `ps` prints with `args`, or why it could not be run.
fn ps(args: &[&str]) -> String {
    match Command::new("ps").args(args).output() {
        Ok(listed) => String::from_utf8_lossy(&listed.stdout).into_owned(),
        Err(e) => format!("(ps could not be run: {e})"),
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `run` whose command reads a line from the terminal gets what is
/// typed (it hung before: CMD was not in the terminal's foreground group
/// and stopped on SIGTTIN), exits 0 and releases; so does an `elect`
/// whose command does the same.
async fn a_command_under_run_or_elect_reads_the_terminal() -> Result<(), SetupError> {
    let db = new_db().await;
    let mut shell = Shell::start(&db)?;
    let m = db.manager();
    for (command, name) in [("run", "tty-run"), ("elect", "tty-elect")] {
        shell.tell(&format!(
            "{BIN} {command} {name} --ttl 30s -- sh -c 'echo {name}-re\"\"ady; read a; echo \"got:$a\"'\n"
        ));
        shell.shows(&format!("{name}-ready")).await;
        assert!(
            m.inspect(name).await.expect("inspect").held,
            "{command}: held"
        );
        shell.tell(&format!("typed-to-{command}\n"));
        shell.shows(&format!("got:typed-to-{command}")).await;
        assert_eq!(
            shell.status(&format!("{command}-done")).await,
            "0",
            "{command}"
        );
        assert!(
            !m.inspect(name).await.expect("inspect").held,
            "{command}: released"
        );
    }
    Ok(())
}

/// Ctrl-Z stops the job (the shell says Stopped) with the lease still
/// held, `fg` resumes it and its command reads the terminal again; Ctrl-C
/// reaches the command, and run exits with its status (130; so it did
/// before the handover, when run forwarded SIGINT).
async fn ctrl_z_stops_the_job_and_fg_resumes_it() -> Result<(), SetupError> {
    let db = new_db().await;
    let mut shell = Shell::start(&db)?;
    let m = db.manager();
    shell.tell(&format!(
        "{BIN} run tty-job --ttl 30s -- sh -c 'echo job-re\"\"ady; read a; echo \"got:$a\"'\n"
    ));
    shell.shows("job-ready").await;
    shell.tell("\x1a");
    shell.shows("Stopped").await;
    let held = m.inspect("tty-job").await.expect("inspect");
    assert!(held.held, "held while the job is stopped");
    shell.tell("fg\n");
    shell.tell("after-fg\n");
    shell.shows("got:after-fg").await;
    assert_eq!(shell.status("fg-done").await, "0");
    poll_until("the lease released", STEP, || async {
        !m.inspect("tty-job").await.expect("inspect").held
    })
    .await;

    shell.tell(&format!(
        "{BIN} run tty-int --ttl 30s -- sh -c 'echo int-re\"\"ady; sleep 600'\n"
    ));
    shell.shows("int-ready").await;
    shell.runs_in_foreground("sleep").await;
    shell.tell("\x03");
    assert_eq!(shell.status("int-done").await, "130", "128 + SIGINT");
    assert!(!m.inspect("tty-int").await.expect("inspect").held);
    Ok(())
}

/// A job put in the background with `bg` leaves the shell its terminal
/// when its command ends (pglease took it back from the shell before);
/// `bg` then `fg` gives the command the terminal again, and it reads it.
async fn bg_leaves_the_shell_its_terminal_and_fg_gives_it_back() -> Result<(), SetupError> {
    let db = new_db().await;
    let mut shell = Shell::start(&db)?;
    let m = db.manager();
    shell.tell(&format!(
        "{BIN} run tty-bg --ttl 30s -- sh -c 'echo bg-re\"\"ady; sleep 2'\n"
    ));
    shell.shows("bg-ready").await;
    shell.runs_in_foreground("sleep").await;
    shell.tell("\x1a");
    shell.shows("Stopped").await;
    shell.tell("bg\n");
    poll_until("the background job to end", STEP, || async {
        !m.inspect("tty-bg").await.expect("inspect").held
    })
    .await;
    assert_eq!(shell.status("bg-done").await, "0", "the shell reads on");

    shell.tell(&format!(
        "{BIN} run tty-bgfg --ttl 30s -- sh -c 'echo bgfg-re\"\"ady; sleep 2; read a; echo \"got:$a\"'\n"
    ));
    shell.shows("bgfg-ready").await;
    shell.runs_in_foreground("sleep").await;
    shell.tell("\x1a");
    shell.shows("tty-bgfg").await;
    shell.tell("bg\nfg\n");
    shell.tell("after-bg-fg\n");
    shell.shows("got:after-bg-fg").await;
    assert_eq!(shell.status("bgfg-done").await, "0");
    Ok(())
}

/// Ctrl-C at the terminal an `elect`'s command has ends the election
/// (exit 130, resigned) instead of counting as a failure to restart.
async fn ctrl_c_ends_an_election() -> Result<(), SetupError> {
    let db = new_db().await;
    let mut shell = Shell::start(&db)?;
    let m = db.manager();
    shell.tell(&format!(
        "{BIN} elect tty-eint --ttl 30s --max-restarts 5 -- sh -c 'echo eint-re\"\"ady; sleep 600'\n"
    ));
    shell.shows("eint-ready").await;
    shell.runs_in_foreground("sleep").await;
    shell.tell("\x03");
    assert_eq!(shell.status("eint-done").await, "130", "128 + SIGINT");
    assert!(
        !m.inspect("tty-eint").await.expect("inspect").held,
        "resigned"
    );
    let output = shell.output.lock().expect("output").clone();
    assert!(!output.contains("restarting it"), "{output}");
    Ok(())
}

pglease_formations::tests![
    a_command_under_run_or_elect_reads_the_terminal,
    ctrl_z_stops_the_job_and_fg_resumes_it,
    bg_leaves_the_shell_its_terminal_and_fg_gives_it_back,
    ctrl_c_ends_an_election,
];
