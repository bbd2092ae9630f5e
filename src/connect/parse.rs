//! Reading where to connect (`Target::parse`, `Target::from_env`): a
//! URL or libpq's `keyword=value` string, host and port lists, and
//! `target_session_attrs`, as libpq reads them. Connecting is in
//! `target.rs`.

use percent_encoding::percent_decode_str;
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use super::target::{SessionAttrs, Target};
use crate::error::{Error, Result};

impl Target {
    /// Parses a PostgreSQL URL (`postgres://` or `postgresql://`) or a
    /// libpq `keyword=value` string. Hosts come from the URL's authority
    /// (`db1:5432,db2:5433`, `[::1]:5432`, a percent-encoded socket
    /// directory) or from `host` / `hostaddr` and `port` (one port for all
    /// hosts, or one per host); `target_session_attrs` from the URL's query
    /// or the keyword (or `PGTARGETSESSIONATTRS`). Everything else is read
    /// as sqlx reads a URL.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (argument `url`) for another scheme
    /// (`mysql://`, which sqlx would read as PostgreSQL's), an empty host
    /// in a list, a port that is not a number, a port list that does not
    /// match the hosts, a `target_session_attrs` that is not `any`,
    /// `read-write` or `primary`, or an unknown keyword; [`Error::Database`]
    /// for a URL sqlx cannot parse.
    pub fn parse(conninfo: &str) -> Result<Target> {
        let conninfo = conninfo.trim();
        if conninfo.contains("://") {
            return parse_url(conninfo);
        }
        if conninfo.contains('=') {
            return parse_keywords(conninfo);
        }
        Err(Error::invalid(
            "url",
            "is not a URL; pglease takes postgres://USER@HOST:PORT/DATABASE (or \
             postgresql://, or libpq's host=... dbname=... form)",
        ))
    }

    /// The libpq environment: `PGHOST` (or `PGHOSTADDR`) and `PGPORT`,
    /// which may be lists as in a URL, `PGTARGETSESSIONATTRS`, and
    /// `PGUSER`, `PGPASSWORD`, `PGDATABASE`, ... as sqlx reads them;
    /// without `PGHOST`, the local socket or `localhost:5432`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for lists that do not fit together or a
    /// `PGTARGETSESSIONATTRS` pglease does not take.
    pub fn from_env() -> Result<Target> {
        let options = PgConnectOptions::new();
        let hosts = std::env::var("PGHOSTADDR")
            .or_else(|_| std::env::var("PGHOST"))
            .ok()
            .filter(|hosts| !hosts.is_empty());
        let ports = std::env::var("PGPORT").ok().filter(|p| !p.is_empty());
        let attrs = std::env::var("PGTARGETSESSIONATTRS").ok();
        let hosts = match hosts {
            Some(hosts) => split_hosts(&hosts, "PGHOST")?,
            None => vec![(options.get_host().to_owned(), None)],
        };
        Target::assemble(options, hosts, ports.as_deref(), attrs.as_deref())
    }

    /// The target of `hosts`, on `ports` (one for all, or one per host;
    /// else each host's own, else `options`') with `attrs` (by default
    /// read-write for several hosts).
    fn assemble(
        options: PgConnectOptions,
        hosts: Vec<(String, Option<u16>)>,
        ports: Option<&str>,
        attrs: Option<&str>,
    ) -> Result<Target> {
        let default_port = options.get_port();
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
        let attrs = match attrs.map(str::trim).filter(|a| !a.is_empty()) {
            Some(attrs) => SessionAttrs::parse(attrs)?,
            None if hosts.len() > 1 => SessionAttrs::ReadWrite,
            None => SessionAttrs::Any,
        };
        let (first, port) = hosts[0].clone();
        Ok(Target {
            options: options.host(&first).port(port),
            hosts,
            attrs,
        })
    }
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

/// A `postgres://` URL: hosts, ports and `target_session_attrs` read as
/// libpq reads them (from the authority or the query, else from the
/// environment), the rest as sqlx reads it.
fn parse_url(url: &str) -> Result<Target> {
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
    let query = Query::split(query)?;
    let options = sqlx_options(userinfo, path, &query.kept)?;
    let mut hosts = Vec::new();
    if let Some(list) = query.addrs.or(query.hosts) {
        hosts = split_hosts(&list, "host=")?;
    } else if !hostlist.is_empty() {
        for entry in hostlist.split(',') {
            hosts.push(url_host(entry, hostlist)?);
        }
    }
    let attrs = query
        .attrs
        .or_else(|| std::env::var("PGTARGETSESSIONATTRS").ok());
    if hosts.is_empty()
        && let Some(list) = std::env::var("PGHOST").ok().filter(|h| !h.is_empty())
    {
        // No host in the URL (`postgres:///db`): PGHOST's, as libpq does.
        hosts = split_hosts(&list, "PGHOST")?;
        let ports = query.ports.or_else(|| std::env::var("PGPORT").ok());
        return Target::assemble(options, hosts, ports.as_deref(), attrs.as_deref());
    }
    if hosts.is_empty() {
        // No host at all: sqlx's default, one host.
        hosts.push(default_host(query.ports.as_deref())?);
        return Target::assemble(options, hosts, None, attrs.as_deref());
    }
    Target::assemble(options, hosts, query.ports.as_deref(), attrs.as_deref())
}

/// A URL's query, split: what libpq takes from it itself, percent-decoded,
/// and the pairs left for sqlx to read, as written.
#[derive(Debug, Default, PartialEq, Eq)]
struct Query<'a> {
    /// `host=`: a host list.
    hosts: Option<String>,
    /// `hostaddr=`: a host list, taken before `host=`'s.
    addrs: Option<String>,
    /// `port=`: one port, or one per host.
    ports: Option<String>,
    /// `target_session_attrs=`.
    attrs: Option<String>,
    /// The other pairs.
    kept: Vec<&'a str>,
}

impl Query<'_> {
    /// Splits `query` (what follows the URL's `?`); a later pair of a key
    /// libpq reads replaces an earlier one.
    fn split(query: &str) -> Result<Query<'_>> {
        let mut split = Query::default();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decoded = || {
                percent_decode_str(&value.replace('+', " "))
                    .decode_utf8()
                    .map(|v| v.into_owned())
                    .map_err(|_| Error::invalid("url", format!("{key}= is not UTF-8 once decoded")))
            };
            match key {
                "host" => split.hosts = Some(decoded()?),
                "hostaddr" => split.addrs = Some(decoded()?),
                "port" => split.ports = Some(decoded()?),
                "target_session_attrs" => split.attrs = Some(decoded()?),
                _ => split.kept.push(pair),
            }
        }
        Ok(split)
    }
}

/// What sqlx reads from a URL (user, password, database, the query's
/// `kept` pairs), read with a placeholder host (and no socket), so that
/// each host's options differ only in host and port.
fn sqlx_options(userinfo: Option<&str>, path: &str, kept: &[&str]) -> Result<PgConnectOptions> {
    let mut single = format!(
        "postgres://{}",
        userinfo.map_or(String::new(), |u| format!("{u}@"))
    );
    single.push_str("localhost");
    single.push_str(path);
    if !kept.is_empty() {
        single.push('?');
        single.push_str(&kept.join("&"));
    }
    Ok(single.parse()?)
}

/// sqlx's default host, for a URL that names none (nor does `PGHOST`),
/// on the query's `port` if it gives one.
fn default_host(port: Option<&str>) -> Result<(String, Option<u16>)> {
    let default = PgConnectOptions::new_without_pgpass();
    let port = port.map_or(Ok(None), |p| {
        p.trim()
            .parse::<u16>()
            .map(Some)
            .map_err(|_| Error::invalid("url", format!("port {p:?} is not a port number")))
    })?;
    Ok((
        default.get_host().to_owned(),
        port.or(Some(default.get_port())),
    ))
}

/// libpq's `keyword=value ...` form: values may be single-quoted, with
/// `\'` and `\\` inside.
fn parse_keywords(conninfo: &str) -> Result<Target> {
    let pairs = split_keywords(conninfo)?;
    let mut options = PgConnectOptions::new();
    let mut hosts = None;
    let mut addrs = None;
    let mut ports = std::env::var("PGPORT").ok();
    let mut attrs = std::env::var("PGTARGETSESSIONATTRS").ok();
    for (key, value) in pairs {
        match key.as_str() {
            "host" => hosts = Some(value),
            "hostaddr" => addrs = Some(value),
            "port" => ports = Some(value),
            "target_session_attrs" => attrs = Some(value),
            "dbname" => options = options.database(&value),
            "user" => options = options.username(&value),
            "password" => options = options.password(&value),
            "application_name" => options = options.application_name(&value),
            "options" => options = options.options(split_server_options(&value)),
            "sslmode" => {
                let mode: PgSslMode = value.parse().map_err(|_| {
                    Error::invalid("url", format!("sslmode={value} is not one libpq knows"))
                })?;
                options = options.ssl_mode(mode);
            }
            "sslrootcert" => options = options.ssl_root_cert(&value),
            "sslcert" => options = options.ssl_client_cert(&value),
            "sslkey" => options = options.ssl_client_key(&value),
            other => {
                return Err(Error::invalid(
                    "url",
                    format!(
                        "has the keyword {other:?}, which pglease does not take (host, \
                         hostaddr, port, dbname, user, password, application_name, options, \
                         sslmode, sslrootcert, sslcert, sslkey, target_session_attrs)"
                    ),
                ));
            }
        }
    }
    let hosts = match addrs.or(hosts).or_else(|| std::env::var("PGHOST").ok()) {
        Some(list) if !list.is_empty() => split_hosts(&list, "host=")?,
        _ => vec![(options.get_host().to_owned(), None)],
    };
    Target::assemble(options, hosts, ports.as_deref(), attrs.as_deref())
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
    fn a_query_gives_libpq_its_keys_decoded_and_keeps_the_rest_as_written() {
        let query =
            Query::split("sslmode=disable&host=a,b&&port=1%2C2&application_name=my+app&hostaddr")
                .expect("split");
        assert_eq!(
            query,
            Query {
                hosts: Some("a,b".to_owned()),
                addrs: Some(String::new()),
                ports: Some("1,2".to_owned()),
                attrs: None,
                kept: vec!["sslmode=disable", "application_name=my+app"],
            }
        );
        let attrs = Query::split("target_session_attrs=any&target_session_attrs=read-write")
            .expect("split");
        assert_eq!(attrs.attrs.as_deref(), Some("read-write"));
        match Query::split("host=%FF") {
            Err(e @ Error::InvalidInput { .. }) => {
                assert!(e.to_string().contains("host= is not UTF-8"), "{e}");
            }
            other => panic!("expected InvalidInput, got {other:?}"),
        }
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
