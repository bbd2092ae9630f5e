//! Fenced transactions: the caller's writes commit only under a valid lease.
//!
//! `pglease.assert_held` checks the token on the database clock and takes a
//! FOR KEY SHARE lock on the lease row that lasts until the transaction
//! ends. No acquisition by another holder can commit in between, so no write
//! made under token `t` can commit after an acquisition with a larger token.

use std::ops::{Deref, DerefMut};

use sqlx::postgres::PgPool;
use sqlx::{PgConnection, Postgres, Transaction};

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
/// `name` ends this transaction's session, which rolls it back (see the
/// README, "Taking over from a frozen holder").
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
    sqlx::query(sql::ASSERT_HELD)
        .bind(fence.name())
        .bind(fence.token())
        .execute(conn)
        .await?;
    Ok(())
}

/// A transaction that has declared a lease token with
/// `pglease.assert_held` and holds it until commit or rollback.
///
/// Dereferences to [`PgConnection`], so `sqlx` queries run on it directly.
/// Dropped without [`commit`](FencedTransaction::commit), it rolls back.
#[derive(Debug)]
pub struct FencedTransaction {
    tx: Transaction<'static, Postgres>,
    fence: Fence,
    /// Why a re-check failed: the transaction is aborted, and PostgreSQL
    /// would silently turn a COMMIT into a ROLLBACK.
    failed: Option<NotHeldReason>,
}

impl FencedTransaction {
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
        let outcome = assert_held(&mut self.tx, &self.fence).await;
        if let Err(Error::NotHeld { reason, .. }) = &outcome {
            self.failed = Some(reason.clone());
        }
        outcome
    }

    /// Commits the caller's writes.
    ///
    /// After a failed [`recheck`](FencedTransaction::recheck) this rolls
    /// back and returns [`Error::NotHeld`] again. (After any other failed
    /// statement PostgreSQL itself answers COMMIT with a rollback.) An
    /// error from the commit itself, such as a dropped connection, leaves
    /// the outcome unknown, as for any commit.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] after a failed re-check; [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the commit may or may not happen, as for any
    /// commit whose answer is lost.
    pub async fn commit(self) -> Result<()> {
        if let Some(reason) = self.failed {
            let _ = self.tx.rollback().await;
            return Err(Error::NotHeld {
                name: self.fence.name().to_owned(),
                token: Some(self.fence.token()),
                reason,
            });
        }
        self.tx.commit().await.map_err(Error::from)
    }

    /// Rolls back the caller's writes.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] if the connection failed (nothing commits then
    /// either).
    pub async fn rollback(self) -> Result<()> {
        self.tx.rollback().await.map_err(Error::from)
    }

    /// The underlying `sqlx` transaction.
    pub fn transaction(&mut self) -> &mut Transaction<'static, Postgres> {
        &mut self.tx
    }
}

impl Deref for FencedTransaction {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for FencedTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

/// Begins a transaction on `pool` and declares `fence` in it.
pub(crate) async fn begin(pool: &PgPool, fence: &Fence) -> Result<FencedTransaction> {
    let mut tx = pool.begin().await?;
    assert_held(&mut tx, fence).await?;
    Ok(FencedTransaction {
        tx,
        fence: fence.clone(),
        failed: None,
    })
}
