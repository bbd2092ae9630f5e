//! pg_auto_failover for failover tests: a monitor and two PostgreSQL nodes
//! with its default synchronous replication (`ANY 1`), started with
//! `pg_autoctl` (Debian's `postgresql-15-auto-failover`) in a temporary
//! directory on free ports of 127.0.0.1, with trust authentication; the
//! monitor's and keepers' timeouts shortened ([`FAST`]). Clients connect
//! as pg_auto_failover's own do: with the formation's multi-host URL
//! ([`AutoFailover::url`]). The test crashes the primary; the monitor
//! notices and promotes the other node.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use nix::sys::signal::Signal;

use crate::SetupError;
use crate::process::{descendants, find_program, kill_tree, signal};
use crate::sync::lock;
use pglease::provision::host::{self, ServerUser};

/// The failover timeouts an [`AutoFailover`] runs with (pg_auto_failover's
/// defaults in brackets). The monitor's
/// `pgautofailover.health_check_period`, `health_check_timeout`,
/// `health_check_max_retries`, `health_check_retry_delay`,
/// `node_considered_unhealthy_timeout` and `primary_demote_timeout`, and
/// the keepers' `timeout.network_partition_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `pgautofailover.health_check_period` (5 s).
    pub health_check_period: Duration,
    /// `pgautofailover.health_check_timeout` (5 s).
    pub health_check_timeout: Duration,
    /// `pgautofailover.health_check_max_retries` (2).
    pub health_check_max_retries: u32,
    /// `pgautofailover.health_check_retry_delay` (2 s).
    pub health_check_retry_delay: Duration,
    /// `pgautofailover.node_considered_unhealthy_timeout` (20 s).
    pub node_considered_unhealthy_timeout: Duration,
    /// `pgautofailover.primary_demote_timeout` (30 s).
    pub primary_demote_timeout: Duration,
    /// The keepers' `timeout.network_partition_timeout` (20 s).
    pub network_partition_timeout: Duration,
}

/// Shortened timeouts for tests: a crashed primary is replaced in about
/// 5-6 s on one machine (measured in docs/design.md, "Failover").
pub const FAST: Timeouts = Timeouts {
    health_check_period: Duration::from_secs(1),
    health_check_timeout: Duration::from_secs(1),
    health_check_max_retries: 1,
    health_check_retry_delay: Duration::from_millis(500),
    node_considered_unhealthy_timeout: Duration::from_secs(2),
    primary_demote_timeout: Duration::from_secs(3),
    network_partition_timeout: Duration::from_secs(2),
};

/// Where `pg_autoctl` keeps its socket files: the distribution's default
/// for PostgreSQL (the nodes' servers use it; `pg_autoctl` gives them no
/// other).
const SOCKET_DIR: &str = "/var/run/postgresql";

/// One data node of an [`AutoFailover`] formation.
#[derive(Debug)]
pub struct AutoNode {
    name: String,
    dir: PathBuf,
    port: u16,
    keeper: Mutex<Option<Child>>,
}

impl AutoNode {
    /// `node1` or `node2`, as the monitor names it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Connect options for its `postgres` database as user `postgres`.
    pub fn options(&self) -> PgConnectOptions {
        host::local_options(self.port)
    }

    /// The postmaster's process id, from `postmaster.pid`.
    fn postmaster(&self) -> Option<u32> {
        crate::process::postmaster_pid(&self.dir)
    }
}

/// A pg_auto_failover monitor and two nodes, stopped and deleted when
/// dropped (also after a failed assertion).
///
/// ```no_run
/// # async fn f() -> Result<(), pglease::testing::SetupError> {
/// use pglease_formations::AutoFailover;
///
/// let formation = AutoFailover::start().await?;
/// let manager = pglease::LeaseManager::connect(&formation.url()).await.unwrap();
/// let old = formation.primary().await?;
/// formation.crash(old)?;
/// let new = formation.wait_for_failover(old).await?;
/// formation.rejoin(old).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct AutoFailover {
    root: PathBuf,
    bin: PathBuf,
    autoctl: PathBuf,
    user: ServerUser,
    monitor_dir: PathBuf,
    monitor_port: u16,
    monitor: Mutex<Option<Child>>,
    nodes: [AutoNode; 2],
}

impl AutoFailover {
    /// Starts a monitor with [`FAST`] timeouts and two nodes, and waits
    /// until one is `primary` and the other `secondary` (a synchronous
    /// standby).
    ///
    /// # Errors
    ///
    /// [`SetupError::Unavailable`] when `pg_autoctl` or the server
    /// binaries are not installed; [`SetupError::Server`] with the output
    /// of the step that failed. A start that fails leaves nothing behind.
    ///
    /// # Cancel safety
    ///
    /// Cancelled, the processes started so far keep running until this
    /// process exits.
    pub async fn start() -> Result<AutoFailover, SetupError> {
        let autoctl = find_autoctl()?;
        let bin = host::find_bindir(&["pg_basebackup", "pg_rewind"])?;
        monitor_extension(&bin)?;
        if !Path::new(SOCKET_DIR).is_dir() {
            return Err(SetupError::Unavailable(format!(
                "pg_autoctl's servers put their sockets in {SOCKET_DIR}, which does not exist \
                 (it comes with the distribution's PostgreSQL packages)"
            )));
        }
        let user = ServerUser::find()?;
        let root = host::scratch_dir("autofailover", &user)?;
        let node = |n: u32| AutoNode {
            name: format!("node{n}"),
            dir: root.join(format!("node{n}")),
            port: 0,
            keeper: Mutex::new(None),
        };
        let mut formation = AutoFailover {
            monitor_dir: root.join("monitor"),
            monitor_port: host::free_port()?,
            monitor: Mutex::new(None),
            nodes: [node(1), node(2)],
            root,
            bin,
            autoctl,
            user,
        };
        // From here on, a failure stops and removes everything (Drop).
        formation.start_monitor().await?;
        for index in 0..2 {
            // Each port chosen just before its server binds it.
            formation.nodes[index].port = host::free_port()?;
            formation.start_node(index)?;
            let (reported, goal) = if index == 0 {
                ("single", "single")
            } else {
                ("secondary", "secondary")
            };
            formation.wait_for_state(index, reported, goal).await?;
        }
        formation.wait_for_state(0, "primary", "primary").await?;
        Ok(formation)
    }

    /// The formation's URL, as `pg_autoctl show uri --formation default`
    /// prints it, with user `postgres`:
    /// `postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/postgres?target_session_attrs=read-write&sslmode=prefer`.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?\
             target_session_attrs=read-write&sslmode=prefer",
            self.nodes[0].port, self.nodes[1].port
        )
    }

    /// Node `index` (0 or 1).
    pub fn node(&self, index: usize) -> &AutoNode {
        &self.nodes[index]
    }

    /// The timeouts the formation runs with.
    pub fn timeouts(&self) -> Timeouts {
        FAST
    }

    /// The monitor's connect options (database `pg_auto_failover`).
    pub fn monitor_options(&self) -> PgConnectOptions {
        host::local_options(self.monitor_port).database("pg_auto_failover")
    }

    /// Which node the monitor has as primary now (reported and assigned
    /// `primary`, `wait_primary` or `single`).
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] if the monitor cannot be read or names none.
    pub async fn primary(&self) -> Result<usize, SetupError> {
        let states = self.states().await?;
        states
            .iter()
            .position(|(reported, goal)| {
                reported == goal
                    && matches!(reported.as_str(), "primary" | "wait_primary" | "single")
            })
            .ok_or_else(|| SetupError::Server(format!("the monitor names no primary: {states:?}")))
    }

    /// Crashes node `index` as a failed host would leave it: its keeper
    /// (`pg_autoctl run`, which would otherwise restart PostgreSQL) and
    /// every PostgreSQL process are stopped first, then killed.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] if the node is not running.
    pub fn crash(&self, index: usize) -> Result<(), SetupError> {
        let node = &self.nodes[index];
        let mut keeper = lock(&node.keeper);
        let Some(mut child) = keeper.take() else {
            return Err(SetupError::Server(format!("{} is not running", node.name)));
        };
        let keeper_pid = child.id();
        let mut pids = vec![keeper_pid];
        pids.extend(descendants(keeper_pid));
        if let Some(postmaster) = node.postmaster() {
            pids.push(postmaster);
            pids.extend(descendants(postmaster));
        }
        signal(Signal::SIGSTOP, &pids);
        signal(Signal::SIGKILL, &pids);
        let _ = child.wait();
        Ok(())
    }

    /// Waits (up to 60 s) until the monitor has promoted the node that was
    /// not `old` and it accepts writes; returns its index.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] after 60 s, with the monitor's view.
    pub async fn wait_for_failover(&self, old: usize) -> Result<usize, SetupError> {
        let new = 1 - old;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(pool) = self.try_pool(&self.nodes[new].options()).await {
                let writable: Result<bool, _> = sqlx::query_scalar(
                    "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'",
                )
                .fetch_one(&pool)
                .await;
                pool.close().await;
                if writable.unwrap_or(false) {
                    return Ok(new);
                }
            }
            if Instant::now() > deadline {
                return Err(SetupError::Server(format!(
                    "{} was not promoted within 60 s; the monitor: {:?}",
                    self.nodes[new].name,
                    self.states().await
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts node `index`'s keeper again after [`AutoFailover::crash`]
    /// and waits until it is a `secondary` again (pg_auto_failover rewinds
    /// it and makes it follow the new primary).
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] if it does not rejoin within 60 s.
    pub async fn rejoin(&self, index: usize) -> Result<(), SetupError> {
        self.run_keeper(index)?;
        self.wait_for_state(index, "secondary", "secondary").await?;
        let primary = 1 - index;
        self.wait_for_state(primary, "primary", "primary").await
    }

    async fn start_monitor(&mut self) -> Result<(), SetupError> {
        self.create(
            "monitor",
            &self.monitor_dir,
            self.monitor_port,
            &[],
            "monitor-create",
        )?;
        let child = self.spawn_run(&self.monitor_dir, "monitor")?;
        *lock(&self.monitor) = Some(child);
        let pool = self.pool(&self.monitor_options()).await?;
        let t = FAST;
        let millis = |d: Duration| d.as_millis().to_string();
        for (name, value) in [
            ("health_check_period", millis(t.health_check_period)),
            ("health_check_timeout", millis(t.health_check_timeout)),
            (
                "health_check_max_retries",
                t.health_check_max_retries.to_string(),
            ),
            (
                "health_check_retry_delay",
                millis(t.health_check_retry_delay),
            ),
            (
                "node_considered_unhealthy_timeout",
                millis(t.node_considered_unhealthy_timeout),
            ),
            ("primary_demote_timeout", millis(t.primary_demote_timeout)),
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "ALTER SYSTEM SET pgautofailover.{name} = {value}"
            )))
            .execute(&pool)
            .await
            .map_err(|e| SetupError::Server(format!("set pgautofailover.{name}: {e}")))?;
        }
        sqlx::raw_sql("SELECT pg_reload_conf()")
            .execute(&pool)
            .await
            .map_err(|e| SetupError::Server(format!("reload the monitor: {e}")))?;
        pool.close().await;
        Ok(())
    }

    fn start_node(&self, index: usize) -> Result<(), SetupError> {
        let node = &self.nodes[index];
        let monitor = format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            self.monitor_port
        );
        self.create(
            "postgres",
            &node.dir,
            node.port,
            &[
                "--listen",
                "127.0.0.1",
                "--name",
                &node.name,
                "--monitor",
                &monitor,
            ],
            &format!("{}-create", node.name),
        )?;
        let partition = FAST.network_partition_timeout.as_secs().to_string();
        let mut set = self.autoctl(&[
            "config",
            "set",
            "--pgdata",
            path(&node.dir),
            "timeout.network_partition_timeout",
            &partition,
        ]);
        self.logged(&mut set, &format!("{}-config", node.name))?;
        self.run_keeper(index)
    }

    /// `pg_autoctl create KIND` of a data directory on `port` of
    /// 127.0.0.1, trust authentication, no TLS, and `extra` arguments.
    fn create(
        &self,
        kind: &str,
        dir: &Path,
        port: u16,
        extra: &[&str],
        log: &str,
    ) -> Result<(), SetupError> {
        let port = port.to_string();
        let pgctl = self.bin.join("pg_ctl");
        let mut args = vec![
            "create",
            kind,
            "--pgdata",
            path(dir),
            "--pgport",
            &port,
            "--pgctl",
            path(&pgctl),
            "--hostname",
            "127.0.0.1",
            "--auth",
            "trust",
            "--no-ssl",
        ];
        args.extend_from_slice(extra);
        self.logged(&mut self.autoctl(&args), log)
    }

    fn run_keeper(&self, index: usize) -> Result<(), SetupError> {
        let node = &self.nodes[index];
        let child = self.spawn_run(&node.dir, &node.name)?;
        *lock(&node.keeper) = Some(child);
        Ok(())
    }

    /// `pg_autoctl ARGS` as the server's user, in this formation's
    /// configuration directories.
    fn autoctl(&self, args: &[&str]) -> Command {
        let mut command = self.user.command(&self.autoctl);
        command
            .args(args)
            .env("XDG_CONFIG_HOME", self.root.join("config"))
            .env("XDG_DATA_HOME", self.root.join("data"))
            .env("XDG_RUNTIME_DIR", self.root.join("run"))
            .env("PGHOST", SOCKET_DIR)
            .env_remove("PGPORT")
            .env_remove("PGDATABASE")
            .env_remove("PGUSER");
        command
    }

    /// Runs a `pg_autoctl` step with its output in `NAME.log`.
    fn logged(&self, command: &mut Command, name: &str) -> Result<(), SetupError> {
        let log = self.root.join(format!("{name}.log"));
        let out = command
            .stdin(Stdio::null())
            .output()
            .map_err(|e| SetupError::Server(format!("run pg_autoctl ({name}): {e}")))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = std::fs::write(&log, &text);
        if out.status.success() {
            Ok(())
        } else {
            Err(SetupError::Server(format!(
                "pg_autoctl ({name}) exited with {}:\n{text}",
                out.status
            )))
        }
    }

    /// `pg_autoctl run --pgdata DIR` in the background, its output in
    /// `NAME.log`.
    fn spawn_run(&self, dir: &Path, name: &str) -> Result<Child, SetupError> {
        let log_path = self.root.join(format!("{name}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| SetupError::Server(format!("open {}: {e}", log_path.display())))?;
        let err = log
            .try_clone()
            .map_err(|e| SetupError::Server(format!("open {}: {e}", log_path.display())))?;
        self.autoctl(&["run", "--pgdata", path(dir)])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| SetupError::Server(format!("start pg_autoctl run ({name}): {e}")))
    }

    /// Each node's (reported, assigned) state on the monitor.
    async fn states(&self) -> Result<Vec<(String, String)>, SetupError> {
        let pool = self.pool(&self.monitor_options()).await?;
        let mut states = Vec::with_capacity(2);
        for node in &self.nodes {
            let row: Option<(String, String)> = sqlx::query_as(
                "SELECT reportedstate::text, goalstate::text FROM pgautofailover.node \
                 WHERE nodename = $1",
            )
            .bind(&node.name)
            .fetch_optional(&pool)
            .await
            .map_err(|e| SetupError::Server(format!("read the monitor: {e}")))?;
            states.push(row.unwrap_or_else(|| ("unknown".to_owned(), "unknown".to_owned())));
        }
        pool.close().await;
        Ok(states)
    }

    async fn wait_for_state(
        &self,
        index: usize,
        reported: &str,
        goal: &str,
    ) -> Result<(), SetupError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let states = self.states().await?;
            if states[index].0 == reported && states[index].1 == goal {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(
                    self.root.join(format!("{}.log", self.nodes[index].name)),
                )
                .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                return Err(SetupError::Server(format!(
                    "{} did not reach {reported}/{goal} within 60 s; the monitor: {states:?}; \
                     its keeper's last lines:\n{}",
                    self.nodes[index].name,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A small pool on `options`, waiting up to 30 s for the server.
    async fn pool(&self, options: &PgConnectOptions) -> Result<PgPool, SetupError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.try_pool(options).await {
                Ok(pool) => return Ok(pool),
                Err(e) if Instant::now() > deadline => {
                    return Err(SetupError::Server(format!(
                        "connect to 127.0.0.1:{}: {e}",
                        options.get_port()
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    async fn try_pool(&self, options: &PgConnectOptions) -> Result<PgPool, sqlx::Error> {
        PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(2))
            .connect_with(options.clone())
            .await
    }
}

impl Drop for AutoFailover {
    fn drop(&mut self) {
        // Keepers first, so that none restarts its server.
        for slot in self
            .nodes
            .iter()
            .map(|n| &n.keeper)
            .chain(std::iter::once(&self.monitor))
        {
            if let Some(mut child) = lock(slot).take() {
                kill_tree(&mut child);
            }
        }
        for dir in self
            .nodes
            .iter()
            .map(|n| n.dir.as_path())
            .chain(std::iter::once(self.monitor_dir.as_path()))
        {
            if dir.join("postmaster.pid").exists() {
                let _ = self
                    .user
                    .command(&self.bin.join("pg_ctl"))
                    .arg("-D")
                    .arg(dir)
                    .args(["stop", "-m", "immediate", "-w", "-t", "30"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn find_autoctl() -> Result<PathBuf, SetupError> {
    let versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| dirs.flatten().map(|d| d.path().join("bin")).collect())
        .unwrap_or_default();
    find_program(
        "pg_autoctl",
        &versions,
        "pg_autoctl (pg_auto_failover) is not installed: `apt-get install \
         postgresql-15-auto-failover` (the package for the server's major version)",
    )
}

/// The monitor's extension (`pgautofailover`), which pg_autoctl needs
/// from the package of the server's major version, beside `bin`.
fn monitor_extension(bin: &Path) -> Result<(), SetupError> {
    let sharedir = host::output(Command::new(bin.join("pg_config")).arg("--sharedir"))
        .ok()
        .map(|dir| PathBuf::from(dir.trim()))
        .or_else(|| {
            // Debian: /usr/lib/postgresql/15/bin -> /usr/share/postgresql/15.
            let major = bin.parent()?.file_name()?;
            Some(Path::new("/usr/share/postgresql").join(major))
        });
    match sharedir {
        Some(dir) if dir.join("extension/pgautofailover.control").is_file() => Ok(()),
        _ => Err(SetupError::Unavailable(
            "the pg_auto_failover monitor's extension (pgautofailover) is not installed for \
             this server: `apt-get install postgresql-15-auto-failover` (the package for the \
             server's major version)"
                .to_owned(),
        )),
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}
