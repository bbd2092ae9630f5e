//! Where the command line connects (`--database-url`, else
//! `DATABASE_URL`, else the libpq environment; one host or several) and its
//! first connection, whose failure names the servers, the cause and what
//! to do.

use std::time::Duration;

use pglease::connect::Target;
use pglease::{Error, LeaseManager};

/// Where to connect for `url` (`--database-url` or `DATABASE_URL`: a URL or
/// a libpq `keyword=value` string), or the libpq environment (`PGHOST`,
/// `PGPORT`, ... which may list several hosts) without one; a message for
/// one that cannot be used, checked before anything connects.
pub(crate) fn target(url: Option<&str>) -> Result<Target, String> {
    match url {
        Some(url) => Target::parse(url).map_err(|e| {
            format!(
                "invalid database URL (--database-url or DATABASE_URL): {}",
                unusable(e)
            )
        }),
        None => Target::from_env().map_err(|e| {
            format!(
                "invalid connection settings (PGHOST, PGPORT, PGTARGETSESSIONATTRS): {}",
                unusable(e)
            )
        }),
    }
}

/// Why a connection string cannot be used: the reason alone for bad
/// input, the whole error otherwise.
pub(crate) fn unusable(e: Error) -> String {
    match e {
        Error::InvalidInput { reason, .. } => reason,
        e => e.to_string(),
    }
}

/// Connects through the library: a refused connection or a failed login is
/// reported at once with its cause; `timeout` applies only to a server
/// that does not answer (to each host, with several). The pool's
/// connections abandon a statement still waiting in the server once this
/// process is gone (see `pglease::connect::pool_options`), so an
/// interrupted acquisition acquires nothing. Fails with the message's first
/// line (servers and cause), also for JSON.
pub(crate) async fn connect(target: &Target, timeout: Duration) -> Result<LeaseManager, String> {
    LeaseManager::connect_with(target.clone(), timeout)
        .await
        .map_err(|e| {
            // The server answered and refused (a role, a password or a
            // database that does not exist), or it could not be reached.
            let answered = e.sqlstate().is_some();
            let next = if matches!(e, Error::Database(sqlx::Error::Tls(_))) {
                "Check sslrootcert (the CA that signed the server's certificate, or \
                 sslrootcert=system for a public CA) and that the host name in the URL is one \
                 the certificate names; sslmode=require encrypts without verifying."
            } else if e.sqlstate() == Some(pglease::sqlstate::INVALID_AUTHORIZATION)
                && target.sslmode() == Some(pglease::connect::SslMode::Disable)
            {
                "The server refused a connection without TLS: it requires TLS. Use \
                 sslmode=verify-full with sslrootcert=CA-FILE (or sslmode=require)."
            } else if answered {
                "Check the user, password and database name in --database-url or DATABASE_URL \
                 (or PGUSER, PGPASSWORD, PGDATABASE)."
            } else if target.len() > 1 {
                "Check that one of the hosts in --database-url or DATABASE_URL (or PGHOST) is \
                 up and is the primary; during a failover, try again once it has finished."
            } else {
                "Set --database-url or DATABASE_URL (or PGHOST, PGPORT, PGUSER, PGDATABASE) \
                 to a reachable PostgreSQL server."
            };
            let mut why = format!("cannot connect to PostgreSQL at {}: {e}", target.describe());
            // A password file that was there but not read: why the login
            // had no password.
            if let Some(problem) = target.passfile_problem(0).filter(|_| answered) {
                why.push_str(&format!(" ({problem})"));
            }
            eprintln!("pglease: {why}\n{next}");
            why
        })
}
