//! Reading where to connect (`Target::parse`, `Target::from_env`): a
//! URL or libpq's `keyword=value` string, host and port lists,
//! `target_session_attrs`, TLS (`tls.rs`), the password file
//! (`passfile.rs`) and `connect_timeout`, as libpq reads them, with the
//! same environment variables as defaults. Both forms become one list of
//! libpq keywords, read by one function. Connecting is in `target.rs`.

use std::path::PathBuf;
use std::time::Duration;

use percent_encoding::percent_decode_str;
use sqlx::postgres::PgConnectOptions;

use super::target::{SessionAttrs, Target};
use super::tls::{Approach, Files, SslMode, TlsSettings};
use crate::error::{Error, Result};

/// The keywords pglease takes, as libpq names them (and sqlx's URL
/// spellings of the TLS ones), listed in the message for any other.
const KEYWORDS: &str = "host, hostaddr, port, dbname, user, password, passfile, \
    application_name, fallback_application_name, options, connect_timeout, sslmode, \
    sslrootcert, sslcert, sslkey, sslnegotiation, gssencmode, channel_binding, \
    target_session_attrs";

/// What `connect_timeout=0` (or a negative value) means: libpq waits
/// indefinitely; pglease waits this long.
const WAIT_INDEFINITELY: Duration = Duration::from_secs(365 * 86_400);

impl Target {
    /// Parses a PostgreSQL URL (`postgres://` or `postgresql://`) or a
    /// libpq `keyword=value` string, as libpq reads them: hosts from the
    /// URL's authority (`db1:5432,db2:5433`, `[::1]:5432`, a
    /// percent-encoded socket directory) or from `host` / `hostaddr` and
    /// `port` (one port for all hosts, or one per host), then
    /// `target_session_attrs`, `sslmode`, `sslrootcert` (a file or
    /// `system`), `sslcert`, `sslkey`, `passfile`, `connect_timeout`, ...
    /// Whatever is not given comes from libpq's environment variables
    /// (`PGHOST`, `PGSSLMODE`, `PGPASSFILE`, `PGCONNECT_TIMEOUT`, ...), then
    /// libpq's defaults (`~/.postgresql/root.crt`, `~/.pgpass`, ...).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (argument `url`), saying which key or value,
    /// for another scheme (`mysql://`, which sqlx would read as
    /// PostgreSQL's), a key pglease does not take, an empty host in a list,
    /// a port that is not a number, a port list that does not match the
    /// hosts, a `target_session_attrs` that is not `any`, `read-write` or
    /// `primary`, an `sslmode` libpq does not know, TLS settings libpq
    /// refuses (`verify-full` without a root certificate file, a weak
    /// sslmode with `sslrootcert=system`, a client key others may read),
    /// or a `connect_timeout` that is not a whole number of seconds.
    pub fn parse(conninfo: &str) -> Result<Target> {
        let conninfo = conninfo.trim();
        if conninfo.contains("://") {
            let (hosts, pairs) = url_pairs(conninfo)?;
            return build(pairs, hosts);
        }
        if conninfo.contains('=') {
            return build(split_keywords(conninfo)?, None);
        }
        Err(Error::invalid(
            "url",
            "is not a URL; pglease takes postgres://USER@HOST:PORT/DATABASE (or \
             postgresql://, or libpq's host=... dbname=... form)",
        ))
    }

    /// The libpq environment alone: `PGHOST` (or `PGHOSTADDR`) and
    /// `PGPORT`, which may be lists as in a URL, `PGTARGETSESSIONATTRS`,
    /// `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`, `PGPASSFILE`,
    /// `PGCONNECT_TIMEOUT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`,
    /// `PGAPPNAME`; without `PGHOST`, the local socket or `localhost:5432`.
    ///
    /// # Errors
    ///
    /// As [`Target::parse`], naming the variable.
    pub fn from_env() -> Result<Target> {
        build(Vec::new(), None)
    }

    /// The target of `hosts`, on `ports` (one for all, or one per host;
    /// else each host's own, else `default_port`) with `attrs` (by default
    /// read-write for several hosts).
    fn assemble(
        settings: Settings,
        hosts: Vec<(String, Option<u16>)>,
        ports: Option<&str>,
        default_port: u16,
    ) -> Result<Target> {
        let ports = match ports {
            None => Vec::new(),
            Some(ports) => ports
                .split(',')
                .map(|port| match port.trim() {
                    "" => Ok(5432),
                    port => port.parse::<u16>().map_err(|_| {
                        Error::invalid("url", format!("port {port:?} is not a port number"))
                    }),
                })
                .collect::<Result<Vec<u16>>>()?,
        };
        if ports.len() > 1 && ports.len() != hosts.len() {
            return Err(Error::invalid(
                "url",
                format!(
                    "names {} hosts and {} ports: give one port for all of them, or one per host",
                    hosts.len(),
                    ports.len()
                ),
            ));
        }
        let hosts: Vec<(String, u16)> = hosts
            .into_iter()
            .enumerate()
            .map(|(i, (host, port))| {
                let port = match ports.len() {
                    0 => port.unwrap_or(default_port),
                    1 => ports[0],
                    _ => ports[i],
                };
                (host, port)
            })
            .collect();
        let attrs = match settings
            .attrs
            .as_deref()
            .map(str::trim)
            .filter(|a| !a.is_empty())
        {
            Some(attrs) => SessionAttrs::parse(attrs)?,
            None if hosts.len() > 1 => SessionAttrs::ReadWrite,
            None => SessionAttrs::Any,
        };
        // libpq makes no TLS attempt over a socket, so TLS settings that
        // cannot be used matter only where a host is reached over TCP.
        let files = Files::read(&settings.tls);
        let tls = match Approach::decide(&settings.tls, &files) {
            Ok(approach) => approach,
            Err(_) if hosts.iter().all(|(host, _)| host.starts_with('/')) => {
                Approach::decide(&TlsSettings::default(), &Files::default())?
            }
            Err(e) => return Err(e),
        };
        let (first, port) = hosts[0].clone();
        Ok(Target {
            options: settings.options.host(&first).port(port),
            hosts,
            attrs,
            tls: Some(tls),
            passfile: if settings.password_given {
                None
            } else {
                super::passfile::location(settings.passfile.as_deref())
            },
            connect_timeout: settings.connect_timeout,
            rotated: Default::default(),
        })
    }
}

/// What the keywords (and the environment) say, before the hosts are
/// put together.
struct Settings {
    options: PgConnectOptions,
    attrs: Option<String>,
    tls: TlsSettings,
    password_given: bool,
    passfile: Option<PathBuf>,
    connect_timeout: Option<Duration>,
}

/// An environment variable, unset when empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Reads libpq's `pairs` (a later pair of a key replaces an earlier one,
/// as in libpq) over the environment's defaults; `url_hosts` are a URL's
/// authority, used unless `host` or `hostaddr` is given.
fn build(
    pairs: Vec<(String, String)>,
    url_hosts: Option<Vec<(String, Option<u16>)>>,
) -> Result<Target> {
    let keywords = pairs
        .into_iter()
        .try_fold(Keywords::from_env()?, |keywords, (key, value)| {
            keywords.with(&key, value)
        })?;
    let (settings, named) = keywords.settings()?;
    let place = named.place(url_hosts)?;
    Target::assemble(
        settings,
        place.hosts,
        place.ports.as_deref(),
        place.default_port,
    )
}

/// libpq's keywords as read so far, over the environment's defaults.
struct Keywords {
    options: PgConnectOptions,
    hosts: Option<String>,
    addrs: Option<String>,
    ports: Option<String>,
    attrs: Option<String>,
    tls: TlsSettings,
    /// `sslnegotiation` (or `PGSSLNEGOTIATION`), with the name it came by.
    negotiation: Option<(&'static str, String)>,
    password_given: bool,
    passfile: Option<PathBuf>,
    /// `connect_timeout` (or `PGCONNECT_TIMEOUT`), with the name it came by.
    timeout: Option<(&'static str, String)>,
    fallback_name: Option<String>,
    app_name_given: bool,
}

impl Keywords {
    /// The environment's defaults, before any keyword.
    fn from_env() -> Result<Keywords> {
        Ok(Keywords {
            // sqlx reads PGUSER, PGPASSWORD, PGDATABASE, PGAPPNAME and
            // PGOPTIONS here (and its own reading of the TLS variables is
            // replaced below).
            options: PgConnectOptions::new_without_pgpass(),
            hosts: None,
            addrs: None,
            ports: None,
            attrs: env("PGTARGETSESSIONATTRS"),
            tls: TlsSettings {
                mode: env("PGSSLMODE")
                    .map(|mode| SslMode::parse(&mode, "PGSSLMODE"))
                    .transpose()?,
                root: env("PGSSLROOTCERT"),
                cert: env("PGSSLCERT").map(PathBuf::from),
                key: env("PGSSLKEY").map(PathBuf::from),
            },
            negotiation: env("PGSSLNEGOTIATION").map(|v| ("PGSSLNEGOTIATION", v)),
            password_given: env("PGPASSWORD").is_some(),
            passfile: None,
            timeout: env("PGCONNECT_TIMEOUT").map(|v| ("PGCONNECT_TIMEOUT", v)),
            fallback_name: None,
            app_name_given: env("PGAPPNAME").is_some(),
        })
    }

    /// These keywords and `key`=`value`, which replaces an earlier value
    /// of `key`; a key pglease does not take, or a value it cannot meet,
    /// is refused, naming it.
    fn with(mut self, key: &str, value: String) -> Result<Keywords> {
        match key {
            "host" => self.hosts = Some(value),
            "hostaddr" => self.addrs = Some(value),
            "port" => self.ports = Some(value),
            "target_session_attrs" => self.attrs = Some(value),
            "dbname" => self.options = self.options.database(&value),
            "user" => self.options = self.options.username(&value),
            "password" => {
                self.options = self.options.password(&value);
                self.password_given = true;
            }
            "passfile" => self.passfile = Some(PathBuf::from(value)),
            "application_name" => {
                self.options = self.options.application_name(&value);
                self.app_name_given = true;
            }
            "fallback_application_name" => self.fallback_name = Some(value),
            "options" => self.options = self.options.options(split_server_options(&value)),
            "connect_timeout" => self.timeout = Some(("connect_timeout", value)),
            "sslmode" | "ssl-mode" => self.tls.mode = Some(SslMode::parse(&value, "sslmode")?),
            "sslrootcert" | "ssl-root-cert" | "ssl-ca" => self.tls.root = Some(value),
            "sslcert" | "ssl-cert" => self.tls.cert = Some(PathBuf::from(value)),
            "sslkey" | "ssl-key" => self.tls.key = Some(PathBuf::from(value)),
            "sslnegotiation" => self.negotiation = Some(("sslnegotiation", value)),
            "gssencmode" | "channel_binding" => unmet(key, &value)?,
            other => {
                return Err(Error::invalid(
                    "url",
                    format!("has the keyword {other:?}, which pglease does not take ({KEYWORDS})"),
                ));
            }
        }
        Ok(self)
    }

    /// What all the keywords make, once read: the settings (the fallback
    /// application name where none was given, `connect_timeout` read) and
    /// the hosts and ports named; an `sslnegotiation` sqlx cannot do is
    /// refused.
    fn settings(self) -> Result<(Settings, Named)> {
        let mut options = self.options;
        if let (Some(name), false) = (self.fallback_name, self.app_name_given) {
            options = options.application_name(&name);
        }
        negotiable(self.negotiation)?;
        let settings = Settings {
            options,
            attrs: self.attrs,
            tls: self.tls,
            password_given: self.password_given,
            passfile: self.passfile,
            connect_timeout: self
                .timeout
                .map(|(what, value)| connect_timeout(what, &value))
                .transpose()?,
        };
        let named = Named {
            hosts: self.addrs.or(self.hosts).filter(|list| !list.is_empty()),
            ports: self.ports,
        };
        Ok((settings, named))
    }
}

/// A `gssencmode` or `channel_binding` (`key`) of `value` is refused
/// unless it asks for nothing sqlx lacks (`disable` or `prefer`).
fn unmet(key: &str, value: &str) -> Result<()> {
    if matches!(value, "disable" | "prefer") {
        return Ok(());
    }
    let what = if key == "gssencmode" {
        "GSSAPI encryption"
    } else {
        "channel binding"
    };
    Err(Error::invalid(
        "url",
        format!(
            "{key}={value} cannot be met: pglease's driver (sqlx) has no {what}; use \
             {key}=prefer or disable"
        ),
    ))
}

/// An `sslnegotiation` (or `PGSSLNEGOTIATION`) other than `postgres` is
/// refused: sqlx negotiates TLS the PostgreSQL way only.
fn negotiable(negotiation: Option<(&str, String)>) -> Result<()> {
    match negotiation {
        None => Ok(()),
        Some((_, value)) if value == "postgres" => Ok(()),
        Some((what, value)) => Err(Error::invalid(
            "url",
            format!(
                "{what}={value} is not supported: pglease's driver (sqlx) negotiates TLS \
                 the PostgreSQL way only (sslnegotiation=postgres)"
            ),
        )),
    }
}

/// The hosts (`hostaddr`, else `host`; unset when empty) and ports the
/// keywords name.
struct Named {
    hosts: Option<String>,
    ports: Option<String>,
}

/// Where to connect, before the ports are matched to the hosts: the
/// hosts, with a URL's own ports, the port list, and the port for a host
/// with none.
struct Place {
    hosts: Vec<(String, Option<u16>)>,
    ports: Option<String>,
    default_port: u16,
}

impl Named {
    /// Where the hosts come from, in libpq's order: the keywords, else a
    /// URL's authority (`url_hosts`), else `PGHOSTADDR` or `PGHOST`, else
    /// the local socket (or `localhost`); ports from the keywords, else
    /// `PGPORT` (a URL's own ports come with its hosts: `PGPORT` only for
    /// those without one), else 5432.
    fn place(self, url_hosts: Option<Vec<(String, Option<u16>)>>) -> Result<Place> {
        let env_port = env("PGPORT");
        let default_port = match &env_port {
            Some(port) if !port.contains(',') => port.trim().parse().unwrap_or(5432),
            _ => 5432,
        };
        if let Some(list) = self.hosts {
            let hosts = split_hosts(&list, "host=")?;
            let ports = self.ports.or(env_port);
            return Ok(Place {
                hosts,
                ports,
                default_port,
            });
        }
        if let Some(hosts) = url_hosts.filter(|hosts| !hosts.is_empty()) {
            let ports = self.ports.or_else(|| env_port.filter(|p| p.contains(',')));
            return Ok(Place {
                hosts,
                ports,
                default_port,
            });
        }
        if let Some(list) = env("PGHOSTADDR").or_else(|| env("PGHOST")) {
            let hosts = split_hosts(&list, "PGHOST")?;
            let ports = self.ports.or(env_port);
            return Ok(Place {
                hosts,
                ports,
                default_port,
            });
        }
        local(self.ports.or(env_port).as_deref())
    }
}

/// No host at all: the local socket if there is one, else `localhost`, on
/// `port` (one, not a list), else 5432.
fn local(port: Option<&str>) -> Result<Place> {
    let port = match port {
        Some(port) => port
            .trim()
            .parse::<u16>()
            .map_err(|_| Error::invalid("url", format!("port {port:?} is not a port number")))?,
        None => 5432,
    };
    let host = PgConnectOptions::new_without_pgpass()
        .port(port)
        .get_host()
        .to_owned();
    let host = default_socket(port).unwrap_or(host);
    Ok(Place {
        hosts: vec![(host, Some(port))],
        ports: None,
        default_port: port,
    })
}

/// sqlx's default, a socket directory where the server's socket for `port`
/// exists (else `localhost`).
fn default_socket(port: u16) -> Option<String> {
    ["/var/run/postgresql", "/private/tmp", "/tmp"]
        .into_iter()
        .find(|dir| {
            std::path::Path::new(dir)
                .join(format!(".s.PGSQL.{port}"))
                .exists()
        })
        .map(str::to_owned)
}

/// `connect_timeout` as libpq reads it: whole seconds, at least 2; zero or
/// less waits indefinitely.
fn connect_timeout(what: &str, value: &str) -> Result<Duration> {
    let seconds: i64 = value.trim().parse().map_err(|_| {
        Error::invalid(
            "url",
            format!("{what}={value} is not a whole number of seconds"),
        )
    })?;
    Ok(match seconds {
        ..=0 => WAIT_INDEFINITELY,
        1 => Duration::from_secs(2),
        n => Duration::from_secs(n.unsigned_abs().min(WAIT_INDEFINITELY.as_secs())),
    })
}

/// A `host=` (or `PGHOST`) list, `a,b,/var/run/postgresql`: the names
/// alone, their ports coming from `port=` (or `PGPORT`). `what` names the
/// list in the message for an empty entry.
fn split_hosts(list: &str, what: &str) -> Result<Vec<(String, Option<u16>)>> {
    list.split(',')
        .map(|entry| {
            let entry = entry.trim();
            if entry.is_empty() {
                return Err(Error::invalid(
                    "url",
                    format!("{what} has an empty entry in its host list {list:?}"),
                ));
            }
            Ok((entry.to_owned(), None))
        })
        .collect()
}

/// One entry of a URL's authority: `host`, `host:port`, `[v6]`, `[v6]:port`,
/// percent-decoded (a socket directory is written `%2Fvar%2Frun%2Fpostgresql`).
fn url_host(entry: &str, list: &str) -> Result<(String, Option<u16>)> {
    let bad = |why: &str| Error::invalid("url", format!("host {entry:?} in {list:?} {why}"));
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (host, rest) = rest
            .split_once(']')
            .ok_or_else(|| bad("has no closing ]"))?;
        match rest {
            "" => (host, None),
            _ => (
                host,
                Some(rest.strip_prefix(':').ok_or_else(|| bad("is malformed"))?),
            ),
        }
    } else {
        match entry.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        }
    };
    if host.is_empty() {
        return Err(Error::invalid(
            "url",
            format!("has an empty entry in its host list {list:?}"),
        ));
    }
    let port = match port {
        None | Some("") => None,
        Some(port) => Some(
            port.parse::<u16>()
                .map_err(|_| bad(&format!("has port {port:?}, which is not a port number")))?,
        ),
    };
    let host = percent_decode_str(host)
        .decode_utf8()
        .map_err(|_| bad("is not UTF-8 once decoded"))?
        .into_owned();
    Ok((host, port))
}

/// A `postgres://` URL as libpq reads it: the authority's hosts (if any),
/// and the rest as keyword pairs (user and password from the user info,
/// dbname from the path, the query's pairs percent-decoded).
#[allow(clippy::type_complexity)]
fn url_pairs(url: &str) -> Result<(Option<Vec<(String, Option<u16>)>>, Vec<(String, String)>)> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    if !matches!(scheme, "postgres" | "postgresql") {
        return Err(Error::invalid(
            "url",
            format!(
                "is a {scheme}:// URL; pglease connects to PostgreSQL: \
                 postgres://USER@HOST:PORT/DATABASE (or postgresql://)"
            ),
        ));
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hostlist) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (Some(user), hosts),
        None => (None, authority),
    };
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let mut pairs = Vec::new();
    if let Some(userinfo) = userinfo {
        let (user, password) = match userinfo.split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (userinfo, None),
        };
        if !user.is_empty() {
            pairs.push(("user".to_owned(), decode(user, "the user name", false)?));
        }
        if let Some(password) = password {
            pairs.push((
                "password".to_owned(),
                decode(password, "the password", false)?,
            ));
        }
    }
    let path = path.trim_start_matches('/');
    if !path.is_empty() {
        pairs.push((
            "dbname".to_owned(),
            decode(path, "the database name", false)?,
        ));
    }
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode(key, "a query key", true)?;
        let value = decode(value, &format!("{key}="), true)?;
        pairs.push((key, value));
    }
    let hosts = if hostlist.is_empty() {
        None
    } else {
        Some(
            hostlist
                .split(',')
                .map(|entry| url_host(entry, hostlist))
                .collect::<Result<Vec<_>>>()?,
        )
    };
    Ok((hosts, pairs))
}

/// Percent-decodes `text` (in a query, `+` is a space); `what` names it in
/// the message.
fn decode(text: &str, what: &str, query: bool) -> Result<String> {
    let text = if query {
        text.replace('+', " ")
    } else {
        text.to_owned()
    };
    percent_decode_str(&text)
        .decode_utf8()
        .map(|v| v.into_owned())
        .map_err(|_| Error::invalid("url", format!("{what} is not UTF-8 once decoded")))
}

/// `-c a=b -c c=d` as (name, value) pairs for [`PgConnectOptions::options`].
fn split_server_options(value: &str) -> Vec<(String, String)> {
    let words: Vec<&str> = value.split_whitespace().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let setting = match words[i] {
            "-c" => {
                i += 1;
                words.get(i).copied()
            }
            word => word.strip_prefix("-c").or(word.strip_prefix("--")),
        };
        if let Some((name, value)) = setting.and_then(|s| s.split_once('=')) {
            out.push((name.to_owned(), value.to_owned()));
        }
        i += 1;
    }
    out
}

fn split_keywords(conninfo: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut chars = conninfo.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(Error::invalid(
                "url",
                format!("has {key:?} without \"=value\" (libpq's form is keyword=value ...)"),
            ));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => {
                        return Err(Error::invalid(
                            "url",
                            format!("has an unterminated quoted value for {key:?}"),
                        ));
                    }
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(conninfo: &str) -> Vec<String> {
        Target::parse(conninfo)
            .unwrap_or_else(|e| panic!("{conninfo}: {e}"))
            .hosts()
    }

    #[test]
    fn hosts_and_ports_as_libpq_reads_them() {
        assert_eq!(hosts("postgres://u@a:1,b:2/db"), ["a:1", "b:2"]);
        assert_eq!(hosts("postgres://u@a,b:2/db"), ["a:5432", "b:2"]);
        assert_eq!(
            hosts("postgres://[::1]:7,[::2]/db"),
            ["[::1]:7", "[::2]:5432"]
        );
        assert_eq!(hosts("postgresql://u@x/db?host=a,b&port=3"), ["a:3", "b:3"]);
        assert_eq!(hosts("postgres://u@x/db?host=a,b&port=3,4"), ["a:3", "b:4"]);
        assert_eq!(hosts("postgres://u@%2Ftmp%2Fpg:6/db"), ["/tmp/pg:6"]);
        assert_eq!(hosts("host=a,b port=5,6 dbname=x"), ["a:5", "b:6"]);
        assert_eq!(hosts("host = 'a' port=5"), ["a:5"]);
        let t = Target::parse("postgres://u@a:1,b:2/db?sslmode=disable&application_name=x")
            .expect("parse");
        let second = t.host_options(1);
        assert_eq!((second.get_host(), second.get_port()), ("b", 2));
        assert_eq!(second.get_database(), Some("db"));
        assert_eq!(second.get_username(), "u");
        assert_eq!(second.get_application_name(), Some("x"));
    }

    #[test]
    fn attributes_default_to_read_write_only_for_several_hosts() {
        let attrs = |s: &str| Target::parse(s).expect("parse").attrs();
        assert_eq!(attrs("postgres://u@a/db"), SessionAttrs::Any);
        assert_eq!(attrs("postgres://u@a,b/db"), SessionAttrs::ReadWrite);
        assert_eq!(
            attrs("postgres://u@a,b/db?target_session_attrs=any"),
            SessionAttrs::Any
        );
        assert_eq!(
            attrs("postgres://u@a/db?target_session_attrs=primary"),
            SessionAttrs::Primary
        );
        assert_eq!(
            attrs("host=a target_session_attrs=read-write"),
            SessionAttrs::ReadWrite
        );
    }

    #[test]
    fn bad_lists_and_attributes_are_refused_with_why() {
        for (conninfo, said) in [
            ("postgres://u@a,,b/db", "empty entry"),
            ("postgres://u@a:x/db", "not a port number"),
            (
                "postgres://u@x/db?host=a,b,c&port=1,2",
                "3 hosts and 2 ports",
            ),
            (
                "postgres://u@a/db?target_session_attrs=standby",
                "cannot be written",
            ),
            (
                "postgres://u@a/db?target_session_attrs=prefer-standby",
                "cannot be written",
            ),
            (
                "postgres://u@a/db?target_session_attrs=rw",
                "not one libpq knows",
            ),
            ("host=a dbnme=x", "dbnme"),
            ("host='a", "unterminated"),
            ("host", "not a URL"),
            ("mysql://u@a/db", "mysql://"),
        ] {
            match Target::parse(conninfo) {
                Err(e @ Error::InvalidInput { .. }) => {
                    assert!(e.to_string().contains(said), "{conninfo}: {e}");
                }
                other => panic!("{conninfo}: expected InvalidInput, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_url_becomes_libpqs_keywords_decoded() {
        let (hosts, pairs) =
            url_pairs("postgres://al%40x:p%3Ass@a,b:2/d%2Fb?sslmode=disable&port=1%2C2&application_name=my+app")
                .expect("split");
        assert_eq!(
            hosts,
            Some(vec![("a".to_owned(), None), ("b".to_owned(), Some(2))])
        );
        let pairs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("user", "al@x"),
                ("password", "p:ss"),
                ("dbname", "d/b"),
                ("sslmode", "disable"),
                ("port", "1,2"),
                ("application_name", "my app"),
            ]
        );
        let t = Target::parse(
            "postgres://u@a/db?target_session_attrs=any&target_session_attrs=read-write",
        )
        .expect("parse");
        assert_eq!(t.attrs(), SessionAttrs::ReadWrite);
        match Target::parse("postgres://u@a/db?host=%FF") {
            Err(e @ Error::InvalidInput { .. }) => {
                assert!(e.to_string().contains("host= is not UTF-8"), "{e}");
            }
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn unknown_keys_and_values_are_refused_naming_them() {
        for (conninfo, said) in [
            (
                "postgres://u@a/db?target_sesion_attrs=read-write",
                "\"target_sesion_attrs\"",
            ),
            (
                "postgres://u@a/db?sslmode=requir",
                "sslmode=requir is not one libpq knows",
            ),
            (
                "host=a sslmode=requir",
                "sslmode=requir is not one libpq knows",
            ),
            (
                "postgres://u@a/db?connect_timeout=5s",
                "connect_timeout=5s is not a whole number",
            ),
            (
                "postgres://u@a/db?sslnegotiation=direct",
                "sslnegotiation=direct is not supported",
            ),
            (
                "postgres://u@a/db?gssencmode=require",
                "gssencmode=require cannot be met",
            ),
            (
                "postgres://u@a/db?sslmode=prefer&sslrootcert=system",
                "weak sslmode \"prefer\"",
            ),
        ] {
            match Target::parse(conninfo) {
                Err(e @ Error::InvalidInput { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains(said), "{conninfo}: {text}");
                    assert!(
                        !text.contains("error with configuration"),
                        "{conninfo}: {text}"
                    );
                }
                other => panic!("{conninfo}: expected InvalidInput, got {other:?}"),
            }
        }
    }

    #[test]
    fn connect_timeout_as_libpq_reads_it() {
        let timeout = |s: &str| connect_timeout("connect_timeout", s).expect("parse");
        assert_eq!(timeout("10"), Duration::from_secs(10));
        assert_eq!(timeout("1"), Duration::from_secs(2));
        assert_eq!(timeout("0"), WAIT_INDEFINITELY);
        assert_eq!(timeout("-3"), WAIT_INDEFINITELY);
        let t = Target::parse("postgres://u@a/db?connect_timeout=7").expect("parse");
        assert_eq!(t.connect_timeout(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn quoted_keyword_values() {
        let pairs = split_keywords(r"password='it\'s a \\ secret' user=x\ y").expect("split");
        assert_eq!(
            pairs,
            [
                ("password".to_owned(), r"it's a \ secret".to_owned()),
                ("user".to_owned(), "x y".to_owned()),
            ]
        );
    }
}
