//! Fenced transactions: the caller's writes commit only under a valid lease.
//!
//! `pglease.assert_held` checks the token on the database clock and takes a
//! FOR KEY SHARE lock on the lease row that lasts until the transaction
//! ends. No acquisition by another holder can commit in between, so no write
//! made under token `t` can commit after an acquisition with a larger token.

use std::ops::{Deref, DerefMut};

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgTransactionManager};
use sqlx::{AssertSqlSafe, PgConnection, Postgres, SqlSafeStr};
// The trait behind sqlx's own `Transaction`, which sqlx does not re-export:
// it keeps sqlx's count of open transactions on a connection we own.
use sqlx_core::transaction::TransactionManager;

use crate::db;
use crate::error::{Error, NotHeldReason, Result};
use crate::lease::Fence;
use crate::sql;
use crate::token::Token;

/// Declares, inside the caller's own transaction on `conn`, that it writes
/// under `lease` (its name and token): fails with [`Error::NotHeld`] unless
/// the token is current and unexpired, and keeps any other acquisition of
/// the lease from committing until the transaction ends.
///
/// Call it in an open transaction; in autocommit mode the lock ends with the
/// statement and protects nothing. The transaction protects its writes
/// until it ends, as long as the lease stays valid: once the lease has
/// ended (expired without renewal, or released), the next acquisition of
/// `name` ends this transaction's session, which rolls it back (see
/// docs/design.md, "Taking over from a frozen holder").
///
/// # Errors
///
/// [`Error::NotHeld`] if the token is not current and unexpired (the
/// transaction is then aborted), with the reason; [`Error::Database`]
/// otherwise.
///
/// # Cancel safety
///
/// Dropped in flight, the transaction's state is unknown: roll it back.
pub async fn assert_held(conn: &mut PgConnection, lease: impl AsRef<Fence>) -> Result<()> {
    let fence = lease.as_ref();
    sql::query(sql::assert_held(fence)).execute(conn).await?;
    Ok(())
}

/// A transaction that has declared a lease token with
/// `pglease.assert_held` and holds it until commit or rollback.
///
/// Dereferences to [`PgConnection`], so `sqlx` queries run on it directly
/// (and `sqlx::Connection::begin` on it opens a savepoint). Dropped without
/// [`commit`](FencedTransaction::commit), it rolls back, as a sqlx
/// `Transaction` does: the rollback is queued and sent before the
/// connection is used again.
#[derive(Debug)]
pub struct FencedTransaction {
    /// Present until `commit` or `rollback` consumes the transaction
    /// (taken out early only to free the pool's slot, see `commit`).
    conn: Option<PoolConnection<Postgres>>,
    /// The pool it came from, to read the lease when the connection fails.
    pool: PgPool,
    fence: Fence,
    /// Why a re-check failed: the transaction is aborted, and PostgreSQL
    /// would silently turn a COMMIT into a ROLLBACK.
    failed: Option<NotHeldReason>,
}

/// Why the connection is there: only `commit`, which consumes the
/// transaction, takes it out.
const PRESENT: &str = "a fenced transaction's connection is present until it ends";

impl FencedTransaction {
    fn conn_mut(&mut self) -> &mut PgConnection {
        self.conn.as_deref_mut().expect(PRESENT)
    }

    /// The lease this transaction writes under.
    pub fn name(&self) -> &str {
        self.fence.name()
    }

    /// The token it declared.
    pub fn token(&self) -> Token {
        self.fence.token()
    }

    /// Checks the declaration again now, on the database clock: use it in a
    /// long transaction before each step that must still be under a valid
    /// lease. Fails with [`Error::NotHeld`] once the lease has expired.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] with the reason; [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the transaction's state is unknown: roll it back.
    pub async fn recheck(&mut self) -> Result<()> {
        let conn = self.conn.as_deref_mut().expect(PRESENT);
        let outcome = assert_held(conn, &self.fence).await;
        if let Err(Error::NotHeld { reason, .. }) = &outcome {
            self.failed = Some(reason.clone());
        }
        outcome
    }

    /// Commits the caller's writes.
    ///
    /// After a failed [`recheck`](FencedTransaction::recheck) this rolls
    /// back and returns [`Error::NotHeld`] again. (After any other failed
    /// statement PostgreSQL itself answers COMMIT with a rollback.)
    ///
    /// When the connection fails (its session was ended, or the network
    /// dropped it), the lease is read on another connection: if it is no
    /// longer held under this token, this returns [`Error::Lost`] with the
    /// reason. That is what a takeover does to a transaction still fenced
    /// under the old token: it ends the transaction's session, which rolls
    /// it back. Otherwise the connection's error is returned. Either way
    /// the outcome of a commit whose answer was lost is unknown, as for any
    /// commit: it may have landed just before the session ended (a write
    /// checked before the expiry may commit after it).
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] after a failed re-check; [`Error::Lost`] when the
    /// connection failed and the lease is no longer held under this token;
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the commit may or may not happen, as for any
    /// commit whose answer is lost.
    pub async fn commit(mut self) -> Result<()> {
        if let Some(reason) = self.failed.take() {
            let _ = PgTransactionManager::rollback(self.conn_mut()).await;
            return Err(Error::NotHeld {
                name: self.fence.name().to_owned(),
                token: Some(self.fence.token()),
                reason,
            });
        }
        match PgTransactionManager::commit(self.conn_mut()).await {
            Ok(()) => Ok(()),
            Err(error) if crate::sqlstate::session_gone(&error) => {
                // The session is gone: close its connection now, so that
                // the read below does not wait for a pool whose every
                // connection is held by transactions failing the same way.
                if let Some(conn) = self.conn.take() {
                    drop(conn.detach());
                }
                Err(self.after_session_gone(error).await)
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The error for a commit whose connection failed: [`Error::Lost`] if
    /// the lease is no longer held under this token (read within 5 s on
    /// another connection), else `error`.
    async fn after_session_gone(&self, error: sqlx::Error) -> Error {
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            db::fence_status(&self.pool, &self.fence),
        )
        .await;
        match read {
            Ok(Ok(Some(found @ (db::Found::Lost(_) | db::Found::Forgotten(_))))) => {
                found.into_error(&self.fence)
            }
            _ => error.into(),
        }
    }

    /// Rolls back the caller's writes.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] if the connection failed (nothing commits then
    /// either).
    pub async fn rollback(mut self) -> Result<()> {
        PgTransactionManager::rollback(self.conn_mut()).await?;
        Ok(())
    }
}

impl Drop for FencedTransaction {
    fn drop(&mut self) {
        // Still open: queue the ROLLBACK; the pool sends it (with its
        // check of the returned connection) before anyone else uses it.
        if let Some(conn) = &mut self.conn
            && PgTransactionManager::get_transaction_depth(conn) > 0
        {
            PgTransactionManager::start_rollback(conn);
        }
    }
}

impl Deref for FencedTransaction {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn.as_deref().expect(PRESENT)
    }
}

impl DerefMut for FencedTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn_mut()
    }
}

/// Begins a transaction on `pool` and declares `fence` in it, in one round
/// trip: `BEGIN` and `pglease.assert_held` go in one simple query.
///
/// A failed check leaves the server inside an aborted transaction that
/// sqlx does not count as open (sqlx's own `begin_with` would return such
/// a connection to the pool, where every later statement fails with
/// 25P02): it is rolled back here, or the connection closed.
pub(crate) async fn begin(pool: &PgPool, fence: &Fence) -> Result<FencedTransaction> {
    let statement = sql::begin_fenced(fence);
    let mut opening = Opening(Some(pool.acquire().await?));
    let conn = opening.conn();
    match PgTransactionManager::begin(conn, Some(AssertSqlSafe(statement).into_sql_str())).await {
        Ok(()) => Ok(FencedTransaction {
            conn: Some(opening.finish()),
            pool: pool.clone(),
            fence: fence.clone(),
            failed: None,
        }),
        Err(error) => {
            if sql::query(sql::ROLLBACK).execute(&mut *conn).await.is_ok() {
                drop(opening.finish());
            }
            Err(error.into())
        }
    }
}

/// A connection on which a fenced transaction is being opened. Dropped
/// before [`Opening::finish`] (the caller gave up mid-way, or the cleanup
/// after a failed check failed too), the connection is closed rather than
/// returned to the pool in an unknown transaction state.
struct Opening(Option<PoolConnection<Postgres>>);

impl Opening {
    fn conn(&mut self) -> &mut PgConnection {
        self.0.as_mut().expect("taken only by finish")
    }

    fn finish(mut self) -> PoolConnection<Postgres> {
        self.0.take().expect("finished once")
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        if let Some(conn) = &mut self.0 {
            conn.close_on_drop();
        }
    }
}
