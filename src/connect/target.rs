//! Where to connect, as libpq reads it: one host or several
//! (`postgres://db1:5432,db2:5432/app`, `host=db1,db2 port=5432`,
//! `PGHOST=db1,db2`), tried in order, and `target_session_attrs`, which
//! says which of them will do: the type, and connecting to it. Reading it
//! from a URL, a `keyword=value` string or the environment is `parse.rs`.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, Row};

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
}

impl From<PgConnectOptions> for Target {
    /// One host, any server ([`SessionAttrs::Any`]): what sqlx does.
    fn from(options: PgConnectOptions) -> Target {
        let host = (options.get_host().to_owned(), options.get_port());
        Target {
            options,
            hosts: vec![host],
            attrs: SessionAttrs::Any,
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

    /// The connect options of the host at `index` (in [`Target::hosts`]'
    /// order), for sqlx.
    ///
    /// # Panics
    ///
    /// If `index` is out of range.
    pub fn host_options(&self, index: usize) -> PgConnectOptions {
        let (host, port) = &self.hosts[index];
        self.options.clone().host(host).port(*port)
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
        let mut why = Vec::with_capacity(self.hosts.len());
        for index in 0..self.hosts.len() {
            match self.connect_host(index, per_host).await {
                Ok(Ok(connection)) => return Ok((connection, index)),
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

    /// One host: `Ok(Ok(connection))` if it will do, `Ok(Err(why not))` if
    /// it answered but lacks the attributes, `Err` if it cannot be reached.
    pub(crate) async fn connect_host(
        &self,
        index: usize,
        per_host: Duration,
    ) -> Result<std::result::Result<PgConnection, String>> {
        let options = self.host_options(index).extra_float_digits(None);
        let mut connection = match tokio::time::timeout(per_host, options.connect()).await {
            Ok(connection) => connection?,
            Err(_) => {
                return Err(Error::Database(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {}", Human(per_host)),
                ))));
            }
        };
        match tokio::time::timeout(per_host, refusal(&mut connection, self.attrs)).await {
            Ok(Ok(None)) => Ok(Ok(connection)),
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
