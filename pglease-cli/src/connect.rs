//! Where the command line connects (`--database-url`, else
//! `DATABASE_URL`, else the libpq defaults) and its first connection, whose
//! failure names the server, the cause and what to do.

use std::time::Duration;

use pglease::{Error, LeaseManager};
use sqlx::postgres::PgConnectOptions;

/// The connect options for `url` (`--database-url` or `DATABASE_URL`), or
/// the libpq defaults without one; a message for a URL that cannot be
/// used, checked before anything connects.
pub(crate) fn options(url: Option<&str>) -> Result<PgConnectOptions, String> {
    match url {
        Some(url) => pglease::connect::parse_url(url).map_err(|e| {
            let why = match e {
                Error::InvalidInput { reason, .. } => reason,
                e => e.to_string(),
            };
            format!("invalid database URL (--database-url or DATABASE_URL): {why}")
        }),
        None if std::env::var("PGHOST").is_ok_and(|hosts| hosts.contains(',')) => Err(
            "PGHOST names several hosts; pglease connects to one: put the primary behind a \
             stable endpoint that follows failovers (see docs/design.md)"
                .to_owned(),
        ),
        None => Ok(pglease::connect::libpq_defaults()),
    }
}

/// Connects through the library: a refused connection or a failed login is
/// reported at once with its cause; `timeout` applies only to a server
/// that does not answer. The pool's connections abandon a statement still
/// waiting in the server once this process is gone (see
/// `pglease::connect::pool_options`), so an interrupted acquisition
/// acquires nothing. Fails with the message's first line (server and
/// cause), also for JSON.
pub(crate) async fn connect(
    options: &PgConnectOptions,
    timeout: Duration,
) -> Result<LeaseManager, String> {
    LeaseManager::connect_with(options.clone(), timeout)
        .await
        .map_err(|e| {
            // The server answered and refused (a role, a password or a
            // database that does not exist), or it could not be reached.
            let answered = matches!(&e, Error::Database(db) if db.as_database_error().is_some());
            let next = if answered {
                "Check the user, password and database name in --database-url or DATABASE_URL \
                 (or PGUSER, PGPASSWORD, PGDATABASE)."
            } else {
                "Set --database-url or DATABASE_URL (or PGHOST, PGPORT, PGUSER, PGDATABASE) \
                 to a reachable PostgreSQL server."
            };
            let why = format!(
                "cannot connect to PostgreSQL at {}:{}: {e}",
                options.get_host(),
                options.get_port()
            );
            eprintln!("pglease: {why}\n{next}");
            why
        })
}
