//! Fenced transactions: the caller's writes commit only under a valid lease.
//!
//! `pglease.assert_held` checks the token on the database clock and takes a
//! FOR KEY SHARE lock on the lease row that lasts until the transaction
//! ends. No acquisition by another holder can commit in between, so no write
//! made under token `t` can commit after an acquisition with a larger token.

use std::ops::{Deref, DerefMut};

use sqlx::{PgConnection, Postgres, Transaction};

use crate::error::{Error, Result};
use crate::input::{check_positive_token, check_text};
use crate::lease::LeaseManager;
use crate::sql;

/// Declares, inside the caller's own transaction on `conn`, that it writes
/// under lease `name` with `token`: fails with [`Error::NotHeld`] unless the
/// token is current and unexpired, and keeps any other acquisition of
/// `name` from committing until the transaction ends.
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
/// [`Error::InvalidInput`] for a bad name or a token below 1 (nothing is
/// sent); [`Error::NotHeld`] if the token is not current and unexpired
/// (the transaction is then aborted); [`Error::Database`] otherwise.
pub async fn assert_held(conn: &mut PgConnection, name: &str, token: i64) -> Result<()> {
    check_text("name", name)?;
    check_positive_token(token)?;
    sqlx::query(sql::ASSERT_HELD)
        .bind(name)
        .bind(token)
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
    name: String,
    token: i64,
    /// Why a re-check failed: the transaction is aborted, and PostgreSQL
    /// would silently turn a COMMIT into a ROLLBACK.
    failed: Option<String>,
}

impl FencedTransaction {
    /// The lease this transaction writes under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The token it declared.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// Checks the declaration again now, on the database clock: use it in a
    /// long transaction before each step that must still be under a valid
    /// lease. Fails with [`Error::NotHeld`] once the lease has expired.
    pub async fn recheck(&mut self) -> Result<()> {
        let outcome = assert_held(&mut self.tx, &self.name, self.token).await;
        if let Err(Error::NotHeld { message }) = &outcome {
            self.failed = Some(message.clone());
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
    pub async fn commit(self) -> Result<()> {
        if let Some(message) = self.failed {
            let _ = self.tx.rollback().await;
            return Err(Error::NotHeld { message });
        }
        self.tx.commit().await.map_err(Error::from)
    }

    /// Rolls back the caller's writes.
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

impl LeaseManager {
    /// Begins a transaction and declares lease `name` with `token` in it.
    ///
    /// Fails with [`Error::NotHeld`] (and rolls back) unless the token is
    /// current and unexpired on the database clock.
    pub async fn begin_fenced(&self, name: &str, token: i64) -> Result<FencedTransaction> {
        check_text("name", name)?;
        check_positive_token(token)?;
        let mut tx = self.pool().begin().await?;
        assert_held(&mut tx, name, token).await?;
        Ok(FencedTransaction {
            tx,
            name: name.to_owned(),
            token,
            failed: None,
        })
    }

    /// Runs `work` in a fenced transaction for lease `name` under `token`,
    /// committing if it returns `Ok` and rolling back if it returns `Err`.
    pub async fn fenced<T, E, F>(&self, name: &str, token: i64, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
        E: From<Error>,
    {
        let mut tx = self.begin_fenced(name, token).await?;
        match work(&mut tx).await {
            Ok(value) => {
                tx.commit().await?;
                Ok(value)
            }
            Err(e) => {
                // The caller's error is the one worth reporting; a failed
                // rollback leaves nothing committed either way.
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }
}
