//! Where to connect, as libpq reads it: one host or several
//! (`postgres://db1:5432,db2:5432/app`, `host=db1,db2 port=5432`,
//! `PGHOST=db1,db2`), tried in order, and `target_session_attrs`, which
//! says which of them will do: the type, and connecting to it. Reading it
//! from a URL, a `keyword=value` string or the environment is `parse.rs`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{ConnectOptions, Connection, PgConnection, Row};

use super::passfile::{self, Login, Lookup};
use super::tls::{Approach, Attempt, Failure, Roots, SslMode};
use crate::error::{Error, Result};
use crate::human::Human;
use crate::sql;

/// Which server of a [`Target`]'s hosts a connection may use, as libpq's
/// `target_session_attrs`. pglease writes on every operation, so only the
/// attributes that admit a writable server are taken: `read-only`,
/// `standby` and `prefer-standby` are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SessionAttrs {
    /// The first server that accepts the connection (libpq's default).
    #[default]
    Any,
    /// A server whose sessions are writable by default
    /// (`transaction_read_only` is `off`): a primary, and not one set
    /// `default_transaction_read_only`.
    ReadWrite,
    /// A server that is not in recovery (`pg_is_in_recovery()` is false).
    Primary,
}

impl SessionAttrs {
    /// The spelling in a connection string.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionAttrs::Any => "any",
            SessionAttrs::ReadWrite => "read-write",
            SessionAttrs::Primary => "primary",
        }
    }

    pub(super) fn parse(value: &str) -> Result<SessionAttrs> {
        match value {
            "any" => Ok(SessionAttrs::Any),
            "read-write" => Ok(SessionAttrs::ReadWrite),
            "primary" => Ok(SessionAttrs::Primary),
            "read-only" | "standby" | "prefer-standby" => Err(Error::invalid(
                "url",
                format!(
                    "target_session_attrs={value} would connect to a server that cannot be \
                     written; pglease writes on every operation: use read-write (or primary, \
                     or any)"
                ),
            )),
            other => Err(Error::invalid(
                "url",
                format!(
                    "target_session_attrs={other:?} is not one libpq knows; pglease takes any, \
                     read-write or primary"
                ),
            )),
        }
    }
}

impl std::fmt::Display for SessionAttrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where to connect: connect options (user, database, TLS, ...), the hosts
/// to try in order, and which server will do ([`SessionAttrs`]). Built from
/// a URL or a `keyword=value` string with [`Target::parse`], from the libpq
/// environment with [`Target::from_env`], or from one host's
/// [`PgConnectOptions`] with `From`.
///
/// Connecting follows libpq: each host in turn, the first that accepts the
/// connection and has the attributes wins. With several hosts and no
/// `target_session_attrs`, pglease takes `read-write` instead of libpq's
/// `any` (the one difference from libpq): every pglease operation writes,
/// and `any` would settle on whichever server answers first, standby or
/// not. Say `target_session_attrs=any` to get libpq's behaviour.
///
/// ```
/// use pglease::connect::{SessionAttrs, Target};
///
/// let target = Target::parse(
///     "postgres://app@db1:5432,db2:5433/app?target_session_attrs=read-write",
/// )?;
/// assert_eq!(target.hosts(), ["db1:5432", "db2:5433"]);
/// assert_eq!(target.attrs(), SessionAttrs::ReadWrite);
///
/// let same = Target::parse("host=db1,db2 port=5432,5433 user=app dbname=app")?;
/// assert_eq!(same.hosts(), target.hosts());
/// assert_eq!(same.attrs(), SessionAttrs::ReadWrite); // several hosts
/// # Ok::<(), pglease::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Target {
    pub(super) options: PgConnectOptions,
    pub(super) hosts: Vec<(String, u16)>,
    pub(super) attrs: SessionAttrs,
    /// How TLS is set up, as libpq would; `None` for options given as
    /// they are (`From<PgConnectOptions>`): sqlx's own use of their
    /// sslmode.
    pub(super) tls: Option<Approach>,
    /// The password file read for each connection, when no password was
    /// given.
    pub(super) passfile: Option<PathBuf>,
    pub(super) connect_timeout: Option<Duration>,
    /// The password set since (`LeaseManager::set_password`), shared by
    /// the target's clones; it wins over the options' and the file's.
    pub(super) rotated: Rotated,
}

/// A password set after the target was made, shared by its clones.
#[derive(Clone, Default)]
pub(crate) struct Rotated(Arc<Mutex<Option<String>>>);

impl std::fmt::Debug for Rotated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = crate::sync::lock(&self.0).is_some();
        f.write_str(if set { "Rotated(set)" } else { "Rotated(none)" })
    }
}

impl Target {
    /// Sets the password every later connection from this target (and its
    /// clones) logs in with, and runs `apply` (which sets it on a pool)
    /// before [`Target::apply_password`] can run again.
    pub(crate) fn set_password(&self, password: &str, apply: impl FnOnce()) {
        let mut rotated = crate::sync::lock(&self.rotated.0);
        *rotated = Some(password.to_owned());
        apply();
    }

    /// `options` with the password set since (if one was), handed to
    /// `apply` (which sets them on a pool) while no password is being set.
    pub(crate) fn apply_password(
        &self,
        options: PgConnectOptions,
        apply: impl FnOnce(PgConnectOptions),
    ) {
        let rotated = crate::sync::lock(&self.rotated.0);
        apply(match rotated.as_deref() {
            Some(password) => options.password(password),
            None => options,
        });
    }
}

impl From<PgConnectOptions> for Target {
    /// One host, any server ([`SessionAttrs::Any`]), the options used as
    /// they are: what sqlx does.
    fn from(options: PgConnectOptions) -> Target {
        let host = (options.get_host().to_owned(), options.get_port());
        Target {
            options,
            hosts: vec![host],
            attrs: SessionAttrs::Any,
            tls: None,
            passfile: None,
            connect_timeout: None,
            rotated: Rotated::default(),
        }
    }
}

impl Target {
    /// The hosts, in the order they are tried, as `host:port`.
    pub fn hosts(&self) -> Vec<String> {
        (0..self.hosts.len()).map(|i| self.host(i)).collect()
    }

    /// The host at `index` (in [`Target::hosts`]' order), as `host:port`.
    ///
    /// # Panics
    ///
    /// If `index` is out of range.
    pub fn host(&self, index: usize) -> String {
        let (host, port) = &self.hosts[index];
        show_host(host, *port)
    }

    /// Which server will do.
    pub fn attrs(&self) -> SessionAttrs {
        self.attrs
    }

    /// The same hosts with other attributes.
    #[must_use]
    pub fn with_attrs(mut self, attrs: SessionAttrs) -> Target {
        self.attrs = attrs;
        self
    }

    /// The same target with other options for every host (user, database,
    /// application name, ...): `change` gets the options of the first host
    /// and its result applies to all.
    #[must_use]
    pub fn map_options(
        mut self,
        change: impl FnOnce(PgConnectOptions) -> PgConnectOptions,
    ) -> Self {
        self.options = change(self.options);
        self
    }

    /// Whether connecting needs more than sqlx's own connect: several
    /// hosts, or attributes to check.
    pub fn is_plain(&self) -> bool {
        self.hosts.len() == 1 && self.attrs == SessionAttrs::Any
    }

    /// The user name connected as.
    pub fn user(&self) -> &str {
        self.options.get_username()
    }

    /// The database connected to (libpq's default: the user's name).
    pub fn database(&self) -> &str {
        self.options
            .get_database()
            .unwrap_or(self.options.get_username())
    }

    /// `connect_timeout` (or `PGCONNECT_TIMEOUT`), when one was given: how
    /// long to wait for each host.
    pub fn connect_timeout(&self) -> Option<Duration> {
        self.connect_timeout
    }

    /// The `sslmode` in force (libpq's default `prefer`, `verify-full`
    /// with `sslrootcert=system`), or `None` for a target made from
    /// [`PgConnectOptions`], whose own sslmode sqlx uses.
    pub fn sslmode(&self) -> Option<SslMode> {
        self.tls.as_ref().map(|approach| approach.mode)
    }

    /// The connect options of the host at `index` (in [`Target::hosts`]'
    /// order), for sqlx: its password read from the password file now,
    /// when none was given, and the TLS of libpq's first attempt (for
    /// `allow`, sqlx's: without TLS only; pglease's own connections make
    /// libpq's second attempt too).
    ///
    /// # Panics
    ///
    /// If `index` is out of range.
    pub fn host_options(&self, index: usize) -> PgConnectOptions {
        let mode = self
            .tls
            .as_ref()
            .map(|approach| approach.settled(approach.first));
        self.options_with(index, mode).0
    }

    /// The options of host `index` with TLS `mode` (`None`: as the options
    /// say), and what the password file said.
    fn options_with(&self, index: usize, mode: Option<Attempt>) -> (PgConnectOptions, Lookup) {
        let (host, port) = &self.hosts[index];
        // extra_float_digits is not sent at startup: PgBouncer before 1.20
        // refuses unknown startup parameters, and nothing here reads
        // floats (PostgreSQL 12 and later print them exactly by default).
        let mut options = self
            .options
            .clone()
            .host(host)
            .port(*port)
            .extra_float_digits(None);
        if let (Some(approach), Some(mode)) = (&self.tls, mode) {
            // libpq makes no TLS attempt over a socket.
            let mode = if host.starts_with('/') {
                Attempt::Plain
            } else {
                mode
            };
            options = options.ssl_mode(mode.sqlx());
            match &approach.roots {
                Roots::File(file) => options = options.ssl_root_cert(file),
                // sqlx took PGSSLROOTCERT as a file: no file, no roots added
                // to the platform's.
                _ if std::env::var_os("PGSSLROOTCERT").is_some() => {
                    options = options.ssl_root_cert_from_pem(Vec::new());
                }
                _ => {}
            }
            if let Some((cert, key)) = &approach.client {
                options = options.ssl_client_cert(cert).ssl_client_key(key);
            }
        }
        let mut lookup = Lookup::None;
        if let Some(file) = &self.passfile {
            let user = options.get_username().to_owned();
            let database = options.get_database().unwrap_or(&user).to_owned();
            lookup = passfile::lookup(
                file,
                Login {
                    host,
                    port: *port,
                    database: &database,
                    user: &user,
                },
            );
            if let Lookup::Found(password, _) = &lookup {
                options = options.password(password);
            }
        }
        if let Some(password) = crate::sync::lock(&self.rotated.0).as_deref() {
            options = options.password(password);
        }
        (options, lookup)
    }

    /// One connection to host `index` as libpq makes it: the approach's first
    /// attempt and, where libpq would, its second; each bounded by
    /// `per_host`. With it, the options the host's later connections use
    /// (the TLS that worked).
    pub(crate) async fn open(
        &self,
        index: usize,
        per_host: Duration,
    ) -> Result<(PgConnection, PgConnectOptions)> {
        let Some(approach) = self
            .tls
            .as_ref()
            .filter(|_| !self.hosts[index].0.starts_with('/'))
        else {
            let options = self.options_with(index, None).0;
            let options = match &self.tls {
                Some(_) => options.ssl_mode(PgSslMode::Disable),
                None => options,
            };
            let connection = self.attempt(index, &options, per_host).await?;
            return Ok((connection, options));
        };
        let (second, failed) = match self
            .try_mode(index, approach, approach.first, per_host)
            .await
        {
            Ok(done) => return Ok(done),
            Err(failed) => (approach.retry_after(failed.1), failed),
        };
        let Some(second) = second else {
            return Err(failed.0);
        };
        match self.try_mode(index, approach, second, per_host).await {
            Ok(done) => Ok(done),
            // The attempt made with TLS says more than the plain one
            // (which a server that requires TLS refuses).
            Err(again) if second.encrypts() => Err(again.0),
            Err(_) => Err(failed.0),
        }
    }

    /// One attempt of `approach` with TLS `mode`: the connection and the options
    /// later connections use, or the error (explained) and how it failed.
    async fn try_mode(
        &self,
        index: usize,
        approach: &Approach,
        mode: Attempt,
        per_host: Duration,
    ) -> std::result::Result<(PgConnection, PgConnectOptions), (Error, Failure)> {
        let (options, lookup) = self.options_with(index, Some(mode));
        match self.attempt(index, &options, per_host).await {
            Ok(connection) => Ok((
                connection,
                self.options_with(index, Some(approach.settled(mode))).0,
            )),
            Err(error) => {
                let failed = failure(&error, mode.encrypts());
                Err((self.explain(error, failed, mode, approach, &lookup), failed))
            }
        }
    }

    /// One attempt, bounded by `per_host`.
    async fn attempt(
        &self,
        index: usize,
        options: &PgConnectOptions,
        per_host: Duration,
    ) -> Result<PgConnection> {
        match tokio::time::timeout(per_host, options.connect()).await {
            Ok(connection) => Ok(connection?),
            Err(_) => Err(Error::Database(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer from {} within {}",
                    self.host(index),
                    Human(per_host)
                ),
            )))),
        }
    }

    /// `error` said with what the user can act on: a TLS failure with the
    /// sslmode and the roots the certificate was checked against, a
    /// failed login with where its password came from.
    fn explain(
        &self,
        error: Error,
        failure: Failure,
        mode: Attempt,
        approach: &Approach,
        lookup: &Lookup,
    ) -> Error {
        match (failure, &error) {
            (Failure::Tls, Error::Database(inner)) => {
                let why = match inner {
                    sqlx::Error::Tls(tls) => tls.to_string(),
                    sqlx::Error::Io(io) => io.to_string(),
                    other => other.to_string(),
                };
                let checked = match mode {
                    Attempt::VerifyCa | Attempt::VerifyFull => format!(
                        "; the server's certificate was checked against {} (sslmode={}{})",
                        approach.describe_roots(),
                        approach.mode,
                        if mode == Attempt::VerifyFull {
                            ", and must name the host connected to"
                        } else {
                            ""
                        }
                    ),
                    _ => format!(" (sslmode={})", approach.mode),
                };
                Error::Database(sqlx::Error::Tls(format!("{why}{checked}").into()))
            }
            (Failure::Refused, _) => {
                if let Lookup::Ignored(why) = lookup {
                    tracing::warn!(%why, "login refused");
                }
                error
            }
            _ => error,
        }
    }

    /// Why the password file gave no password for host `index`, if it was
    /// there but not read (others may read it, ...).
    pub fn passfile_problem(&self, index: usize) -> Option<String> {
        match self.options_with(index, None).1 {
            Lookup::Ignored(why) => Some(why),
            _ => None,
        }
    }

    /// How many hosts there are (at least one).
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Always false: a target has at least one host.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The hosts, comma-separated, for messages.
    pub fn describe(&self) -> String {
        self.hosts().join(",")
    }

    /// Connects as libpq does: each host in turn, each bounded by
    /// `per_host`; the first connection to a server with the attributes
    /// wins, with the index of its host. A server without them is left
    /// (its connection closed) and the next host tried.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when no host will do, naming each host and why
    /// (refused, no answer within `per_host`, a standby, ...).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped early, the connection being opened is closed.
    pub async fn connect(&self, per_host: Duration) -> Result<(PgConnection, usize)> {
        let (connection, index, _) = self.connect_first(per_host).await?;
        Ok((connection, index))
    }

    /// [`Target::connect`], with the options the chosen host's later
    /// connections use.
    pub(crate) async fn connect_first(
        &self,
        per_host: Duration,
    ) -> Result<(PgConnection, usize, PgConnectOptions)> {
        let mut why = Vec::with_capacity(self.hosts.len());
        for index in 0..self.hosts.len() {
            match self.connect_host(index, per_host).await {
                Ok(Ok((connection, options))) => return Ok((connection, index, options)),
                Ok(Err(refusal)) => why.push(format!("{}: {refusal}", self.host(index))),
                Err(error) => {
                    if self.hosts.len() == 1 {
                        return Err(error);
                    }
                    why.push(format!("{}: {error}", self.host(index)));
                }
            }
        }
        Err(Error::Database(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            format!(
                "no server with target_session_attrs={} among {}: {}",
                self.attrs,
                self.describe(),
                why.join("; ")
            ),
        ))))
    }

    /// One host: `Ok(Ok((connection, options)))` if it will do, with the
    /// options its later connections use, `Ok(Err(why not))` if it
    /// answered but lacks the attributes, `Err` if it cannot be reached.
    pub(crate) async fn connect_host(
        &self,
        index: usize,
        per_host: Duration,
    ) -> Result<std::result::Result<(PgConnection, PgConnectOptions), String>> {
        let (mut connection, options) = self.open(index, per_host).await?;
        match tokio::time::timeout(per_host, refusal(&mut connection, self.attrs)).await {
            Ok(Ok(None)) => Ok(Ok((connection, options))),
            Ok(Ok(Some(why))) => {
                let _ = connection.close().await;
                Ok(Err(why))
            }
            Ok(Err(error)) => Err(error.into()),
            Err(_) => Err(Error::Database(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer to the target_session_attrs check within {}",
                    Human(per_host)
                ),
            )))),
        }
    }
}

/// How a connection attempt failed, for libpq's retries: a TLS attempt's
/// handshake errors come from the TLS library as I/O errors of kind
/// `InvalidData`.
fn failure(error: &Error, encrypted: bool) -> Failure {
    match error {
        Error::Database(sqlx::Error::Database(_)) => Failure::Refused,
        Error::Database(sqlx::Error::Tls(_)) => Failure::Tls,
        Error::Database(sqlx::Error::Io(io))
            if encrypted && io.kind() == std::io::ErrorKind::InvalidData =>
        {
            Failure::Tls
        }
        _ if error.sqlstate().is_some() => Failure::Refused,
        _ => Failure::Other,
    }
}

/// Why the server on `connection` lacks `attrs`, or `None` if it has them.
pub(crate) async fn refusal(
    connection: &mut PgConnection,
    attrs: SessionAttrs,
) -> sqlx::Result<Option<String>> {
    if attrs == SessionAttrs::Any {
        return Ok(None);
    }
    let row = sql::query(sql::RECOVERY_AND_READ_ONLY)
        .fetch_one(&mut *connection)
        .await?;
    let (recovery, read_only): (bool, bool) = (row.try_get(0)?, row.try_get(1)?);
    Ok(match attrs {
        SessionAttrs::Primary | SessionAttrs::ReadWrite if recovery => {
            Some("a standby (in recovery), not the primary".to_owned())
        }
        SessionAttrs::ReadWrite if read_only => {
            Some("read-only (default_transaction_read_only is on)".to_owned())
        }
        _ => None,
    })
}

fn show_host(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('/') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}
