//! PgBouncer in transaction mode in front of a server, for tests of what
//! a transaction pooler does to sessions: started from the installed
//! `pgbouncer` (Debian's and Ubuntu's package `pgbouncer`), on a free port
//! of 127.0.0.1, with its configuration in a temporary directory; stopped
//! and removed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;

use crate::SetupError;
use pglease::provision::host::{self, ServerUser};

/// A running PgBouncer with `pool_mode = transaction` (or `session`, see
/// [`PgBouncerBuilder::session_mode`]), `auth_type = trust`, every
/// database of one server behind it.
///
/// ```no_run
/// # async fn f(server: sqlx::postgres::PgConnectOptions) -> Result<(), pglease::testing::SetupError> {
/// use pglease_formations::PgBouncer;
///
/// let bouncer = PgBouncer::builder().start(&server)?;
/// let through = bouncer.options(&server); // same user and database, via PgBouncer
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    dir: PathBuf,
    child: Child,
}

/// How to start a [`PgBouncer`]: [`PgBouncer::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct PgBouncerBuilder {
    server_pool: u32,
    users: Vec<String>,
    pool_mode: &'static str,
}

impl PgBouncer {
    /// Server connections per database and user by default: fewer than a
    /// test's pools, so that clients share server sessions.
    pub const DEFAULT_SERVER_POOL: u32 = 3;

    /// A builder with [`PgBouncer::DEFAULT_SERVER_POOL`] server connections
    /// and only the server's own user.
    pub fn builder() -> PgBouncerBuilder {
        PgBouncerBuilder {
            server_pool: PgBouncer::DEFAULT_SERVER_POOL,
            users: Vec::new(),
            pool_mode: "transaction",
        }
    }

    /// The installed `pgbouncer`, if any.
    pub fn binary() -> Option<PathBuf> {
        let mut candidates: Vec<PathBuf> = [
            "/usr/sbin/pgbouncer",
            "/usr/bin/pgbouncer",
            "/usr/local/bin/pgbouncer",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        if let Some(path) = std::env::var_os("PATH") {
            candidates.extend(std::env::split_paths(&path).map(|dir| dir.join("pgbouncer")));
        }
        candidates.into_iter().find(|p| p.is_file())
    }

    /// The installed PgBouncer's version, such as `1.18.0`.
    pub fn version() -> Option<String> {
        let out = Command::new(PgBouncer::binary()?)
            .arg("--version")
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let first = text.lines().next()?;
        Some(first.trim_start_matches("PgBouncer ").to_owned())
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `server`'s options, re-pointed at PgBouncer (same user, database
    /// and everything else).
    pub fn options(&self, server: &PgConnectOptions) -> PgConnectOptions {
        server.clone().host("127.0.0.1").port(self.port)
    }

    /// PgBouncer's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl PgBouncerBuilder {
    /// Server connections per database and user.
    pub fn server_pool(mut self, connections: u32) -> Self {
        self.server_pool = connections;
        self
    }

    /// `pool_mode = session` instead of `transaction`: each client keeps
    /// its server session until it disconnects.
    pub fn session_mode(mut self) -> Self {
        self.pool_mode = "session";
        self
    }

    /// Lets `user` log in too (without a password: the server must trust
    /// it, as a test server does).
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.users.push(user.into());
        self
    }

    /// Starts PgBouncer in front of the server `server` points at (its
    /// host, port and user; every database of it) and waits until it
    /// accepts connections (at most 20 s).
    ///
    /// # Errors
    ///
    /// [`SetupError::Unavailable`] when PgBouncer is not installed;
    /// [`SetupError::Server`] when it does not start, with its log.
    pub fn start(self, server: &PgConnectOptions) -> Result<PgBouncer, SetupError> {
        let Some(binary) = PgBouncer::binary() else {
            return Err(SetupError::Unavailable(
                "needs PgBouncer, which is not installed here (apt-get install pgbouncer)"
                    .to_owned(),
            ));
        };
        let user = ServerUser::find()?;
        let dir = host::scratch_dir("pgbouncer", &user)?;
        let port = match host::free_port() {
            Ok(port) => port,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.into());
            }
        };
        let users: String = std::iter::once(server.get_username())
            .chain(self.users.iter().map(String::as_str))
            .map(|user| format!("\"{user}\" \"\"\n"))
            .collect();
        let config = format!(
            "[databases]\n\
             * = host={host} port={server_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/users.txt\n\
             pool_mode = {pool_mode}\n\
             default_pool_size = {sessions}\n\
             max_client_conn = 500\n\
             ignore_startup_parameters = extra_float_digits\n\
             logfile = {dir}/pgbouncer.log\n\
             pidfile = {dir}/pgbouncer.pid\n",
            host = server.get_host(),
            server_port = server.get_port(),
            dir = dir.display(),
            sessions = self.server_pool,
            pool_mode = self.pool_mode,
        );
        let written = write(&dir.join("users.txt"), &users, &user)
            .and_then(|()| write(&dir.join("pgbouncer.ini"), &config, &user));
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        let child = match user
            .command(&binary)
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(SetupError::Server(format!(
                    "start {}: {e}",
                    binary.display()
                )));
            }
        };
        // From here on, a failure stops and removes it (Drop).
        let bouncer = PgBouncer { port, dir, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(SetupError::Server(format!(
                    "PgBouncer did not listen within 20 s; its log:\n{}",
                    bouncer.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(bouncer)
    }
}

fn write(path: &Path, text: &str, user: &ServerUser) -> Result<(), SetupError> {
    std::fs::write(path, text)
        .map_err(|e| SetupError::Server(format!("write {}: {e}", path.display())))?;
    Ok(user.give(path)?)
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        // SIGTERM (runuser forwards it), on which PgBouncer exits at once.
        crate::process::signal(nix::sys::signal::Signal::SIGTERM, &[self.child.id()]);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
