//! A replicated PostgreSQL for failover tests: a primary and a streaming
//! standby made from the server binaries installed on this machine
//! (`initdb`, `pg_ctl`, `pg_basebackup` in the packages' versioned bin
//! directory), in a temporary directory, on free ports of 127.0.0.1, with
//! trust authentication. Removed on drop, also after a failed assertion.
//!
//! The servers run as the `postgres` operating-system user when the tests
//! run as root (PostgreSQL refuses to run as root).

#![allow(dead_code)] // each test binary uses a different part of this file

#[path = "as_postgres.rs"]
mod as_postgres;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pglease::sqlx;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// How the standby acknowledges commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standby {
    /// Named in `synchronous_standby_names`: a commit returns once the
    /// standby has flushed it (with the default `synchronous_commit`).
    Synchronous,
    /// Streaming only: a commit returns before the standby has it.
    Asynchronous,
}

/// One server of the pair.
pub struct Node {
    pub name: &'static str,
    pub dir: PathBuf,
    pub port: u16,
}

impl Node {
    /// Connect options for this server's `postgres` database.
    pub fn options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
    }

    /// A small pool on this server.
    pub async fn pool(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(self.options())
            .await
            .unwrap_or_else(|e| panic!("connect to the {}: {e}", self.name))
    }

    /// The postmaster's process id, from `postmaster.pid`.
    fn postmaster(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }
}

/// A primary and a streaming standby, stopped and deleted on drop.
pub struct Replicated {
    root: PathBuf,
    bin: PathBuf,
    pub primary: Node,
    pub standby: Node,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The bin directory of the newest PostgreSQL installed from packages.
pub fn server_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// A server binary as a command, run as `postgres` when we are root.
fn server_command(bin: &Path, program: &str) -> Command {
    as_postgres::command(&bin.join(program))
}

/// Runs a server binary; panics with its output if it fails.
fn run(bin: &Path, program: &str, args: &[&str]) {
    let output = server_command(bin, program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    file.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

impl Replicated {
    /// Starts a primary and a standby streaming from it, and waits until
    /// the standby streams (and, if synchronous, is the synchronous one).
    /// `None` when no PostgreSQL binaries are installed; then the caller
    /// skips, unless `PGLEASE_TEST_REQUIRE_CLUSTER` is set (as `.ci/run`
    /// does), where it panics.
    pub async fn start(standby: Standby) -> Option<Replicated> {
        let Some(bin) = server_bin() else {
            assert!(
                std::env::var_os("PGLEASE_TEST_REQUIRE_CLUSTER").is_none(),
                "no PostgreSQL server binaries under /usr/lib/postgresql"
            );
            eprintln!("skipped: no PostgreSQL server binaries under /usr/lib/postgresql");
            return None;
        };
        let root = std::env::temp_dir().join(format!(
            "pglease-cluster-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("create the cluster directory");
        as_postgres::give(&[&root]);
        let mut cluster = Replicated {
            primary: Node {
                name: "primary",
                dir: root.join("primary"),
                port: as_postgres::free_port(),
            },
            standby: Node {
                name: "standby",
                dir: root.join("standby"),
                port: as_postgres::free_port(),
            },
            root,
            bin,
        };
        let primary = &cluster.primary;
        let dir = primary.dir.to_str().expect("a UTF-8 path");
        run(
            &cluster.bin,
            "initdb",
            &[
                "-D",
                dir,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        let sync_names = match standby {
            Standby::Synchronous => "'standby'",
            Standby::Asynchronous => "''",
        };
        append(
            &primary.dir.join("postgresql.conf"),
            &format!(
                "\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
                 wal_level = replica\nmax_wal_senders = 4\nsynchronous_standby_names = {sync_names}\n\
                 fsync = off\nshared_buffers = 16MB\nmax_connections = 40\n",
                primary.port,
                cluster.root.display()
            ),
        );
        cluster.pg_ctl(primary, &["start", "-w", "-t", "60"]);
        let standby_dir = cluster.standby.dir.to_str().expect("a UTF-8 path");
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres application_name=standby",
            primary.port
        );
        run(
            &cluster.bin,
            "pg_basebackup",
            &[
                "-d",
                &conninfo,
                "-D",
                standby_dir,
                "-R",
                "-X",
                "stream",
                "--no-sync",
            ],
        );
        // Chosen now rather than with the primary's: a port chosen seconds
        // earlier can meanwhile be taken as the local end of an outgoing
        // connection (same ephemeral range), and the standby then cannot
        // bind it (seen once in CI).
        cluster.standby.port = as_postgres::free_port();
        append(
            &cluster.standby.dir.join("postgresql.conf"),
            // Once promoted it has no standby of its own: it must not wait
            // for one (a failover manager clears this on promotion too).
            &format!(
                "\nport = {}\nsynchronous_standby_names = ''\n",
                cluster.standby.port
            ),
        );
        cluster.pg_ctl(&cluster.standby, &["start", "-w", "-t", "60"]);

        let pool = primary.pool().await;
        let wanted = match standby {
            Standby::Synchronous => "sync",
            Standby::Asynchronous => "async",
        };
        let streaming = format!("streaming {wanted}");
        until(
            &pool,
            "SELECT coalesce((SELECT state || ' ' || sync_state FROM pg_stat_replication \
                               WHERE application_name = 'standby'), 'not connected')",
            &format!("the standby streaming as {wanted}"),
            |state: &String| *state == streaming,
        )
        .await;
        pool.close().await;
        Some(cluster)
    }

    fn pg_ctl(&self, node: &Node, args: &[&str]) {
        let dir = node.dir.to_str().expect("a UTF-8 path");
        let log = self.root.join(format!("{}.log", node.name));
        let log = log.to_str().expect("a UTF-8 path");
        let mut all = vec!["-D", dir, "-l", log];
        all.extend_from_slice(args);
        run(&self.bin, "pg_ctl", &all);
    }

    /// Kills every process of the primary at once, without warning: the
    /// postmaster is stopped first (so it forks nothing more), then its
    /// children and itself get SIGKILL.
    pub fn crash_primary(&self) {
        let Some(pid) = self.primary.postmaster() else {
            panic!("the primary is not running");
        };
        let postmaster = Pid::from_raw(pid);
        let _ = kill(postmaster, Signal::SIGSTOP);
        for child in children(pid) {
            let _ = kill(Pid::from_raw(child), Signal::SIGKILL);
        }
        let _ = kill(postmaster, Signal::SIGKILL);
        // Wait until it is gone, so that nothing of it answers any more.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| stat.contains(") Z "))
        {
            assert!(Instant::now() < deadline, "the primary survived SIGKILL");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the standby (`stop = true`), or starts it again. While it is
    /// stopped an asynchronous standby falls behind by everything the
    /// primary commits; started again after the primary has gone, it
    /// keeps only what it had received.
    pub fn stop_standby(&self, stop: bool) {
        if stop {
            self.pg_ctl(&self.standby, &["stop", "-m", "fast", "-w", "-t", "60"]);
        } else {
            self.pg_ctl(&self.standby, &["start", "-w", "-t", "60"]);
        }
    }

    /// Waits until the standby has replayed everything the primary has
    /// written so far (an asynchronous standby may lag behind).
    pub async fn wait_for_replay(&self) {
        let primary = self.primary.pool().await;
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&primary)
            .await
            .expect("read the primary's WAL position");
        primary.close().await;
        let standby = self.standby.pool().await;
        until(
            &standby,
            &format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
            &format!("the standby replaying up to {lsn}"),
            |replayed: &bool| *replayed,
        )
        .await;
        standby.close().await;
    }

    /// Promotes the standby and waits until it accepts writes.
    pub async fn promote(&self) {
        self.pg_ctl(&self.standby, &["promote", "-w", "-t", "60"]);
        let pool = self.standby.pool().await;
        until(
            &pool,
            "SELECT pg_is_in_recovery()",
            "the standby promoted",
            |recovering: &bool| !*recovering,
        )
        .await;
        pool.close().await;
    }
}

/// Reads the one value `query` answers on `pool` every 20 ms until `done`
/// accepts it; panics after 30 s, saying what it waited for and the last
/// value read.
async fn until<T>(pool: &PgPool, query: &str, what: &str, done: impl Fn(&T) -> bool)
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + std::fmt::Debug,
    T: Send + Unpin,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let value: T = sqlx::query_scalar(sqlx::AssertSqlSafe(query.to_owned()))
            .fetch_one(pool)
            .await
            .unwrap_or_else(|e| panic!("waiting for {what}: {query}: {e}"));
        if done(&value) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "waited 30 s for {what}; last read: {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The processes whose parent is `pid`.
fn children(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let child: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            // "pid (comm) state ppid ...": comm may hold spaces, so split
            // after its closing parenthesis.
            let rest = &stat[stat.rfind(')')? + 1..];
            let ppid: i32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

impl Drop for Replicated {
    fn drop(&mut self) {
        for node in [&self.standby, &self.primary] {
            if node.postmaster().is_some() {
                let dir = node.dir.to_str().unwrap_or_default();
                // Not `run`: a failure here must not panic in a drop.
                let _ = server_command(&self.bin, "pg_ctl")
                    .args(["-D", dir, "stop", "-m", "immediate", "-w", "-t", "30"])
                    .output();
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A stable endpoint in front of the pair, as a virtual address or a
/// pooler would be: a TCP proxy on a port of its own that forwards every
/// new connection to the current target. Re-pointing it drops the
/// connections it carries, so that clients reconnect to the new target.
pub struct Endpoint {
    pub port: u16,
    target: std::sync::Arc<std::sync::atomic::AtomicU16>,
    connections: std::sync::Arc<std::sync::Mutex<tokio::task::JoinSet<()>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    /// Starts forwarding to `target` (a port on 127.0.0.1).
    pub async fn start(target: u16) -> Endpoint {
        use std::sync::atomic::AtomicU16;
        use std::sync::{Arc, Mutex};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the endpoint");
        let port = listener.local_addr().expect("its address").port();
        let target = Arc::new(AtomicU16::new(target));
        let connections = Arc::new(Mutex::new(tokio::task::JoinSet::new()));
        let accept = tokio::spawn({
            let (target, connections) = (target.clone(), connections.clone());
            async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    let port = target.load(Ordering::SeqCst);
                    connections.lock().expect("connections").spawn(async move {
                        if let Ok(mut server) =
                            tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                        {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                }
            }
        });
        Endpoint {
            port,
            target,
            connections,
            accept,
        }
    }

    /// Forwards new connections to `target` and drops the current ones.
    pub fn repoint(&self, target: u16) {
        self.target.store(target, Ordering::SeqCst);
        self.connections.lock().expect("connections").abort_all();
    }

    /// Connect options through the endpoint.
    pub fn options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.accept.abort();
        self.connections.lock().expect("connections").abort_all();
    }
}
