//! Connecting: where, as libpq reads it ([`Target`]: one host or several,
//! `target_session_attrs`), so that `pglease` finds the server `psql`
//! finds; the pool settings pglease recommends; a first connection that
//! reports a refused one at once; and, with several hosts, a pool that
//! follows the primary through a failover.

mod follow;
mod parse;
mod passfile;
mod target;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection};

use crate::error::{Error, Result};
use crate::sql;

pub(crate) use follow::Follow;
pub(crate) use follow::PER_HOST_TIMEOUT;
pub use target::{SessionAttrs, Target};
pub use tls::SslMode;

/// How long [`LeaseManager::connect`](crate::LeaseManager::connect) waits
/// for a server that does not answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Pool settings for leases: at most 8 connections, and on each new
/// connection `client_connection_check_interval = 1s` (PostgreSQL 14 and
/// later, where the platform supports it), so that the server abandons a
/// statement whose client has gone.
/// [`LeaseManager::connect`](crate::LeaseManager::connect) uses them; if you
/// build your own pool, start from these (or set the same parameter in
/// your own `after_connect`, or for the role: `ALTER ROLE app SET
/// client_connection_check_interval = '1s'`).
pub fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(8)
        .after_connect(|connection, _| Box::pin(abandon_when_gone(connection)))
}

/// Sets [`sql::ABANDON_WHEN_GONE`] where the server allows it. On platforms
/// without the support the server refuses any value but 0: the connection
/// is then used without it rather than refused.
async fn abandon_when_gone(connection: &mut PgConnection) -> sqlx::Result<()> {
    if let Err(error) = sql::query(sql::ABANDON_WHEN_GONE).execute(connection).await {
        if error.as_database_error().is_none() {
            return Err(error);
        }
        tracing::debug!(%error, "client_connection_check_interval not set");
    }
    Ok(())
}

/// A pool of [`pool_options`] for `target`, after one connection of its
/// own has shown that a server answers (and, with several hosts or
/// attributes, which host will do). sqlx's pool would retry a refused
/// connection until its acquire timeout and then report only that it timed
/// out; this reports the refusal (or any other cause) at once, and a
/// timeout only for a server that does not answer within `timeout`. For a
/// target that is not [plain](Target::is_plain), also what the pool's
/// watch task needs to follow the primary.
pub(crate) async fn connect_pool(
    target: &Target,
    timeout: Duration,
) -> Result<(PgPool, Option<Arc<Follow>>)> {
    if !target.is_plain() {
        let (connection, index, options) = target.connect_first(timeout).await?;
        let _ = connection.close().await;
        let follow = Arc::new(Follow::new(target.clone(), index));
        let (on_connect, on_acquire) = (Arc::clone(&follow), Arc::clone(&follow));
        // pool_options(), with the attribute checked before its own hook.
        let pool = pool_options()
            .acquire_timeout(timeout)
            .after_connect(move |connection, _| {
                let follow = Arc::clone(&on_connect);
                Box::pin(async move {
                    follow.vet(connection).await?;
                    abandon_when_gone(connection).await
                })
            })
            .before_acquire(move |_, meta| {
                let current = on_acquire.is_current(meta.age);
                Box::pin(async move { Ok(current) })
            })
            .connect_lazy_with(options);
        return Ok((pool, Some(follow)));
    }
    let options = match target.open(0, timeout).await {
        Ok((connection, options)) => {
            let _ = connection.close().await;
            options
        }
        // Something answered, but not in PostgreSQL's protocol (another
        // kind of server on that port: its answer reads as a length that
        // never arrives, or as nonsense): said as such, not as sqlx's
        // "expected to read 1414811696 bytes".
        Err(Error::Database(error)) if not_postgres(&error) => {
            return Err(Error::Database(sqlx::Error::Protocol(format!(
                "the server at {} does not answer in PostgreSQL's protocol: is it another \
                 kind of server? Check the host and port",
                target.host(0),
            ))));
        }
        Err(error) => return Err(error),
    };
    let pool = pool_options()
        .acquire_timeout(timeout)
        .connect_lazy_with(options);
    Ok((pool, None))
}

/// Whether a first connection's `error` says that the server answered,
/// but not as PostgreSQL does.
fn not_postgres(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Protocol(_) => true,
        sqlx::Error::Io(io) => io.kind() == std::io::ErrorKind::UnexpectedEof,
        _ => false,
    }
}

/// Connection options from the libpq environment (`PGHOST`, `PGPORT`,
/// `PGUSER`, `PGPASSWORD`, `PGDATABASE`, ...), defaulting like libpq: the
/// local socket or `localhost:5432`, and the operating-system user (looked
/// up by uid, as libpq does, when `PGUSER` is not set).
#[cfg(feature = "provision")]
pub(crate) fn libpq_defaults() -> PgConnectOptions {
    PgConnectOptions::new()
}

/// How long the pooler probe waits for its connection's next statement
/// while another connection holds a transaction open.
const PROBE_WAIT: Duration = Duration::from_secs(1);

/// Whether connections made with `options` share server sessions between
/// transactions, as behind a transaction pooler (PgBouncer with
/// `pool_mode = transaction`), where LISTEN and session-level locks and
/// settings reach whichever client uses that server session next.
///
/// A probe on two connections of its own, up to [`PROBE_TRIALS`] times:
/// the first runs a statement, the second opens a transaction, and the
/// first runs another. On a server, or behind a pooler that keeps sessions,
/// the first keeps its backend and the second has another, every time;
/// behind a transaction pooler the second is given the backend the first
/// just let go of (PgBouncer reuses the most recently used one by
/// default), or the first has to wait for one or gets another. One trial
/// missed PgBouncer about once in 50; a pooler that hands out server
/// sessions round-robin may go undetected.
pub(crate) async fn sessions_shared(options: &PgConnectOptions) -> Result<bool> {
    let mut first = options.connect().await?;
    let mut second = options.connect().await?;
    let mut shared = false;
    for _ in 0..PROBE_TRIALS {
        shared = one_trial(&mut first, &mut second).await?;
        if shared {
            break;
        }
    }
    let _ = second.close().await;
    // After a trial that timed out, `first` has a statement still waiting:
    // dropped, not closed, it is not reused.
    drop(first);
    Ok(shared)
}

/// How many times [`sessions_shared`] tries before it concludes that
/// sessions are kept.
const PROBE_TRIALS: usize = 3;

async fn one_trial(first: &mut PgConnection, second: &mut PgConnection) -> Result<bool> {
    async fn pid(conn: &mut PgConnection, statement: &'static str) -> sqlx::Result<i32> {
        let rows = sqlx::raw_sql(statement).fetch_all(conn).await?;
        match rows.last() {
            Some(row) => sqlx::Row::try_get(row, 0),
            None => Err(sqlx::Error::RowNotFound),
        }
    }
    let before = pid(first, sql::BACKEND_PID).await?;
    let other = pid(second, sql::BEGIN_BACKEND_PID).await?;
    let after = tokio::time::timeout(PROBE_WAIT, pid(first, sql::BACKEND_PID)).await;
    sql::query(sql::ROLLBACK).execute(&mut *second).await?;
    Ok(match after {
        Ok(after) => other == before || after? != before,
        // Waiting for a server session: the first has none of its own.
        Err(_) => true,
    })
}
