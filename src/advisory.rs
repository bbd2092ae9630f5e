//! PostgreSQL advisory locks behind an interface comparable to leases, for
//! comparison (see `compare`) and for the cases where they are the right
//! tool. They have no expiry and no fencing token: a session lock lasts as
//! long as its connection, a transaction lock as long as its transaction.
//!
//! Key derivation: a lock name is turned into PostgreSQL's 64-bit advisory
//! key with 64-bit FNV-1a over the name's UTF-8 bytes (offset basis
//! 0xcbf29ce484222325, prime 0x100000001b3), read as a two's-complement
//! `i64`. It is fixed by this definition, so it is the same on every Rust
//! version and platform and can be computed in any language; it is not
//! `DefaultHasher`, whose output may change between Rust releases.
//! Different names can collide (two names then share one lock); that is
//! safe, only less concurrent.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, Postgres, Transaction};

use crate::error::{Error, Result};
use crate::limits::check_text;
use crate::manager::LeaseManager;
use crate::sql;

/// The advisory-lock key for `name` (64-bit FNV-1a of its UTF-8 bytes).
///
/// ```
/// assert_eq!(pglease::advisory::key(""), 0xcbf29ce484222325_u64 as i64);
/// assert_eq!(pglease::advisory::key("a"), 0xaf63dc4c8601ec8c_u64 as i64);
/// ```
pub fn key(name: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash as i64
}

/// A session-level advisory lock: held by one connection, taken out of the
/// pool for as long as the lock is held. It ends when released or when the
/// connection ends, and never by time: a paused holder with a live
/// connection holds it forever, and a holder whose connection died keeps
/// believing it holds a lock that someone else may already have.
pub struct SessionLock {
    conn: Option<PoolConnection<Postgres>>,
    name: String,
    key: i64,
    pid: i32,
}

impl std::fmt::Debug for SessionLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionLock")
            .field("name", &self.name)
            .field("key", &self.key)
            .field("pid", &self.pid)
            .finish()
    }
}

impl SessionLock {
    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The advisory key ([`key`] of the name).
    pub fn key(&self) -> i64 {
        self.key
    }

    /// The server process id of the connection holding the lock.
    pub fn backend_pid(&self) -> i32 {
        self.pid
    }

    /// The connection that holds the lock. Writes on it are no safer than
    /// writes elsewhere: nothing in the database ties them to the lock.
    pub fn connection(&mut self) -> Option<&mut PgConnection> {
        self.conn.as_deref_mut()
    }

    /// Asks the holding connection whether it still holds the lock:
    /// `Ok(false)` when it does not (unlocked once too often, for
    /// instance), an error when the connection is dead (the lock is then
    /// gone, and someone else may hold it).
    pub async fn is_held(&mut self) -> Result<bool> {
        let Some(conn) = self.conn.as_deref_mut() else {
            return Ok(false);
        };
        let held: bool = sqlx::query_scalar(sql::ADVISORY_SESSION_HOLDS)
            .bind(self.key)
            .fetch_one(conn)
            .await?;
        Ok(held)
    }

    /// Unlocks and returns the connection to the pool. Returns `true` if
    /// the lock was held, `false` if it was not (the connection then goes
    /// back to the pool too); an error if the connection is dead.
    pub async fn release(mut self) -> Result<bool> {
        let Some(mut conn) = self.conn.take() else {
            return Ok(false);
        };
        // Session locks count: after relock() one unlock is not enough, so
        // the connection drops every advisory lock it holds (it holds only
        // this one) before it goes back to the pool.
        let unlocked = async {
            let released: bool = sqlx::query_scalar(sql::ADVISORY_UNLOCK)
                .bind(self.key)
                .fetch_one(&mut *conn)
                .await?;
            sqlx::query(sql::ADVISORY_UNLOCK_ALL)
                .execute(&mut *conn)
                .await?;
            Ok::<_, sqlx::Error>(released)
        };
        match unlocked.await {
            Ok(released) => Ok(released),
            Err(e) => {
                conn.close_on_drop();
                Err(e.into())
            }
        }
    }
}

impl Drop for SessionLock {
    fn drop(&mut self) {
        // A pooled connection must not carry a lock back into the pool:
        // close it, which frees the lock.
        if let Some(mut conn) = self.conn.take() {
            conn.close_on_drop();
        }
    }
}

/// A transaction-level advisory lock: taken inside a transaction and held
/// until it commits or rolls back. Writes made in that same transaction
/// are protected by it; writes anywhere else are not.
pub struct XactLock {
    tx: Transaction<'static, Postgres>,
    name: String,
    key: i64,
}

impl std::fmt::Debug for XactLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XactLock")
            .field("name", &self.name)
            .field("key", &self.key)
            .finish()
    }
}

impl XactLock {
    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The advisory key.
    pub fn key(&self) -> i64 {
        self.key
    }

    /// Commits the transaction, which releases the lock.
    pub async fn commit(self) -> Result<()> {
        self.tx.commit().await?;
        Ok(())
    }

    /// Rolls the transaction back, which releases the lock.
    pub async fn rollback(self) -> Result<()> {
        self.tx.rollback().await?;
        Ok(())
    }
}

impl Deref for XactLock {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for XactLock {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

/// A pooled connection on its way to becoming a `SessionLock`: if the
/// future is dropped or fails before then, the connection is closed rather
/// than pooled, since it may hold the lock (or be about to).
struct Unfinished(Option<PoolConnection<Postgres>>);

impl Unfinished {
    fn get(&mut self) -> &mut PgConnection {
        // Only `finish` and `drop` take the connection out.
        self.0
            .as_deref_mut()
            .expect("connection present until finished")
    }

    fn finish(mut self) -> PoolConnection<Postgres> {
        self.0.take().expect("connection present until finished")
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(mut conn) = self.0.take() {
            conn.close_on_drop();
        }
    }
}

impl SessionLock {
    /// Tries to take the session-level advisory lock `name` on a connection
    /// of the pool, which stays out of the pool while the lock is held.
    /// `Ok(None)` if another session holds it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name (nothing sent);
    /// [`Error::Database`] if no connection can be had or the statement
    /// fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped early, the connection is closed rather than
    /// returned to the pool, which ends a lock it may have taken.
    pub async fn try_lock(manager: &LeaseManager, name: &str) -> Result<Option<SessionLock>> {
        check_text("name", name)?;
        let key = key(name);
        let mut conn = Unfinished(Some(manager.pool().acquire().await?));
        let (locked, pid): (bool, i32) = sqlx::query_as(sql::ADVISORY_TRY_LOCK)
            .bind(key)
            .fetch_one(conn.get())
            .await?;
        let conn = conn.finish();
        Ok(locked.then(|| SessionLock {
            conn: Some(conn),
            name: name.to_owned(),
            key,
            pid,
        }))
    }

    /// Takes the session-level advisory lock `name`, waiting up to
    /// `max_wait` (`pg_advisory_lock` under a `lock_timeout`). `Ok(None)`
    /// if it was still held after that.
    ///
    /// # Errors
    ///
    /// As [`SessionLock::try_lock`].
    ///
    /// # Cancel safety
    ///
    /// As [`SessionLock::try_lock`].
    pub async fn lock(
        manager: &LeaseManager,
        name: &str,
        max_wait: Duration,
    ) -> Result<Option<SessionLock>> {
        check_text("name", name)?;
        let key = key(name);
        let mut conn = Unfinished(Some(manager.pool().acquire().await?));
        let timeout_ms = max_wait.as_millis().clamp(1, i32::MAX as u128).to_string();
        // The timeout is set for this transaction only; the session lock
        // taken inside it outlives the commit.
        let mut tx = conn.get().begin().await?;
        sqlx::query(sql::LOCAL_LOCK_TIMEOUT)
            .bind(&timeout_ms)
            .execute(&mut *tx)
            .await?;
        let outcome = sqlx::query_scalar::<_, i32>(sql::ADVISORY_LOCK)
            .bind(key)
            .fetch_one(&mut *tx)
            .await;
        match outcome {
            Ok(pid) => {
                tx.commit().await?;
                Ok(Some(SessionLock {
                    conn: Some(conn.finish()),
                    name: name.to_owned(),
                    key,
                    pid,
                }))
            }
            // lock_not_available: still held after max_wait.
            Err(e) if crate::sqlstate::lock_timed_out(&e) => {
                tx.rollback().await?;
                drop(conn.finish());
                Ok(None)
            }
            Err(e) => Err(Error::from(e)),
        }
    }
}

impl XactLock {
    /// Begins a transaction and tries to take the transaction-level
    /// advisory lock `name` in it. `Ok(None)` (and the transaction rolled
    /// back) if another transaction holds it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name (nothing sent);
    /// [`Error::Database`] if no connection can be had or a statement
    /// fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped early, the transaction is rolled back with its
    /// lock.
    pub async fn try_lock(manager: &LeaseManager, name: &str) -> Result<Option<XactLock>> {
        check_text("name", name)?;
        let key = key(name);
        let mut tx = manager.pool().begin().await?;
        let locked: bool = sqlx::query_scalar(sql::ADVISORY_TRY_XACT_LOCK)
            .bind(key)
            .fetch_one(&mut *tx)
            .await?;
        if !locked {
            tx.rollback().await?;
            return Ok(None);
        }
        Ok(Some(XactLock {
            tx,
            name: name.to_owned(),
            key,
        }))
    }
}
