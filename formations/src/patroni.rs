//! Patroni for failover tests: etcd and two PostgreSQL nodes managed by
//! Patroni (Debian's `patroni` and `etcd-server`), in a temporary
//! directory on free ports of 127.0.0.1, run as `postgres`, with trust
//! authentication. Patroni's defaults, asynchronous replication and
//! `maximum_lag_on_failover` 1 MB among them, except shortened timings
//! ([`FAST_PATRONI`]); PostgreSQL runs with `fsync` off, as the replicated
//! pair does (the tests crash processes, not the machine, so the operating
//! system keeps what was written). Clients connect with the nodes'
//! multi-host URL ([`Patroni::url`]).
//!
//! Each node's replication address (Patroni's `postgresql.connect_address`,
//! which the other node streams from) is a [`Forwarder`] in front of it
//! (its gate), so that a test can hold the stream back ([`Patroni::hold_stream`]) and the
//! commits made meanwhile are really lost when the primary crashes.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use nix::sys::signal::Signal;

use crate::SetupError;
use crate::forward::{Forwarder, Target};
use crate::process::{descendants, find_program, kill_tree, postmaster_pid, signal};
use crate::sync::lock;
use pglease::doctor::PatroniTiming;
use pglease::provision::host::{self, ServerUser};

/// The timings a [`Patroni`] formation asks for: `ttl` 5 s, `loop_wait`
/// 1 s, `retry_timeout` 2 s (Patroni's defaults are 30 s, 10 s and 10 s).
/// A crashed leader is replaced in about 5 s on one machine. Patroni 3.2
/// and later raise `ttl` to 20 s and `retry_timeout` to 3 s at least:
/// [`Patroni::timing`] says what the formation runs with.
pub const FAST_PATRONI: PatroniTiming = PatroniTiming::new(
    Duration::from_secs(5),
    Duration::from_secs(1),
    Duration::from_secs(2),
);

/// One PostgreSQL node of a [`Patroni`] formation, with its Patroni.
#[derive(Debug)]
pub struct PatroniNode {
    name: String,
    dir: PathBuf,
    port: u16,
    rest_port: u16,
    gate: Forwarder,
    patroni: Mutex<Option<Child>>,
}

impl PatroniNode {
    /// `node1` or `node2`, as Patroni names it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its PostgreSQL port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its Patroni REST API, `http://127.0.0.1:PORT`.
    pub fn rest_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.rest_port)
    }

    /// Connect options for its `postgres` database as user `postgres`.
    pub fn options(&self) -> PgConnectOptions {
        host::local_options(self.port)
    }
}

/// etcd and two Patroni nodes, stopped and deleted when dropped (also
/// after a failed assertion). Made on a tokio runtime, which must outlive
/// it (the replication gates run on it).
///
/// ```no_run
/// # async fn f() -> Result<(), pglease::testing::SetupError> {
/// use pglease_formations::Patroni;
///
/// let formation = Patroni::start().await?;
/// let manager = pglease::LeaseManager::connect(&formation.url()).await.unwrap();
/// let old = formation.primary().await?;
/// formation.hold_stream(old); // the standby receives nothing more
/// // ... commits on the primary that the standby will never have ...
/// formation.crash(old)?;
/// let new = formation.wait_for_failover(old).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Patroni {
    root: PathBuf,
    bin: PathBuf,
    patroni: PathBuf,
    etcd: PathBuf,
    user: ServerUser,
    etcd_port: u16,
    etcd_process: Mutex<Option<Child>>,
    nodes: [PatroniNode; 2],
    timing: PatroniTiming,
}

impl Patroni {
    /// Starts etcd, then node1's Patroni (which bootstraps the cluster and
    /// leads), then node2's (which makes itself a replica), and waits
    /// until node1 accepts writes and node2 streams from it.
    ///
    /// # Errors
    ///
    /// [`SetupError::Unavailable`] when `patroni`, `etcd` or the server
    /// binaries are not installed; [`SetupError::Server`] with the log of
    /// the step that failed. A start that fails leaves nothing behind.
    ///
    /// # Cancel safety
    ///
    /// Cancelled, the processes started so far keep running until this
    /// process exits.
    pub async fn start() -> Result<Patroni, SetupError> {
        let patroni = find_program(
            "patroni",
            &[],
            "Patroni is not installed: `apt-get install patroni` (Debian's package)",
        )?;
        let etcd = find_program(
            "etcd",
            &[],
            "etcd is not installed: `apt-get install etcd-server` (Debian's package)",
        )?;
        let bin = host::find_bindir(&["pg_basebackup"])?;
        let user = ServerUser::find()?;
        // The gates first: a failure there leaves no directory behind.
        let gates = [
            Forwarder::start_unpointed().await?,
            Forwarder::start_unpointed().await?,
        ];
        let timing = timing_of(&patroni);
        let root = host::scratch_dir("patroni", &user)?;
        let node = |n: u32, gate: Forwarder| PatroniNode {
            name: format!("node{n}"),
            dir: root.join(format!("node{n}")),
            port: 0,
            rest_port: 0,
            gate,
            patroni: Mutex::new(None),
        };
        let [first, second] = gates;
        let nodes = [node(1, first), node(2, second)];
        let mut formation = Patroni {
            root,
            bin,
            patroni,
            etcd,
            user,
            etcd_port: 0,
            etcd_process: Mutex::new(None),
            nodes,
            timing,
        };
        // From here on, a failure stops and removes everything (Drop).
        formation.start_etcd().await?;
        for index in 0..2 {
            // Each port chosen just before its server binds it.
            let node = &mut formation.nodes[index];
            node.port = host::free_port()?;
            node.rest_port = host::free_port()?;
            node.gate.repoint(Target::port(node.port));
            formation.write_config(index)?;
            formation.run_patroni(index)?;
            if index == 0 {
                formation.wait_writable(0, Duration::from_secs(60)).await?;
            }
        }
        formation.wait_streaming(0, 1).await?;
        Ok(formation)
    }

    /// The nodes' multi-host URL, the way clients of a Patroni cluster
    /// without a proxy connect:
    /// `postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/postgres?target_session_attrs=read-write`.
    pub fn url(&self) -> String {
        format!(
            "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?\
             target_session_attrs=read-write",
            self.nodes[0].port, self.nodes[1].port
        )
    }

    /// Node `index` (0 or 1).
    ///
    /// # Panics
    ///
    /// If `index` is not 0 or 1 (so do the other methods taking one).
    pub fn node(&self, index: usize) -> &PatroniNode {
        &self.nodes[index]
    }

    /// The timings the formation runs with: [`FAST_PATRONI`], or what
    /// Patroni makes of them (3.2 and later raise `ttl` to 20 s and
    /// `retry_timeout` to 3 s at least).
    pub fn timing(&self) -> PatroniTiming {
        self.timing
    }

    /// The node that accepts writes now (Patroni's leader).
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] if neither does.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn primary(&self) -> Result<usize, SetupError> {
        for index in 0..2 {
            if self.writable(index).await {
                return Ok(index);
            }
        }
        Err(SetupError::Server("neither node accepts writes".to_owned()))
    }

    /// Holds back everything node `index` sends to the other over the
    /// replication connection (and what comes back), from now until
    /// [`Patroni::release_stream`] or [`Patroni::crash`]: with Patroni's
    /// asynchronous replication the primary goes on committing, and a
    /// standby that is promoted after the primary's crash never has those
    /// commits.
    pub fn hold_stream(&self, index: usize) {
        self.nodes[index].gate.freeze();
    }

    /// Lets node `index`'s stream flow again (what was held back goes
    /// through).
    pub fn release_stream(&self, index: usize) {
        self.nodes[index].gate.open();
    }

    /// Crashes node `index` as a failed host would leave it: its Patroni
    /// and every PostgreSQL process are stopped first, then killed; what
    /// its stream held back is dropped.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] if the node is not running.
    pub fn crash(&self, index: usize) -> Result<(), SetupError> {
        let node = &self.nodes[index];
        let Some(mut child) = lock(&node.patroni).take() else {
            return Err(SetupError::Server(format!("{} is not running", node.name)));
        };
        let mut pids = vec![child.id()];
        pids.extend(descendants(child.id()));
        // Patroni starts PostgreSQL detached from itself.
        let postmaster = postmaster_pid(&node.dir);
        if let Some(postmaster) = postmaster {
            pids.push(postmaster);
            pids.extend(descendants(postmaster));
        }
        signal(Signal::SIGSTOP, &pids);
        signal(Signal::SIGKILL, &pids);
        let _ = child.wait();
        node.gate.cut();
        // Gone (or a zombie), so that nothing of it answers any more.
        if let Some(postmaster) = postmaster {
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::fs::read_to_string(format!("/proc/{postmaster}/stat"))
                .is_ok_and(|stat| !stat.contains(") Z "))
            {
                if Instant::now() > deadline {
                    return Err(SetupError::Server(format!(
                        "{}'s PostgreSQL survived SIGKILL",
                        node.name
                    )));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            // A dead server's pid file, so that dropping the formation
            // neither waits for a zombie nor signals a process that reused
            // the id.
            let _ = std::fs::remove_file(node.dir.join("postmaster.pid"));
        }
        Ok(())
    }

    /// Waits (up to 60 s) until the node that was not `old` accepts
    /// writes, Patroni having promoted it; returns its index.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] after 60 s, with the end of its Patroni's
    /// log.
    ///
    /// # Panics
    ///
    /// If `old` is not 0 or 1.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn wait_for_failover(&self, old: usize) -> Result<usize, SetupError> {
        let new = 1 - old;
        self.wait_writable(new, Duration::from_secs(60)).await?;
        Ok(new)
    }

    async fn start_etcd(&mut self) -> Result<(), SetupError> {
        self.etcd_port = host::free_port()?;
        let peer = host::free_port()?;
        let client = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer = format!("http://127.0.0.1:{peer}");
        let log = self.log_file("etcd")?;
        let child = self
            .user
            .command(&self.etcd)
            .args(["--name", "etcd", "--data-dir"])
            .arg(self.root.join("etcd"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("etcd={peer}")])
            .args(["--initial-cluster-state", "new"])
            .stdin(Stdio::null())
            .stdout(log.0)
            .stderr(log.1)
            .spawn()
            .map_err(|e| SetupError::Server(format!("start etcd: {e}")))?;
        *lock(&self.etcd_process) = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.etcd_port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                return Err(SetupError::Server(format!(
                    "etcd did not listen within 30 s:\n{}",
                    self.log_tail("etcd")
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Node `index`'s Patroni configuration: Patroni's defaults but for
    /// the timings, etcd's v3 API, no watchdog, trust authentication on
    /// 127.0.0.1, and its replication address the gate in front of it.
    fn write_config(&self, index: usize) -> Result<(), SetupError> {
        let node = &self.nodes[index];
        let root = self.root.display();
        let t = self.timing;
        let config = format!(
            "scope: pglease\n\
             name: {name}\n\
             restapi:\n  listen: 127.0.0.1:{rest}\n  connect_address: 127.0.0.1:{rest}\n\
             etcd3:\n  hosts: 127.0.0.1:{etcd}\n\
             watchdog:\n  mode: 'off'\n\
             bootstrap:\n  dcs:\n    ttl: {ttl}\n    loop_wait: {loop_wait}\n    \
             retry_timeout: {retry}\n    postgresql:\n      parameters:\n        \
             fsync: 'off'\n        max_connections: 40\n        shared_buffers: 16MB\n  \
             initdb:\n    - encoding: UTF8\n    - auth: trust\n  \
             pg_hba:\n    - local all all trust\n    - host all all 127.0.0.1/32 trust\n    \
             - host replication all 127.0.0.1/32 trust\n\
             postgresql:\n  listen: 127.0.0.1:{port}\n  connect_address: 127.0.0.1:{gate}\n  \
             data_dir: {dir}\n  bin_dir: {bin}\n  pgpass: {root}/{name}.pgpass\n  \
             authentication:\n    replication:\n      username: postgres\n    \
             superuser:\n      username: postgres\n  \
             parameters:\n    unix_socket_directories: '{root}'\n",
            name = node.name,
            rest = node.rest_port,
            etcd = self.etcd_port,
            ttl = t.ttl.as_secs(),
            loop_wait = t.loop_wait.as_secs(),
            retry = t.retry_timeout.as_secs(),
            port = node.port,
            gate = node.gate.port(),
            dir = node.dir.display(),
            bin = self.bin.display(),
        );
        let path = self.root.join(format!("{}.yml", node.name));
        std::fs::write(&path, config)
            .map_err(|e| SetupError::Server(format!("write {}: {e}", path.display())))?;
        self.user.give(&path)?;
        Ok(())
    }

    fn run_patroni(&self, index: usize) -> Result<(), SetupError> {
        let node = &self.nodes[index];
        let log = self.log_file(&node.name)?;
        let child = self
            .user
            .command(&self.patroni)
            .arg(self.root.join(format!("{}.yml", node.name)))
            .env_remove("PGHOST")
            .env_remove("PGPORT")
            .env_remove("PGUSER")
            .env_remove("PGDATABASE")
            .stdin(Stdio::null())
            .stdout(log.0)
            .stderr(log.1)
            .spawn()
            .map_err(|e| SetupError::Server(format!("start {}'s Patroni: {e}", node.name)))?;
        *lock(&node.patroni) = Some(child);
        Ok(())
    }

    /// `NAME.log` in the formation's directory, twice (stdout, stderr).
    fn log_file(&self, name: &str) -> Result<(std::fs::File, std::fs::File), SetupError> {
        let path = self.root.join(format!("{name}.log"));
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| SetupError::Server(format!("open {}: {e}", path.display())))
        };
        Ok((open()?, open()?))
    }

    /// The last 30 lines of `NAME.log`.
    fn log_tail(&self, name: &str) -> String {
        let log =
            std::fs::read_to_string(self.root.join(format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    async fn writable(&self, index: usize) -> bool {
        let Ok(pool) = try_pool(&self.nodes[index].options()).await else {
            return false;
        };
        let writable: Result<bool, _> = sqlx::query_scalar(
            "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'",
        )
        .fetch_one(&pool)
        .await;
        pool.close().await;
        writable.unwrap_or(false)
    }

    async fn wait_writable(&self, index: usize, limit: Duration) -> Result<(), SetupError> {
        let deadline = Instant::now() + limit;
        while !self.writable(index).await {
            if Instant::now() > deadline {
                let name = &self.nodes[index].name;
                return Err(SetupError::Server(format!(
                    "{name} did not accept writes within {limit:?}; its Patroni's last \
                     lines:\n{}",
                    self.log_tail(name)
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Waits (up to 60 s) until `primary` has `standby` streaming from it.
    async fn wait_streaming(&self, primary: usize, standby: usize) -> Result<(), SetupError> {
        let name = &self.nodes[standby].name;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(pool) = try_pool(&self.nodes[primary].options()).await {
                let state: Result<Option<String>, _> = sqlx::query_scalar(
                    "SELECT state FROM pg_stat_replication WHERE application_name = $1",
                )
                .bind(name)
                .fetch_optional(&pool)
                .await;
                pool.close().await;
                if matches!(state, Ok(Some(ref s)) if s == "streaming") {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(SetupError::Server(format!(
                    "{name} did not stream within 60 s; its Patroni's last lines:\n{}",
                    self.log_tail(name)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Patroni {
    fn drop(&mut self) {
        // Patroni first, so that none restarts its server; etcd last.
        for slot in self
            .nodes
            .iter()
            .map(|n| &n.patroni)
            .chain(std::iter::once(&self.etcd_process))
        {
            if let Some(mut child) = lock(slot).take() {
                kill_tree(&mut child);
            }
        }
        for node in &self.nodes {
            if postmaster_pid(&node.dir).is_some() {
                let _ = self
                    .user
                    .command(&self.bin.join("pg_ctl"))
                    .arg("-D")
                    .arg(&node.dir)
                    .args(["stop", "-m", "immediate", "-w", "-t", "30"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

async fn try_pool(options: &PgConnectOptions) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(options.clone())
        .await
}

/// What Patroni at `program` makes of [`FAST_PATRONI`]: from 3.2 on it
/// raises `ttl` to 20 s and `retry_timeout` to 3 s at least.
fn timing_of(program: &std::path::Path) -> PatroniTiming {
    let version = std::process::Command::new(program)
        .arg("--version")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default();
    // "patroni 3.0.2"
    let mut numbers = version
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    let mut timing = FAST_PATRONI;
    if (major, minor) >= (3, 2) {
        timing.ttl = timing.ttl.max(Duration::from_secs(20));
        timing.retry_timeout = timing.retry_timeout.max(Duration::from_secs(3));
    }
    timing
}
