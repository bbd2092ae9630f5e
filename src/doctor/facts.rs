//! What `doctor` reads, judging nothing: one struct per source, each
//! filled by statements of `crate::sql`. A fact that a role may not read
//! is kept as the reason it could not be (a finding, not an error);
//! anything else that fails is an error of `doctor`.

use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use super::{DoctorOptions, PatroniTiming};
use crate::connect::{PER_HOST_TIMEOUT, SessionAttrs, Target};
use crate::error::{Error, Result};
use crate::history::TimelineChange;
use crate::manager::LeaseManager;
use crate::sql;

/// What the server a manager uses says of itself, in one statement.
#[derive(Debug, Clone)]
pub(super) struct Server {
    /// `server_version_num`.
    pub(super) version: i32,
    pub(super) fsync: String,
    pub(super) full_page_writes: String,
    pub(super) sync_names: String,
    /// In recovery: a standby.
    pub(super) recovering: bool,
    /// Standbys streaming from it, those synchronous, and those whose
    /// state this role may not see.
    pub(super) standbys: i64,
    pub(super) sync: i64,
    pub(super) hidden: i64,
    /// Whether the `pglease` schema exists.
    pub(super) migrated: bool,
}

/// Which migration the schema is at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Applied {
    /// The latest applied migration (`None`: none recorded).
    Version(Option<i64>),
    /// This role may not read the migrations table.
    Unreadable,
}

/// One finding of `pglease.audit()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Finding {
    /// `warn` or `ok`.
    pub(super) level: String,
    pub(super) topic: String,
    pub(super) message: String,
}

/// The connection `doctor` asks through, and how it is secured.
#[derive(Debug, Clone)]
pub(super) struct Connection {
    /// Encrypted (`pg_stat_ssl.ssl`), with this TLS version and cipher.
    pub(super) ssl: bool,
    pub(super) version: Option<String>,
    pub(super) cipher: Option<String>,
    /// The sslmode the pool's connections are made with.
    pub(super) mode: PgSslMode,
    /// The host, or the socket's directory.
    pub(super) host: String,
    /// A Unix-domain socket or a loopback address: nothing crosses a
    /// network.
    pub(super) local: bool,
}

/// What the connected role may do with the schema.
#[derive(Debug, Clone)]
pub(super) struct Privileges {
    pub(super) role: String,
    /// USAGE on the schema: every lease operation needs it.
    pub(super) usage: bool,
    /// The views an application reads that this role may not, in order.
    pub(super) unreadable: Vec<String>,
}

/// What `doctor` reads of timelines.
#[derive(Debug, Clone)]
pub(super) struct Timelines {
    /// The server's timeline; `None` on a standby.
    pub(super) current: Option<i64>,
    /// The latest one pglease recorded.
    pub(super) recorded: i64,
    /// The latest change of timeline recorded.
    pub(super) latest: Option<TimelineChange>,
    /// The grant delay after a change.
    pub(super) delay: Duration,
}

/// Everything `doctor` reads of the server a manager uses. The parts
/// that need the schema are `None` before it exists; an `Err` is why this
/// role could not read them.
#[derive(Debug, Clone)]
pub(super) struct Here {
    pub(super) server: Server,
    pub(super) applied: Option<Applied>,
    /// Whether connections share server sessions between transactions
    /// (a transaction pooler in front).
    pub(super) sessions_shared: bool,
    /// Whether the manager is configured to LISTEN.
    pub(super) notify: bool,
    pub(super) timelines: Option<std::result::Result<Timelines, String>>,
    /// Whether the functions' owner may end stale fenced sessions, or why
    /// this role may not ask.
    pub(super) can_end: Option<std::result::Result<bool, String>>,
    pub(super) audit: Option<std::result::Result<Vec<Finding>, String>>,
    /// The lease groups (`None`: no schema, or this role may not read
    /// `pglease.groups`, which only administrators may unless granted).
    pub(super) groups: Option<Vec<crate::GroupSummary>>,
    pub(super) privileges: Option<Privileges>,
    pub(super) connection: Connection,
}

/// What one host of several says of itself.
#[derive(Debug, Clone, Default)]
pub(super) struct Host {
    pub(super) recovering: bool,
    pub(super) read_only: bool,
    pub(super) sync_names: String,
    /// As a standby: whether its WAL receiver streams, and the name it
    /// gives the primary.
    pub(super) streaming: bool,
    pub(super) application_name: String,
    /// As a primary: (application_name, sync_state) of each standby.
    pub(super) standbys: Vec<(String, String)>,
}

/// The TTL a failover is checked against, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ttl {
    /// Given by the caller.
    Given(Duration),
    /// The shortest among the leases held now (`None`: none is held).
    ShortestHeld(Option<Duration>),
    /// The held leases' TTLs could not be read, and why.
    Unreadable(String),
}

/// How long a failover takes, and where that came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FailoverTime {
    /// Given by the caller.
    Given(Duration),
    /// pg_auto_failover's monitor's `pgautofailover.*` settings (name,
    /// value), or why they could not be read.
    Monitor(std::result::Result<Vec<(String, String)>, String>),
    /// Patroni's timing.
    Patroni(PatroniTiming),
    /// Not known.
    Unknown,
}

/// What the `failover` check weighs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Failover {
    pub(super) ttl: Ttl,
    pub(super) time: FailoverTime,
}

impl LeaseManager {
    /// Reads every fact of the server this manager uses.
    pub(super) async fn facts_here(&self) -> Result<Here> {
        let server = self.server_facts().await?;
        let migrated = server.migrated;
        let applied = if migrated {
            Some(self.applied().await?)
        } else {
            None
        };
        let options = self.pool().connect_options();
        let sessions_shared = crate::connect::sessions_shared(&options).await?;
        let timelines = if migrated {
            match self.timelines().await {
                Ok(timelines) => Some(Ok(timelines)),
                Err(e @ Error::NotPermitted { .. }) => Some(Err(e.to_string())),
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let can_end = if migrated {
            match self.admin().can_end_stale_transactions().await {
                Ok(can) => Some(Ok(can)),
                Err(e @ Error::NotPermitted { .. }) => Some(Err(e.to_string())),
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let audit = if migrated {
            Some(self.audit().await?)
        } else {
            None
        };
        let groups = if migrated {
            match self.admin().groups().await {
                Ok(groups) => Some(groups),
                Err(Error::NotPermitted { .. }) => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let privileges = if migrated {
            Some(self.privileges().await?)
        } else {
            None
        };
        let connection = self.connection(&options).await?;
        Ok(Here {
            server,
            applied,
            sessions_shared,
            notify: self.options().get_notify(),
            timelines,
            can_end,
            audit,
            groups,
            privileges,
            connection,
        })
    }

    async fn privileges(&self) -> Result<Privileges> {
        let row = sql::query(sql::PRIVILEGE_FACTS)
            .fetch_one(self.pool())
            .await?;
        let unreadable: String = row.try_get("unreadable")?;
        Ok(Privileges {
            role: row.try_get("role")?,
            usage: row.try_get("usage")?,
            unreadable: unreadable
                .split(", ")
                .filter(|r| !r.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }

    /// How the pool's connections (made with `options`) are secured.
    async fn connection(&self, options: &PgConnectOptions) -> Result<Connection> {
        let row = sql::query(sql::CONNECTION_SECURITY)
            .fetch_optional(self.pool())
            .await?;
        let (ssl, version, cipher) = match row {
            Some(row) => (
                row.try_get("ssl")?,
                row.try_get("version")?,
                row.try_get("cipher")?,
            ),
            None => (false, None, None),
        };
        let (host, local) = match options.get_socket() {
            Some(socket) => (socket.display().to_string(), true),
            None => {
                let host = options.get_host();
                let local = host.starts_with('/')
                    || host.eq_ignore_ascii_case("localhost")
                    || host
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback());
                (host.to_owned(), local)
            }
        };
        Ok(Connection {
            ssl,
            version,
            cipher,
            mode: options.get_ssl_mode(),
            host,
            local,
        })
    }

    async fn server_facts(&self) -> Result<Server> {
        let row = sql::query(sql::DOCTOR_FACTS).fetch_one(self.pool()).await?;
        Ok(Server {
            version: row.try_get("version")?,
            fsync: row.try_get("fsync")?,
            full_page_writes: row.try_get("fpw")?,
            sync_names: row.try_get("sync_names")?,
            recovering: row.try_get("recovering")?,
            standbys: row.try_get("standbys")?,
            sync: row.try_get("sync")?,
            hidden: row.try_get("hidden")?,
            migrated: row.try_get("migrated")?,
        })
    }

    async fn applied(&self) -> Result<Applied> {
        let applied = sql::query(sql::SCHEMA_VERSION)
            .fetch_one(self.pool())
            .await
            .and_then(|row| row.try_get(0))
            .map_err(Error::from);
        match applied {
            Ok(version) => Ok(Applied::Version(version)),
            // An application role may not read the migrations table.
            Err(Error::NotPermitted { .. }) => Ok(Applied::Unreadable),
            Err(error) => Err(error),
        }
    }

    async fn timelines(&self) -> Result<Timelines> {
        let row = sql::query(sql::TIMELINE_FACTS)
            .fetch_one(self.pool())
            .await?;
        let delay: i64 = row.try_get("delay_us")?;
        Ok(Timelines {
            current: row.try_get("current")?,
            recorded: row.try_get("recorded")?,
            latest: self.admin().timeline_changes().await?.pop(),
            delay: Duration::from_micros(delay.max(0).unsigned_abs()),
        })
    }

    /// `pglease.audit()`'s findings, or why this role may not run it (any
    /// answer of the server's; an unreachable server is an error).
    async fn audit(&self) -> Result<std::result::Result<Vec<Finding>, String>> {
        let rows = match sql::query(sql::AUDIT).fetch_all(self.pool()).await {
            Ok(rows) => rows,
            Err(error) if crate::sqlstate::of(&error).is_some() => {
                return Ok(Err(Error::from(error).to_string()));
            }
            Err(error) => return Err(error.into()),
        };
        let findings = rows
            .iter()
            .map(|row| {
                Ok(Finding {
                    level: row.try_get("level")?,
                    topic: row.try_get("topic")?,
                    message: row.try_get("message")?,
                })
            })
            .collect::<sqlx::Result<_>>()?;
        Ok(Ok(findings))
    }

    /// The TTL and the failover time the `failover` check weighs; what
    /// cannot be read is kept as why.
    pub(super) async fn failover_facts(&self, options: &DoctorOptions) -> Failover {
        let ttl = match options.get_ttl() {
            Some(ttl) => Ttl::Given(ttl),
            None => match sql::query(sql::SHORTEST_HELD_TTL)
                .fetch_one(self.pool())
                .await
                .and_then(|row| row.try_get::<Option<i64>, _>(0))
            {
                Ok(micros) => Ttl::ShortestHeld(
                    micros
                        .and_then(|m| u64::try_from(m).ok())
                        .map(Duration::from_micros),
                ),
                Err(error) => Ttl::Unreadable(Error::from(error).to_string()),
            },
        };
        let time = match (
            options.get_failover_time(),
            options.get_monitor(),
            options.get_patroni(),
        ) {
            // The check stops at the unreadable TTLs: the monitor is not
            // asked.
            _ if matches!(ttl, Ttl::Unreadable(_)) => FailoverTime::Unknown,
            (Some(time), _, _) => FailoverTime::Given(time),
            (None, Some(monitor), _) => FailoverTime::Monitor(monitor_settings(monitor).await),
            (None, None, Some(patroni)) => FailoverTime::Patroni(patroni),
            (None, None, None) => FailoverTime::Unknown,
        };
        Failover { ttl, time }
    }
}

/// What every host of `target` says of itself, in order, or why it
/// cannot be asked.
pub(super) async fn hosts(target: &Target) -> Vec<std::result::Result<Host, String>> {
    let any = target.clone().with_attrs(SessionAttrs::Any);
    let mut facts = Vec::with_capacity(target.len());
    for index in 0..target.len() {
        facts.push(host(&any, index).await);
    }
    facts
}

/// What host `index` of `any` (a target whose attributes are `any`: every
/// server answers) says of itself, or why it cannot be asked.
async fn host(any: &Target, index: usize) -> std::result::Result<Host, String> {
    let mut connection = match any.connect_host(index, PER_HOST_TIMEOUT).await {
        Ok(Ok((connection, _))) => connection,
        Ok(Err(why)) => return Err(why),
        Err(error) => return Err(error.to_string()),
    };
    let row = sql::query(sql::HOST_FACTS)
        .fetch_one(&mut connection)
        .await
        .map_err(|e| Error::from(e).to_string())?;
    let _ = sqlx::Connection::close(connection).await;
    let get = |row: &sqlx::postgres::PgRow| -> sqlx::Result<Host> {
        let standbys: String = row.try_get("standbys")?;
        Ok(Host {
            recovering: row.try_get("recovering")?,
            read_only: row.try_get("read_only")?,
            sync_names: row.try_get("sync_names")?,
            streaming: row.try_get("streaming")?,
            application_name: row.try_get("application_name")?,
            standbys: standbys
                .split_whitespace()
                .filter_map(|s| s.rsplit_once('='))
                .map(|(a, s)| (a.to_owned(), s.to_owned()))
                .collect(),
        })
    };
    get(&row).map_err(|e| Error::from(e).to_string())
}

/// pg_auto_failover's monitor's `pgautofailover.*` settings, or why they
/// cannot be read; a row that does not decode is left out (the estimate
/// then names the setting it lacks).
async fn monitor_settings(monitor: &Target) -> std::result::Result<Vec<(String, String)>, String> {
    let (mut connection, _) = monitor
        .connect(PER_HOST_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    let rows = sql::query(sql::AUTO_FAILOVER_SETTINGS)
        .fetch_all(&mut connection)
        .await
        .map_err(|e| Error::from(e).to_string())?;
    let _ = sqlx::Connection::close(connection).await;
    Ok(rows
        .iter()
        .filter_map(|row| Some((row.try_get("name").ok()?, row.try_get("setting").ok()?)))
        .collect())
}
