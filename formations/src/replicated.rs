//! A replicated PostgreSQL for failover tests: a primary and a streaming
//! standby made from the installed server binaries (`initdb`, `pg_ctl`,
//! `pg_basebackup`, found as [`TempCluster`](pglease::provision::TempCluster)
//! finds them), in a temporary directory, on free ports of 127.0.0.1, with
//! trust authentication. A stable address in front of them, that a test
//! re-points as a virtual IP or a proxy would be, is a
//! [`Forwarder`](crate::Forwarder).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use nix::sys::signal::Signal;

use crate::SetupError;
use crate::process::{children, postmaster_pid, signal};
use pglease::provision::host::{self, ServerUser};

/// How the standby of a [`Replicated`] pair acknowledges commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standby {
    /// Named in `synchronous_standby_names`: a commit returns once the
    /// standby has flushed it (with the default `synchronous_commit`).
    Synchronous,
    /// Streaming only: a commit returns before the standby has it.
    Asynchronous,
}

/// One server of a [`Replicated`] pair.
#[derive(Debug)]
pub struct Node {
    name: &'static str,
    dir: PathBuf,
    port: u16,
}

impl Node {
    /// `"primary"` or `"standby"`.
    pub fn name(&self) -> &str {
        self.name
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Connect options for its `postgres` database as user `postgres`.
    pub fn options(&self) -> PgConnectOptions {
        host::local_options(self.port)
    }

    /// A small pool (4 connections) on it.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] if it cannot be reached within 10 s.
    pub async fn pool(&self) -> Result<PgPool, SetupError> {
        PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(self.options())
            .await
            .map_err(|e| SetupError::Server(format!("connect to the {}: {e}", self.name)))
    }

    /// The postmaster's process id, from `postmaster.pid`.
    fn postmaster(&self) -> Option<u32> {
        postmaster_pid(&self.dir)
    }
}

/// A primary and a standby streaming from it, stopped and deleted when
/// dropped (also after a failed assertion).
///
/// ```no_run
/// # async fn f() -> Result<(), pglease::testing::SetupError> {
/// use pglease_formations::{Replicated, Standby};
///
/// let pair = Replicated::start(Standby::Synchronous).await?;
/// // ... acquire through pair.primary().options() ...
/// pair.crash_primary()?;
/// pair.promote().await?;
/// // ... the lease and its token on pair.standby() ...
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Replicated {
    root: PathBuf,
    bin: PathBuf,
    user: ServerUser,
    primary: Node,
    standby: Node,
    /// Where the primary archives its WAL, if it does
    /// ([`Replicated::start_archiving`]).
    archive: Option<PathBuf>,
}

impl Replicated {
    /// Starts a primary and a standby streaming from it, and waits until
    /// the standby streams (and, if synchronous, is the synchronous one).
    ///
    /// # Errors
    ///
    /// [`SetupError::Unavailable`] when the server binaries are not
    /// installed; [`SetupError::Server`] with the output of the step that
    /// failed. A start that fails leaves nothing behind.
    ///
    /// # Cancel safety
    ///
    /// Cancelled, the servers started so far keep running until this
    /// process exits.
    pub async fn start(standby: Standby) -> Result<Replicated, SetupError> {
        Self::start_with(standby, false).await
    }

    /// [`Replicated::start`], with the primary archiving its WAL (into the
    /// pair's directory), so that a base backup of it can be restored to a
    /// point in time ([`Replicated::base_backup`], [`Replicated::restore`]).
    ///
    /// # Errors
    ///
    /// As [`Replicated::start`].
    ///
    /// # Cancel safety
    ///
    /// As [`Replicated::start`].
    pub async fn start_archiving(standby: Standby) -> Result<Replicated, SetupError> {
        Self::start_with(standby, true).await
    }

    async fn start_with(standby: Standby, archive: bool) -> Result<Replicated, SetupError> {
        let bin = host::find_bindir(&["pg_basebackup"])?;
        let user = ServerUser::find()?;
        let root = host::scratch_dir("replicated", &user)?;
        let mut pair = Replicated {
            primary: Node {
                name: "primary",
                dir: root.join("primary"),
                port: host::free_port()?,
            },
            standby: Node {
                name: "standby",
                dir: root.join("standby"),
                port: 0,
            },
            archive: archive.then(|| root.join("archive")),
            root,
            bin,
            user,
        };
        // From here on, a failure stops and removes everything (Drop).
        pair.start_primary(standby)?;
        pair.start_standby()?;
        let pool = pair.primary.pool().await?;
        let wanted = match standby {
            Standby::Synchronous => "streaming sync",
            Standby::Asynchronous => "streaming async",
        };
        until(
            &pool,
            "SELECT coalesce((SELECT state || ' ' || sync_state FROM pg_stat_replication \
                               WHERE application_name = 'standby'), 'not connected')",
            &format!("the standby {wanted}"),
            |state: &String| state == wanted,
        )
        .await?;
        pool.close().await;
        Ok(pair)
    }

    fn start_primary(&self, standby: Standby) -> Result<(), SetupError> {
        let primary = &self.primary;
        host::output(self.command("initdb").arg("-D").arg(&primary.dir).args([
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        ]))?;
        let sync_names = match standby {
            Standby::Synchronous => "'standby'",
            Standby::Asynchronous => "''",
        };
        let archive = match &self.archive {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| SetupError::Server(format!("create {}: {e}", dir.display())))?;
                self.user.give(dir)?;
                format!(
                    "archive_mode = on\narchive_command = 'cp %p {}/%f'\n",
                    dir.display()
                )
            }
            None => String::new(),
        };
        append(
            &primary.dir.join("postgresql.conf"),
            &format!(
                "\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
                 wal_level = replica\nmax_wal_senders = 4\nsynchronous_standby_names = {sync_names}\n\
                 fsync = off\nshared_buffers = 16MB\nmax_connections = 40\n{archive}",
                primary.port,
                self.root.display()
            ),
        )?;
        self.pg_ctl(primary, &["start", "-w", "-t", "60"])
    }

    fn start_standby(&mut self) -> Result<(), SetupError> {
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres application_name=standby",
            self.primary.port
        );
        host::output(
            self.command("pg_basebackup")
                .args(["-d", &conninfo, "-D"])
                .arg(&self.standby.dir)
                .args(["-R", "-X", "stream", "--no-sync"]),
        )?;
        // Chosen now rather than with the primary's: a port chosen seconds
        // earlier can meanwhile be taken as the local end of an outgoing
        // connection (same ephemeral range), and the standby then cannot
        // bind it.
        self.standby.port = host::free_port()?;
        append(
            &self.standby.dir.join("postgresql.conf"),
            // Once promoted it has no standby of its own: it must not wait
            // for one (a failover manager clears this on promotion too).
            &format!(
                "\nport = {}\nsynchronous_standby_names = ''\n",
                self.standby.port
            ),
        )?;
        self.pg_ctl(&self.standby, &["start", "-w", "-t", "60"])
    }

    /// Turns TLS on for both servers (plain connections stay allowed):
    /// a CA and a server certificate for `localhost` and 127.0.0.1 made
    /// now, as [`TlsServer`](crate::TlsServer) makes them; waits until
    /// each server answers a `verify-full` connection. Returns the CA's
    /// certificate, for `sslrootcert`.
    ///
    /// # Errors
    ///
    /// [`SetupError::Unavailable`] without `openssl`;
    /// [`SetupError::Server`] with the step that failed.
    pub async fn serve_tls(&self) -> Result<PathBuf, SetupError> {
        crate::TlsServer::available()?;
        let certs = self.root.join("certs");
        std::fs::create_dir_all(&certs)
            .map_err(|e| SetupError::Server(format!("create {}: {e}", certs.display())))?;
        crate::tls::make_certificates(&certs, &self.user)?;
        let file = |name: &str| {
            crate::tls::certs_path(&certs, name)
                .display()
                .to_string()
                .replace('\'', "''")
        };
        let statements = [
            "ALTER SYSTEM SET ssl = on".to_owned(),
            format!("ALTER SYSTEM SET ssl_cert_file = '{}'", file("server.crt")),
            format!("ALTER SYSTEM SET ssl_key_file = '{}'", file("server.key")),
            "SELECT pg_reload_conf()".to_owned(),
        ];
        let ca = crate::tls::certs_path(&certs, "ca.crt");
        for node in [&self.primary, &self.standby] {
            let mut admin = sqlx::ConnectOptions::connect(&node.options())
                .await
                .map_err(|e| SetupError::Server(format!("connect to the {}: {e}", node.name)))?;
            for statement in &statements {
                sqlx::raw_sql(sqlx::AssertSqlSafe(statement.as_str()))
                    .execute(&mut admin)
                    .await
                    .map_err(|e| SetupError::Server(format!("{}: {statement}: {e}", node.name)))?;
            }
            let _ = sqlx::Connection::close(admin).await;
            // The reload is asynchronous: wait for a verified connection.
            let verified = node
                .options()
                .host("localhost")
                .ssl_mode(sqlx::postgres::PgSslMode::VerifyFull)
                .ssl_root_cert(&ca);
            let started = std::time::Instant::now();
            loop {
                match sqlx::ConnectOptions::connect(&verified).await {
                    Ok(connection) => {
                        let _ = sqlx::Connection::close(connection).await;
                        break;
                    }
                    Err(e) if started.elapsed() > Duration::from_secs(30) => {
                        return Err(SetupError::Server(format!(
                            "no verified TLS connection to the {} within 30 s: {e}",
                            node.name
                        )));
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
        Ok(ca)
    }

    /// The primary.
    pub fn primary(&self) -> &Node {
        &self.primary
    }

    /// The standby (the primary, once promoted).
    pub fn standby(&self) -> &Node {
        &self.standby
    }

    /// A server binary as a command, run as the server's user.
    fn command(&self, program: &str) -> std::process::Command {
        self.user.command(&self.bin.join(program))
    }

    fn pg_ctl(&self, node: &Node, args: &[&str]) -> Result<(), SetupError> {
        let log = self.root.join(format!("{}.log", node.name));
        let mut command = self.command("pg_ctl");
        command
            .arg("-D")
            .arg(&node.dir)
            .arg("-l")
            .arg(&log)
            .args(args);
        host::output(&mut command).map(drop).map_err(|e| {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            SetupError::Server(format!("{e}; the {}'s log:\n{log}", node.name))
        })
    }

    /// Kills every process of the primary at once, without warning, as a
    /// crashed host would leave it: the postmaster is stopped first (so it
    /// forks nothing more), then its children and itself get SIGKILL.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] if the primary is not running, or survives.
    pub fn crash_primary(&self) -> Result<(), SetupError> {
        let Some(pid) = self.primary.postmaster() else {
            return Err(SetupError::Server("the primary is not running".to_owned()));
        };
        signal(Signal::SIGSTOP, &[pid]);
        signal(Signal::SIGKILL, &children(pid));
        signal(Signal::SIGKILL, &[pid]);
        // Gone (or a zombie), so that nothing of it answers any more.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| stat.contains(") Z "))
        {
            if Instant::now() > deadline {
                return Err(SetupError::Server(
                    "the primary survived SIGKILL".to_owned(),
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Starts the primary again after [`Replicated::crash_primary`]: it
    /// runs crash recovery, on the same timeline.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] with `pg_ctl`'s output and the log.
    pub fn restart_primary(&self) -> Result<(), SetupError> {
        // The killed postmaster may linger as a zombie (nobody reaps it
        // here), whose process id makes `pg_ctl` think it still runs: a
        // crashed host leaves no such process behind.
        if let Some(pid) = self.primary.postmaster()
            && std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map_or(true, |stat| stat.contains(") Z "))
        {
            // Its lock files: the data directory's and the socket's.
            let socket_lock = format!(".s.PGSQL.{}.lock", self.primary.port);
            for lock in [
                self.primary.dir.join("postmaster.pid"),
                self.root.join(socket_lock),
            ] {
                match std::fs::remove_file(&lock) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(SetupError::Server(format!(
                            "remove {}: {e}",
                            lock.display()
                        )));
                    }
                    _ => {}
                }
            }
        }
        self.pg_ctl(&self.primary, &["start", "-w", "-t", "60"])
    }

    /// A base backup of the primary, for [`Replicated::restore`], into the
    /// pair's directory.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] with `pg_basebackup`'s output, or when the
    /// pair was not started with [`Replicated::start_archiving`].
    pub fn base_backup(&self) -> Result<Backup, SetupError> {
        self.archive_dir()?;
        let dir = self.root.join(format!("backup-{}", host::free_port()?));
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres application_name=backup",
            self.primary.port
        );
        host::output(
            self.command("pg_basebackup")
                .args(["-d", &conninfo, "-D"])
                .arg(&dir)
                .args(["-X", "stream", "--no-sync", "-c", "fast"]),
        )?;
        Ok(Backup { dir })
    }

    fn archive_dir(&self) -> Result<&Path, SetupError> {
        self.archive.as_deref().ok_or_else(|| {
            SetupError::Server(
                "the pair does not archive its WAL: start it with Replicated::start_archiving"
                    .to_owned(),
            )
        })
    }

    /// Creates the restore point `name` on the primary, and waits until
    /// the WAL that holds it is archived (30 s at most).
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] if the primary cannot be reached, the pair
    /// does not archive, or the WAL is not archived in time.
    pub async fn restore_point(&self, name: &str) -> Result<(), SetupError> {
        self.archive_dir()?;
        let pool = self.primary.pool().await?;
        let segment: String = sqlx::query_scalar(
            "SELECT pg_walfile_name(pg_create_restore_point($1)) \
               FROM (SELECT pg_switch_wal()) AS s",
        )
        .bind(name)
        .fetch_one(&pool)
        .await
        .map_err(|e| SetupError::Server(format!("create restore point {name:?}: {e}")))?;
        // The point's segment, switched away from, is archived next.
        let _ = sqlx::query("SELECT pg_switch_wal()")
            .execute(&pool)
            .await
            .map_err(|e| SetupError::Server(format!("switch WAL: {e}")))?;
        until(
            &pool,
            &format!(
                "SELECT coalesce(last_archived_wal >= '{segment}', false) FROM pg_stat_archiver"
            ),
            &format!("WAL segment {segment} archived"),
            |archived: &bool| *archived,
        )
        .await?;
        pool.close().await;
        Ok(())
    }

    /// Restores `backup` as a new server and recovers it from the archive
    /// up to the restore point `name`, where it ends recovery on a new
    /// timeline and accepts writes (as a point-in-time restore does). It
    /// is stopped and deleted when dropped.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] with the step that failed and the server's
    /// log.
    pub async fn restore(&self, backup: &Backup, name: &str) -> Result<Restored, SetupError> {
        let archive = self.archive_dir()?;
        let restored = Restored {
            node: Node {
                name: "restored",
                dir: self.root.join(format!("restored-{}", host::free_port()?)),
                port: host::free_port()?,
            },
            bin: self.bin.clone(),
            user: self.user.clone(),
            log: self.root.join("restored.log"),
        };
        host::output(
            self.user
                .command(Path::new("cp"))
                .arg("-a")
                .arg(&backup.dir)
                .arg(&restored.node.dir),
        )?;
        append(
            &restored.node.dir.join("postgresql.conf"),
            &format!(
                "\nport = {}\narchive_mode = off\nrestore_command = 'cp {}/%f %p'\n\
                 recovery_target_name = '{name}'\nrecovery_target_action = 'promote'\n\
                 recovery_target_timeline = 'current'\nsynchronous_standby_names = ''\n",
                restored.node.port,
                archive.display()
            ),
        )?;
        let signal = restored.node.dir.join("recovery.signal");
        std::fs::write(&signal, "")
            .map_err(|e| SetupError::Server(format!("write {}: {e}", signal.display())))?;
        self.user.give(&signal)?;
        restored.pg_ctl(&["start", "-w", "-t", "60"])?;
        let pool = restored.node.pool().await?;
        until(
            &pool,
            "SELECT pg_is_in_recovery()",
            "the restored server to end recovery",
            |recovering: &bool| !*recovering,
        )
        .await?;
        pool.close().await;
        Ok(restored)
    }

    /// Stops the standby (`stop = true`), or starts it again. While it is
    /// stopped an asynchronous standby falls behind by everything the
    /// primary commits; started again after the primary has gone, it
    /// keeps only what it had received.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] with `pg_ctl`'s output.
    pub fn stop_standby(&self, stop: bool) -> Result<(), SetupError> {
        if stop {
            self.pg_ctl(&self.standby, &["stop", "-m", "fast", "-w", "-t", "60"])
        } else {
            self.pg_ctl(&self.standby, &["start", "-w", "-t", "60"])
        }
    }

    /// Waits until the standby has replayed everything the primary has
    /// written so far (an asynchronous standby may lag behind).
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] if either cannot be read, or after 30 s.
    pub async fn wait_for_replay(&self) -> Result<(), SetupError> {
        let primary = self.primary.pool().await?;
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&primary)
            .await
            .map_err(|e| SetupError::Server(format!("read the primary's WAL position: {e}")))?;
        primary.close().await;
        let standby = self.standby.pool().await?;
        until(
            &standby,
            &format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
            &format!("the standby replaying up to {lsn}"),
            |replayed: &bool| *replayed,
        )
        .await?;
        standby.close().await;
        Ok(())
    }

    /// Promotes the standby and waits until it accepts writes.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] with `pg_ctl`'s output, or after 30 s.
    pub async fn promote(&self) -> Result<(), SetupError> {
        self.pg_ctl(&self.standby, &["promote", "-w", "-t", "60"])?;
        let pool = self.standby.pool().await?;
        until(
            &pool,
            "SELECT pg_is_in_recovery()",
            "the standby promoted",
            |recovering: &bool| !*recovering,
        )
        .await?;
        pool.close().await;
        Ok(())
    }
}

impl Drop for Replicated {
    fn drop(&mut self) {
        for node in [&self.standby, &self.primary] {
            if node.postmaster().is_some() {
                let _ = self
                    .command("pg_ctl")
                    .arg("-D")
                    .arg(&node.dir)
                    .args(["stop", "-m", "immediate", "-w", "-t", "30"])
                    .output();
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A base backup of a [`Replicated`] pair's primary
/// ([`Replicated::base_backup`]), deleted with the pair.
#[derive(Debug)]
pub struct Backup {
    dir: PathBuf,
}

/// A server restored from a [`Backup`] to a point in time
/// ([`Replicated::restore`]): on a new timeline, accepting writes. Stopped
/// and deleted when dropped.
#[derive(Debug)]
pub struct Restored {
    node: Node,
    bin: PathBuf,
    user: ServerUser,
    log: PathBuf,
}

impl Restored {
    /// The server.
    pub fn node(&self) -> &Node {
        &self.node
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), SetupError> {
        let mut command = self.user.command(&self.bin.join("pg_ctl"));
        command
            .arg("-D")
            .arg(&self.node.dir)
            .arg("-l")
            .arg(&self.log)
            .args(args);
        host::output(&mut command).map(drop).map_err(|e| {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            SetupError::Server(format!("{e}; the restored server's log:\n{log}"))
        })
    }
}

impl Drop for Restored {
    fn drop(&mut self) {
        if self.node.postmaster().is_some() {
            let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "30"]);
        }
        let _ = std::fs::remove_dir_all(&self.node.dir);
    }
}

fn append(path: &Path, text: &str) -> Result<(), SetupError> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|e| SetupError::Server(format!("write {}: {e}", path.display())))
}

/// Reads the one value `query` answers on `pool` every 20 ms until `done`
/// accepts it; an error after 30 s, saying what it waited for and the last
/// value read.
async fn until<T>(
    pool: &PgPool,
    query: &str,
    what: &str,
    done: impl Fn(&T) -> bool,
) -> Result<(), SetupError>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + std::fmt::Debug,
    T: Send + Unpin,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let value: T = sqlx::query_scalar(sqlx::AssertSqlSafe(query.to_owned()))
            .fetch_one(pool)
            .await
            .map_err(|e| SetupError::Server(format!("waiting for {what}: {query}: {e}")))?;
        if done(&value) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(SetupError::Server(format!(
                "waited 30 s for {what}; last read: {value:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
