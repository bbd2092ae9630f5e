//! Finding a PostgreSQL to run against, in one order everywhere (the
//! tests, `pglease demo`, the benchmark, and your own tests through
//! [`crate::testing`]):
//!
//! 1. `DATABASE_URL`, when set (it must answer: it is not skipped);
//! 2. the libpq defaults (`PGHOST`, `PGPORT`, `PGUSER`, `PGDATABASE`, ...,
//!    then localhost:5432), if a server answers there within 5 s;
//! 3. a throwaway cluster started from the installed server binaries
//!    ([`TempCluster`]), removed when the process exits;
//! 4. with the feature `containers`, a container through `testcontainers`
//!    (needs a Docker engine);
//! 5. else [`NoServer`], which says what each step found and how to get a
//!    database.
//!
//! Behind the feature `provision` (also part of `testing`).

mod cluster;
pub mod host;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};
use tokio::sync::OnceCell;

pub use cluster::{BINDIR_VARIABLE, ClusterError, TempCluster};

/// How long a server found by the libpq defaults has to answer.
const ANSWER_LIMIT: Duration = Duration::from_secs(5);

/// Which step of the order found the server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// `DATABASE_URL` (or a URL given by the caller).
    Url,
    /// The libpq defaults.
    LibpqDefaults,
    /// A throwaway cluster started by this process; the text says where.
    TempCluster(String),
    /// A container started by this process.
    Container,
}

/// A server found by [`find`] or [`server`].
#[derive(Debug, Clone)]
pub struct Server {
    /// How to connect to it (its `postgres` database or the one named).
    pub options: PgConnectOptions,
    /// Which step found it.
    pub source: Source,
    /// The password, when the server needs one that the options carry
    /// (a container's); for building URLs.
    password: Option<String>,
    /// The URL it was found by, kept whole (it may carry a password and
    /// parameters that the options do not give back).
    url: Option<String>,
}

impl Server {
    /// A URL for database `database` on this server, with the same user
    /// (and password, for a container), for programs that take a URL.
    pub fn url(&self, database: &str) -> String {
        if let Some(url) = &self.url {
            // Same server, credentials and parameters; this database.
            let (base, query) = match url.split_once('?') {
                Some((base, query)) => (base, format!("?{query}")),
                None => (url.as_str(), String::new()),
            };
            let authority = base.find("://").map_or(0, |i| i + 3);
            let base = match base[authority..].find('/') {
                Some(slash) => &base[..authority + slash],
                None => base,
            };
            return format!("{base}/{database}{query}");
        }
        let o = &self.options;
        let user = o.get_username();
        let password = self
            .password
            .as_deref()
            .map(|p| format!(":{p}"))
            .unwrap_or_default();
        let host = o.get_host();
        if host.starts_with('/') {
            // A socket directory: the `host` parameter overrides the
            // placeholder host name.
            format!(
                "postgres://{user}{password}@localhost:{}/{database}?host={host}",
                o.get_port()
            )
        } else {
            format!(
                "postgres://{user}{password}@{host}:{}/{database}",
                o.get_port()
            )
        }
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (host, port) = (self.options.get_host(), self.options.get_port());
        match &self.source {
            Source::Url => write!(f, "the server of DATABASE_URL ({host}:{port})"),
            Source::LibpqDefaults => write!(f, "the server of the libpq defaults ({host}:{port})"),
            Source::TempCluster(what) => f.write_str(what),
            Source::Container => write!(f, "a container on {host}:{port}"),
        }
    }
}

/// No PostgreSQL could be found or started; says what each step found.
/// Its `Debug` is its message, so that `.expect()` prints it readably.
#[derive(Clone, thiserror::Error)]
#[error(
    "no PostgreSQL to use:\n{tried}\nStart a server, or set DATABASE_URL=postgres://USER@HOST:PORT/DB, or install the PostgreSQL server binaries (initdb, postgres, pg_ctl) for a throwaway cluster"
)]
pub struct NoServer {
    tried: String,
}

impl fmt::Debug for NoServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Finds a server in the order of this module, or uses `url` when given
/// (then it must answer). A throwaway cluster it starts lives until this
/// process exits.
///
/// # Errors
///
/// [`NoServer`], listing each step and why it gave nothing; with `url`,
/// only that URL's failure.
///
/// # Cancel safety
///
/// Cancelled while it starts a throwaway cluster, the cluster is removed
/// when the process exits.
pub async fn find(url: Option<&str>) -> Result<Server, NoServer> {
    let mut tried = Vec::new();
    if let Some(url) = url {
        let options = PgConnectOptions::from_str(url).map_err(|e| NoServer {
            tried: format!("- the URL given: not a PostgreSQL URL: {e}"),
        })?;
        answers(&options).await.map_err(|e| NoServer {
            tried: format!("- the URL given: {e}"),
        })?;
        return Ok(Server {
            password: None,
            url: Some(url.to_owned()),
            options,
            source: Source::Url,
        });
    }
    let local = crate::connect::libpq_defaults();
    let passed_over = match answers(&local).await {
        Ok(()) => {
            return Ok(Server {
                options: local,
                source: Source::LibpqDefaults,
                password: None,
                url: None,
            });
        }
        Err(e) => format!(
            "the libpq defaults ({}:{}): {e}",
            local.get_host(),
            local.get_port()
        ),
    };
    tried.push(format!("- {passed_over}"));
    match TempCluster::start().await {
        Ok(cluster) => {
            let (options, what) = cluster.keep_until_exit();
            return Ok(Server {
                options,
                // Why not the libpq defaults, for whoever expected them.
                source: Source::TempCluster(format!("{what} (not {passed_over})")),
                password: None,
                url: None,
            });
        }
        Err(e) => tried.push(format!("- a throwaway cluster: {e}")),
    }
    #[cfg(feature = "containers")]
    match container::start().await {
        Ok(server) => return Ok(server),
        Err(e) => tried.push(format!("- a container (testcontainers): {e}")),
    }
    #[cfg(not(feature = "containers"))]
    tried.push("- a container: not built in (feature `containers`)".to_owned());
    Err(NoServer {
        tried: tried.join("\n"),
    })
}

/// The server for this process: [`find`] with `DATABASE_URL` (if set),
/// run once; every later call (from any runtime or thread) gets the same
/// server, or the same error.
///
/// # Errors
///
/// As [`find`].
///
/// # Cancel safety
///
/// Cancelled during the search, the next call searches again.
pub async fn server() -> Result<&'static Server, NoServer> {
    static SERVER: OnceCell<Result<Server, NoServer>> = OnceCell::const_new();
    let url = std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty());
    SERVER
        .get_or_init(|| async move { find(url.as_deref()).await })
        .await
        .as_ref()
        .map_err(Clone::clone)
}

/// Whether a server answers `options` within [`ANSWER_LIMIT`].
async fn answers(options: &PgConnectOptions) -> Result<(), String> {
    match tokio::time::timeout(ANSWER_LIMIT, options.connect()).await {
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {ANSWER_LIMIT:?}")),
    }
}

#[cfg(feature = "containers")]
mod container {
    use super::{Server, Source};
    use sqlx::postgres::PgConnectOptions;
    use testcontainers_modules::postgres::Postgres;
    use testcontainers_modules::testcontainers::ImageExt;
    use testcontainers_modules::testcontainers::runners::AsyncRunner;

    /// The image's tag.
    const TAG: &str = "16-alpine";
    /// The module's default password.
    const PASSWORD: &str = "postgres";

    /// Starts `postgres:16-alpine`, kept until this process exits
    /// (testcontainers' reaper removes it then).
    pub(super) async fn start() -> Result<Server, String> {
        let container = Postgres::default()
            .with_tag(TAG)
            .start()
            .await
            .map_err(|e| e.to_string())?;
        let host = container.get_host().await.map_err(|e| e.to_string())?;
        let port = container
            .get_host_port_ipv4(5432)
            .await
            .map_err(|e| e.to_string())?;
        std::mem::forget(container);
        Ok(Server {
            options: PgConnectOptions::new()
                .host(&host.to_string())
                .port(port)
                .username("postgres")
                .password(PASSWORD)
                .database("postgres"),
            source: Source::Container,
            password: Some(PASSWORD.to_owned()),
            url: None,
        })
    }
}
