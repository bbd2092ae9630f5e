//! PgBouncer in transaction mode in front of the test server: started from
//! the `pgbouncer` binary installed from the distribution's package, on a
//! free port of 127.0.0.1, with a configuration in a temporary directory;
//! stopped and removed on drop, also after a failed assertion.
//!
//! It runs as the `postgres` operating-system user when the tests run as
//! root (PgBouncer refuses to run as root).

#![allow(dead_code)] // each test binary uses a different part of this file

#[path = "as_postgres.rs"]
mod as_postgres;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pglease::sqlx;
use sqlx::postgres::PgConnectOptions;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// How many server connections PgBouncer keeps per database and user:
/// fewer than the clients' pools, so that clients share server sessions.
pub const SERVER_POOL: u32 = 3;

/// A running PgBouncer, `pool_mode = transaction`.
pub struct Bouncer {
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

/// The installed `pgbouncer`, if any.
pub fn binary() -> Option<PathBuf> {
    [
        "/usr/sbin/pgbouncer",
        "/usr/bin/pgbouncer",
        "/usr/local/bin/pgbouncer",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// The installed PgBouncer's version, e.g. "1.18.0".
pub fn version() -> String {
    binary()
        .and_then(|binary| Command::new(binary).arg("--version").output().ok())
        .and_then(|out| {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let first = text.lines().next()?.to_owned();
            Some(first.trim_start_matches("PgBouncer ").to_owned())
        })
        .unwrap_or_else(|| "(unknown version)".to_owned())
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

impl Bouncer {
    /// Starts PgBouncer in front of the server `server` points at (host,
    /// port and user; every database of it) and waits until it accepts
    /// connections. `None` when PgBouncer is not installed; then the caller
    /// skips, unless `PGLEASE_TEST_REQUIRE_PGBOUNCER` is set (as `.ci/run`
    /// does), where it panics.
    pub fn start(server: &PgConnectOptions) -> Option<Bouncer> {
        Bouncer::launch(server, SERVER_POOL, &[])
    }

    /// Like [`Bouncer::start`], with `sessions` server connections per
    /// database and user.
    pub fn with_server_pool(server: &PgConnectOptions, sessions: u32) -> Option<Bouncer> {
        Bouncer::launch(server, sessions, &[])
    }

    /// Like [`Bouncer::start`], also letting `users` log in (without a
    /// password: the test server trusts them).
    pub fn with_users(server: &PgConnectOptions, users: &[&str]) -> Option<Bouncer> {
        Bouncer::launch(server, SERVER_POOL, users)
    }

    fn launch(server: &PgConnectOptions, sessions: u32, users: &[&str]) -> Option<Bouncer> {
        let Some(binary) = binary() else {
            assert!(
                std::env::var_os("PGLEASE_TEST_REQUIRE_PGBOUNCER").is_none(),
                "pgbouncer is not installed (apt-get install pgbouncer)"
            );
            eprintln!("skipped: pgbouncer is not installed");
            return None;
        };
        let dir = std::env::temp_dir().join(format!(
            "pglease-pgbouncer-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the pgbouncer directory");
        let port = as_postgres::free_port();
        let user = server.get_username();
        let users: String = std::iter::once(user)
            .chain(users.iter().copied())
            .map(|user| format!("\"{user}\" \"\"\n"))
            .collect();
        write(&dir.join("users.txt"), &users);
        write(
            &dir.join("pgbouncer.ini"),
            &format!(
                "[databases]\n\
                 * = host={host} port={server_port}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {dir}/users.txt\n\
                 pool_mode = transaction\n\
                 default_pool_size = {sessions}\n\
                 max_client_conn = 500\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 logfile = {dir}/pgbouncer.log\n\
                 pidfile = {dir}/pgbouncer.pid\n",
                host = server.get_host(),
                server_port = server.get_port(),
                dir = dir.display(),
            ),
        );
        as_postgres::give(&[&dir, &dir.join("users.txt"), &dir.join("pgbouncer.ini")]);
        let mut command = as_postgres::command(&binary);
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let bouncer = Bouncer { port, dir, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not listen within 20 s:\n{}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(bouncer)
    }

    /// `server`'s options, re-pointed at PgBouncer (same user and database).
    pub fn options(&self, server: &PgConnectOptions) -> PgConnectOptions {
        server.clone().host("127.0.0.1").port(self.port)
    }

    /// PgBouncer's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        // runuser forwards SIGTERM to pgbouncer, which then exits at once.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
