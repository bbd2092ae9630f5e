//! A throwaway PostgreSQL cluster made from the server binaries installed
//! on this machine (`initdb`, `postgres`, `pg_ctl`): a temporary
//! directory, a free port of 127.0.0.1, trust authentication for the user
//! `postgres`.
//!
//! Removal does not depend on this process ending well. A small watchdog
//! (`sh`, in a process group of its own so that Ctrl-C in a terminal
//! reaches only this process) runs the server and polls twice a second
//! whether this process still exists; once it is gone (normal exit,
//! panic, Ctrl-C, SIGKILL) the watchdog stops the server (`pg_ctl stop -m
//! immediate`) and deletes the directory. [`TempCluster`]'s `Drop` does
//! the same at once.
//!
//! PostgreSQL refuses to run as root: as root, the programs run as the
//! operating-system user `postgres` (through `runuser`), which gets the
//! directory.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;

use super::host::{self, ServerUser, output};

/// Environment variable naming the directory of `initdb`, `postgres` and
/// `pg_ctl`, when they are not where pglease looks (see
/// [`TempCluster::start`]).
pub const BINDIR_VARIABLE: &str = "PGLEASE_PG_BINDIR";

/// How long the server may take to accept connections once started.
const START_LIMIT: Duration = Duration::from_secs(60);

/// The watchdog: `$0` is a label; then the owner's process id, the bin
/// directory, the cluster's directory, the port, and the command prefix
/// that runs a program as the server's user (empty unless root).
const WATCHDOG: &str = r#"
owner=$1; bin=$2; root=$3; port=$4; shift 4
"$@" "$bin/postgres" -D "$root/data" -p "$port" -k "$root" \
    -c listen_addresses=127.0.0.1 -c max_connections=200 >"$root/server.log" 2>&1 &
server=$!
while kill -0 "$owner" 2>/dev/null && kill -0 "$server" 2>/dev/null; do sleep 0.5; done
"$@" "$bin/pg_ctl" stop -D "$root/data" -m immediate -w -t 30 >/dev/null 2>&1
wait "$server" 2>/dev/null
: >"$root/stopped"
# A server that stopped by itself (a failed start): the owner reads its log
# first.
while kill -0 "$owner" 2>/dev/null; do sleep 0.5; done
rm -rf "$root"
"#;

/// Why a throwaway cluster (or another throwaway server) could not be
/// started.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ClusterError {
    message: String,
    missing: bool,
}

impl ClusterError {
    /// A step that failed.
    pub(crate) fn failed(message: impl Into<String>) -> ClusterError {
        ClusterError {
            message: message.into(),
            missing: false,
        }
    }

    /// Something this machine lacks (binaries, a user to run them as).
    pub(crate) fn missing(message: impl Into<String>) -> ClusterError {
        ClusterError {
            message: message.into(),
            missing: true,
        }
    }

    /// Whether it failed because this machine lacks what it needs (the
    /// server binaries), rather than in a step that ran.
    pub fn is_missing(&self) -> bool {
        self.missing
    }
}

/// A PostgreSQL cluster of its own, started from the installed binaries,
/// removed when dropped (or, at the latest, once this process has exited).
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let cluster = pglease::provision::TempCluster::start().await?;
/// let manager = pglease::LeaseManager::connect_with(
///     cluster.options(),
///     pglease::connect::DEFAULT_TIMEOUT,
/// )
/// .await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TempCluster {
    root: PathBuf,
    bin: PathBuf,
    port: u16,
    version: String,
    user: ServerUser,
    watchdog: Option<Child>,
}

impl TempCluster {
    /// Makes and starts a cluster: `initdb` in a new directory under the
    /// system's temporary directory, then the server on a free port of
    /// 127.0.0.1 (unix socket in that directory), waiting until it
    /// accepts connections (at most 60 s).
    ///
    /// The binaries are looked for in [`BINDIR_VARIABLE`]
    /// (`PGLEASE_PG_BINDIR`), then `pg_config --bindir`, the newest
    /// `/usr/lib/postgresql/*/bin` (Debian, Ubuntu), `/usr/pgsql-*/bin`
    /// (RPM), `/usr/local/pgsql/bin`, Homebrew's, and `PATH`.
    ///
    /// # Errors
    ///
    /// [`ClusterError`] saying what is missing or which step failed, with
    /// its output: no binaries, running as root without a `postgres` user
    /// or `runuser`, `initdb` failing, or a server that did not start. A
    /// start that fails leaves nothing behind.
    ///
    /// # Cancel safety
    ///
    /// Blocking work runs on a blocking thread; cancelled, a started
    /// server is still removed by its watchdog when this process exits.
    pub async fn start() -> Result<TempCluster, ClusterError> {
        // The free port may be taken between the look-up and the server's
        // bind: then once more on another.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut cluster = tokio::task::spawn_blocking(TempCluster::make)
                .await
                .map_err(|e| ClusterError::failed(format!("the set-up thread failed: {e}")))??;
            match cluster.wait_until_ready().await {
                Ok(()) => return Ok(cluster),
                Err(e) if attempt < 3 && e.message.contains("could not bind") => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The directory [`TempCluster::start`] takes the server binaries from,
    /// looked for in the same order: to tell beforehand whether a cluster
    /// can be made here.
    ///
    /// # Errors
    ///
    /// [`ClusterError`] ([`ClusterError::is_missing`]) when there are none.
    pub fn binaries() -> Result<PathBuf, ClusterError> {
        host::find_bindir(&[])
    }

    /// Connect options for its `postgres` database as user `postgres`.
    pub fn options(&self) -> PgConnectOptions {
        host::local_options(self.port)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its directory (data directory `data/`, log `server.log`).
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The server's version, as `postgres --version` prints it.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Keeps the cluster until this process exits (the watchdog removes
    /// it then), instead of removing it when this value is dropped.
    pub(crate) fn keep_until_exit(mut self) -> (PgConnectOptions, String) {
        // The watchdog outlives the handle; it is reaped by nobody, which
        // leaves at most one zombie if it ends before this process.
        drop(self.watchdog.take());
        let kept = (self.options(), self.describe());
        std::mem::forget(self);
        kept
    }

    pub(crate) fn describe(&self) -> String {
        format!(
            "a throwaway cluster ({}) on 127.0.0.1:{} in {}, removed when this process exits",
            self.version,
            self.port,
            self.root.display()
        )
    }

    fn make() -> Result<TempCluster, ClusterError> {
        let bin = host::find_bindir(&[])?;
        let version = output(Command::new(bin.join("postgres")).arg("--version"))
            .map(|v| v.trim().replace("postgres (PostgreSQL) ", "PostgreSQL "))
            .unwrap_or_else(|_| "PostgreSQL".to_owned());
        let user = ServerUser::find()?;
        let root = host::scratch_dir("cluster", &user)?;
        let mut cluster = TempCluster {
            root,
            bin,
            port: 0,
            version,
            user,
            watchdog: None,
        };
        // From here on, a failure removes the directory (Drop).
        let data = cluster.root.join("data");
        let mut initdb = cluster.server_command("initdb");
        initdb.arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "-N",
        ]);
        output(&mut initdb).map_err(|e| ClusterError::failed(format!("initdb failed: {e}")))?;
        cluster.port = host::free_port()?;
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("pglease-cluster")
            .arg(std::process::id().to_string())
            .arg(&cluster.bin)
            .arg(&cluster.root)
            .arg(cluster.port.to_string())
            .args(cluster.user.prefix())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .current_dir(&cluster.root)
            .process_group(0)
            .spawn()
            .map_err(|e| ClusterError::failed(format!("start the server's watchdog (sh): {e}")))?;
        cluster.watchdog = Some(watchdog);
        Ok(cluster)
    }

    async fn wait_until_ready(&mut self) -> Result<(), ClusterError> {
        use sqlx::{ConnectOptions, Connection};
        let started = Instant::now();
        let options = self.options();
        loop {
            let error = match options.connect().await {
                Ok(connection) => {
                    let _ = connection.close().await;
                    return Ok(());
                }
                Err(error) => error,
            };
            let exited = self
                .watchdog
                .as_mut()
                .and_then(|w| w.try_wait().ok().flatten())
                .is_some();
            let log = || std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default();
            // The watchdog marks a server that has stopped; its log says why.
            if exited || self.root.join("stopped").exists() {
                return Err(ClusterError::failed(format!(
                    "the server did not start ({error}); its log:\n{}",
                    log()
                )));
            }
            if started.elapsed() > START_LIMIT {
                return Err(ClusterError::failed(format!(
                    "the server did not accept connections within {START_LIMIT:?} ({error}); \
                     its log:\n{}",
                    log()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn server_command(&self, program: &str) -> Command {
        self.user.command(&self.bin.join(program))
    }
}

impl Drop for TempCluster {
    fn drop(&mut self) {
        if self.watchdog.is_some() {
            let _ = self
                .server_command("pg_ctl")
                .arg("stop")
                .arg("-D")
                .arg(self.root.join("data"))
                .args(["-m", "immediate", "-w", "-t", "30"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
