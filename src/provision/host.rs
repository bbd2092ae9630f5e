//! What every throwaway server shares ([`TempCluster`](super::TempCluster),
//! and any server a test starts from the installed packages, as pglease's
//! own formations do): finding the server binaries, running a program as
//! the `postgres` user when this process is root (PostgreSQL and PgBouncer
//! refuse to run as root), scratch directories, and free ports of
//! 127.0.0.1.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::cluster::{BINDIR_VARIABLE, ClusterError};

/// How this process runs the servers' programs: directly, or through
/// `runuser -u postgres --` when it is root.
#[derive(Debug, Clone)]
pub struct ServerUser {
    prefix: Vec<String>,
}

impl ServerUser {
    /// Directly, unless this process is root; then as `postgres`, which
    /// must exist.
    ///
    /// # Errors
    ///
    /// [`ClusterError`] when running as root without a `postgres` user.
    pub fn find() -> Result<ServerUser, ClusterError> {
        let uid = output(Command::new("id").arg("-u"))?;
        if uid.trim() != "0" {
            return Ok(ServerUser { prefix: Vec::new() });
        }
        if output(Command::new("id").args(["-u", "postgres"])).is_err() {
            return Err(ClusterError::failed(
                "running as root, and PostgreSQL refuses to run as root; there is no \
                 `postgres` user to run it as",
            ));
        }
        Ok(ServerUser {
            prefix: ["runuser", "-u", "postgres", "--"]
                .map(str::to_owned)
                .to_vec(),
        })
    }

    /// The words that go before a program to run it as the server's user
    /// (none unless root).
    pub fn prefix(&self) -> &[String] {
        &self.prefix
    }

    /// `program` as a command run as the server's user, from `/` (a
    /// directory that user may enter).
    pub fn command(&self, program: &Path) -> Command {
        let mut command = match self.prefix.split_first() {
            Some((runner, args)) => {
                let mut command = Command::new(runner);
                command.args(args).arg(program);
                command
            }
            None => Command::new(program),
        };
        command.current_dir("/");
        command
    }

    /// Gives `path` to the server's user (nothing to do unless root).
    ///
    /// # Errors
    ///
    /// [`ClusterError`] if `chown` fails.
    pub fn give(&self, path: &Path) -> Result<(), ClusterError> {
        if self.prefix.is_empty() {
            return Ok(());
        }
        let id = |flag: &str| -> Result<u32, ClusterError> {
            output(Command::new("id").args([flag, "postgres"]))?
                .trim()
                .parse()
                .map_err(|e| ClusterError::failed(format!("id {flag} postgres: {e}")))
        };
        let (uid, gid) = (id("-u")?, id("-g")?);
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| {
            ClusterError::failed(format!("give {} to the postgres user: {e}", path.display()))
        })
    }
}

/// Runs `command`; its standard output.
///
/// # Errors
///
/// [`ClusterError`] with what it printed, if it cannot start or fails.
pub fn output(command: &mut Command) -> Result<String, ClusterError> {
    let program = command.get_program().to_string_lossy().into_owned();
    let out = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ClusterError::failed(format!("run {program}: {e}")))?;
    if !out.status.success() {
        return Err(ClusterError::failed(format!(
            "{program} exited with {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The directory holding `initdb`, `postgres`, `pg_ctl` and the other
/// `programs`.
///
/// # Errors
///
/// [`ClusterError`] (missing: [`ClusterError::is_missing`]) saying where
/// it looked and how to install them.
pub fn find_bindir(programs: &[&str]) -> Result<PathBuf, ClusterError> {
    let needed: Vec<&str> = ["initdb", "postgres", "pg_ctl"]
        .iter()
        .chain(programs)
        .copied()
        .collect();
    let complete = |dir: &Path| needed.iter().all(|p| dir.join(p).is_file());
    let wanted = || needed.join(", ");
    // When set, it is the only place looked at.
    if let Some(dir) = std::env::var_os(BINDIR_VARIABLE) {
        let dir = PathBuf::from(dir);
        if complete(&dir) {
            return Ok(dir);
        }
        return Err(ClusterError::missing(format!(
            "{BINDIR_VARIABLE}={} does not hold {} (when set, it is the only directory \
             looked at)",
            dir.display(),
            wanted()
        )));
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(dir) = output(Command::new("pg_config").arg("--bindir")) {
        candidates.push(PathBuf::from(dir.trim()));
    }
    // Versioned directories, newest first.
    for (parent, prefix, suffix) in [
        ("/usr/lib/postgresql", "", "bin"),
        ("/usr", "pgsql-", "bin"),
        ("/opt/homebrew/opt", "postgresql@", "bin"),
        ("/usr/local/opt", "postgresql@", "bin"),
    ] {
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(parent)
            .into_iter()
            .flatten()
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let name = entry.file_name().into_string().ok()?;
                let version: u32 = name.strip_prefix(prefix)?.split('.').next()?.parse().ok()?;
                Some((version, entry.path().join(suffix)))
            })
            .collect();
        versions.sort_by_key(|v| std::cmp::Reverse(v.0));
        candidates.extend(versions.into_iter().map(|(_, dir)| dir));
    }
    candidates.push(PathBuf::from("/usr/local/pgsql/bin"));
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    candidates
        .into_iter()
        .find(|dir| complete(dir))
        .ok_or_else(|| {
            ClusterError::missing(format!(
                "no PostgreSQL server binaries ({}) found: install the server package (e.g. \
                 `apt-get install postgresql`) or set {BINDIR_VARIABLE}",
                wanted()
            ))
        })
}

/// Connect options for the `postgres` database as user `postgres` of a
/// throwaway server on `port` of 127.0.0.1 (trust authentication).
pub fn local_options(port: u16) -> sqlx::postgres::PgConnectOptions {
    sqlx::postgres::PgConnectOptions::new()
        .host("127.0.0.1")
        .port(port)
        .username("postgres")
        .database("postgres")
}

/// A port of 127.0.0.1 that nothing listens on right now.
///
/// # Errors
///
/// [`ClusterError`] if no port can be bound.
pub fn free_port() -> Result<u16, ClusterError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| ClusterError::failed(format!("find a free port on 127.0.0.1: {e}")))
}

/// A new directory for a server under the system's temporary directory,
/// named `pglease-KIND-PID-N-NANOS` (unique also across runs that reuse a
/// process id), given to the server's user.
///
/// # Errors
///
/// [`ClusterError`] if it cannot be made or given.
pub fn scratch_dir(kind: &str, user: &ServerUser) -> Result<PathBuf, ClusterError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let root = std::env::temp_dir().join(format!(
        "pglease-{kind}-{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    ));
    std::fs::create_dir(&root)
        .map_err(|e| ClusterError::failed(format!("create {}: {e}", root.display())))?;
    if let Err(e) = user.give(&root) {
        let _ = std::fs::remove_dir_all(&root);
        return Err(e);
    }
    Ok(root)
}
