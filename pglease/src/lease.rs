//! The lease state machine as seen from Rust: acquire, renew, release,
//! inspect. Every transition is one call of a `pglease` SQL function, so the
//! decision is made by the database, on the database clock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgConnectOptions, PgPool};

use std::sync::Arc;

use tokio_util::sync::DropGuard;

use crate::connect::{DEFAULT_CONNECT_TIMEOUT, connect_pool};
use crate::error::{Error, LossReason, Result};
use crate::holding::Shared;
use crate::input::{check_positive_token, check_text, check_ttl};
use crate::options::ManagerOptions;
use crate::sql;
use crate::waiting::Attempt;

/// A lease acquired by this process: the name, the holder, and the token
/// (fence) that identifies this acquisition.
///
/// The token is what proves ownership to the database: renew, release and
/// fenced transactions carry it, and a later acquisition, by anyone, gets a
/// strictly greater one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    name: String,
    holder: String,
    token: i64,
    expires_at: DateTime<Utc>,
    acquired_at: DateTime<Utc>,
}

impl Lease {
    pub(crate) fn new(
        name: &str,
        holder: String,
        token: i64,
        expires_at: DateTime<Utc>,
        acquired_at: DateTime<Utc>,
    ) -> Self {
        Lease {
            name: name.to_owned(),
            holder,
            token,
            expires_at,
            acquired_at,
        }
    }

    /// The lease name (the resource).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Who acquired it.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The fencing token of this acquisition.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// The expiry the database set at acquisition (or at the renewal that
    /// confirmed an acquisition whose answer came late), on the database
    /// clock. Compare it only with database time, never with this
    /// machine's clock.
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.expires_at
    }

    /// This lease with the expiry a confirming renewal set.
    pub(crate) fn confirmed(self, expires_at: DateTime<Utc>) -> Self {
        Lease { expires_at, ..self }
    }

    /// Database time of the acquisition.
    pub fn acquired_at(&self) -> DateTime<Utc> {
        self.acquired_at
    }
}

/// One row of the `pglease.status` view.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStatus {
    /// The lease name.
    pub name: String,
    /// The current or last holder; `None` once released or never acquired.
    pub holder: Option<String>,
    /// The latest token issued; `None` if never acquired.
    pub token: Option<i64>,
    /// When the latest acquisition expires (or ended, once released).
    pub expires_at: Option<DateTime<Utc>>,
    /// Time left on the database clock; `None` unless held.
    pub remaining: Option<Duration>,
    /// Whether the lease is held right now (database clock).
    pub held: bool,
}

impl LeaseStatus {
    fn never_acquired(name: &str) -> Self {
        LeaseStatus {
            name: name.to_owned(),
            holder: None,
            token: None,
            expires_at: None,
            remaining: None,
            held: false,
        }
    }

    fn from_row(row: &sqlx::postgres::PgRow) -> Result<Self> {
        let remaining_us: Option<i64> = row.try_get("remaining_us")?;
        Ok(LeaseStatus {
            name: row.try_get("name")?,
            holder: row.try_get("holder")?,
            token: row.try_get("token")?,
            expires_at: row.try_get("expires_at")?,
            remaining: remaining_us.map(|us| Duration::from_micros(us.max(0).unsigned_abs())),
            held: row.try_get("held")?,
        })
    }
}

/// Entry point: acquires, holds, renews, releases and inspects leases, and
/// opens fenced transactions, through a [`PgPool`].
///
/// Cheap to clone: clones share one renewal task and one release listener,
/// which stop when the last clone (and the last [`HeldLease`](crate::HeldLease))
/// is dropped, or at [`LeaseManager::shutdown`]. Apart from that optional
/// listener it uses no session state that outlives a transaction, so it
/// works through a transaction-pooling proxy (turn
/// [`ManagerOptions::notify`] off there).
#[derive(Clone)]
pub struct LeaseManager {
    pool: PgPool,
    shared: Arc<Shared>,
    _stop_on_drop: Arc<DropGuard>,
}

impl std::fmt::Debug for LeaseManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseManager")
            .field("pool", &self.pool)
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}

impl LeaseManager {
    /// A manager that uses `pool`, with the default [`ManagerOptions`].
    /// Call [`LeaseManager::migrate`] once before first use (it is
    /// idempotent).
    pub fn new(pool: PgPool) -> Self {
        Self::build(pool, ManagerOptions::default())
    }

    /// A manager that uses `pool` with `options`, which are validated.
    pub fn with_options(pool: PgPool, options: ManagerOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self::build(pool, options))
    }

    fn build(pool: PgPool, options: ManagerOptions) -> Self {
        let shared = Arc::new(Shared::new(pool.clone(), options));
        let guard = shared.stop.clone().drop_guard();
        LeaseManager {
            pool,
            shared,
            _stop_on_drop: Arc::new(guard),
        }
    }

    /// Connects a pool of [`pool_options`](crate::pool_options) to `url`
    /// and builds a manager on it, with the default [`ManagerOptions`].
    ///
    /// # Errors
    ///
    /// [`Error::Database`] for a URL that does not parse, or when the server
    /// cannot be reached: at once for a refused connection or a failed
    /// login, after [`DEFAULT_CONNECT_TIMEOUT`](crate::DEFAULT_CONNECT_TIMEOUT)
    /// (10 s) for a server that does not answer.
    pub async fn connect(url: &str) -> Result<Self> {
        let options: PgConnectOptions = url.parse()?;
        Self::connect_with(options, DEFAULT_CONNECT_TIMEOUT).await
    }

    /// Like [`LeaseManager::connect`], with connect options and the time to
    /// wait for a server that does not answer (also the pool's acquire
    /// timeout).
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the server cannot be reached: at once for a
    /// refused connection or a failed login, after `connect_timeout` for a
    /// server that does not answer.
    pub async fn connect_with(
        options: PgConnectOptions,
        connect_timeout: Duration,
    ) -> Result<Self> {
        let pool = connect_pool(options, connect_timeout).await?;
        Ok(LeaseManager::new(pool))
    }

    /// Whether the role that owns the `pglease` functions may end the
    /// sessions of stale fenced transactions (it is a superuser, or has the
    /// privileges of `pg_signal_backend`), which a takeover from a holder
    /// frozen inside a fenced transaction needs. See the README,
    /// "Taking over from a frozen holder".
    ///
    /// # Errors
    ///
    /// [`Error::Database`] if the schema is missing or the database fails.
    pub async fn can_end_stale_transactions(&self) -> Result<bool> {
        let can: Option<bool> = sqlx::query_scalar(sql::CAN_END_STALE)
            .fetch_one(&self.pool)
            .await?;
        Ok(can.unwrap_or(false))
    }

    /// The pool this manager uses.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// This manager's options.
    pub fn options(&self) -> &ManagerOptions {
        &self.shared.options
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Acquires lease `name` for `holder` for `ttl` if it is free or
    /// expired, without waiting for a release.
    ///
    /// Each success carries a new token, greater than every token issued
    /// before for `name`. An attempt on a held, unexpired lease is
    /// read-only in the database. On a lease that has ended but is still
    /// locked by transactions fenced under an earlier token, the database
    /// ends those transactions first; it answers within about 2 s in any
    /// case. An answer that came later than a renewal period is confirmed
    /// with a renewal before it is returned.
    ///
    /// # Errors
    ///
    /// [`Error::Held`] (with the current holder) if someone holds it,
    /// including `holder` itself: leases are not re-entrant.
    /// [`Error::Pinned`] if it has ended but a stale fenced transaction
    /// that could not be ended still holds it. [`Error::Lost`] if it was
    /// acquired so late that the confirming renewal found it expired.
    /// [`Error::InvalidInput`] (nothing sent), [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped while its statement is in the database, a
    /// lease it acquires stays held until it expires. [`LeaseManager::acquire`]
    /// with a zero `max_wait` makes the same single attempt, cancel-safely.
    pub async fn try_acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Lease> {
        check_text("name", name)?;
        check_text("holder", holder)?;
        let ttl = interval(ttl)?;
        match self.attempt(name, holder, ttl).await? {
            Attempt::Acquired { lease, .. } => Ok(lease),
            Attempt::Held {
                holder,
                expires_at,
                checked_at,
                note,
            } => Err(Attempt::refusal(name, holder, expires_at, checked_at, note)),
        }
    }

    /// Extends lease `name` held under `token` to database-now + `ttl`, and
    /// returns the new expiry (database clock).
    ///
    /// Returns [`Error::Lost`] if the token is no longer valid: expired,
    /// released, or taken over. Renewal is keyed on (name, token), so a
    /// retry after a lost response succeeds while the lease is still valid.
    pub async fn renew(&self, name: &str, token: i64, ttl: Duration) -> Result<DateTime<Utc>> {
        check_text("name", name)?;
        check_positive_token(token)?;
        let ttl = interval(ttl)?;
        let expires_at: Option<DateTime<Utc>> = sqlx::query_scalar(sql::RENEW)
            .bind(name)
            .bind(token)
            .bind(ttl)
            .fetch_one(&self.pool)
            .await?;
        match expires_at {
            Some(expires_at) => Ok(expires_at),
            None => Err(self.lost(name, token).await),
        }
    }

    /// Ends lease `name` held under `token` at once.
    ///
    /// Returns `true` if this call ended it, `false` if the token was not
    /// valid (already released, expired, or stale). A delayed duplicate
    /// release carrying an older token never ends a newer acquisition, also
    /// when the holder name is the same.
    pub async fn release(&self, name: &str, token: i64) -> Result<bool> {
        check_text("name", name)?;
        check_positive_token(token)?;
        let released: bool = sqlx::query_scalar(sql::RELEASE)
            .bind(name)
            .bind(token)
            .fetch_one(&self.pool)
            .await?;
        Ok(released)
    }

    /// The status of lease `name`; a name never acquired is reported with
    /// no holder and no token.
    pub async fn inspect(&self, name: &str) -> Result<LeaseStatus> {
        check_text("name", name)?;
        let row = sqlx::query(sql::INSPECT)
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => LeaseStatus::from_row(&row),
            None => Ok(LeaseStatus::never_acquired(name)),
        }
    }

    /// The status of every lease ever acquired, ordered by name.
    pub async fn list(&self) -> Result<Vec<LeaseStatus>> {
        let rows = sqlx::query(sql::LIST).fetch_all(&self.pool).await?;
        rows.iter().map(LeaseStatus::from_row).collect()
    }

    /// Makes `table` (a name as SQL would resolve it, e.g. `public.orders`)
    /// reject every INSERT, UPDATE, DELETE and TRUNCATE from a transaction
    /// that has not declared a current token for lease `name`
    /// ([`Error::NotDeclared`], SQLSTATE `LE002`) or whose declared token
    /// is no longer valid at the write ([`Error::NotHeld`], `LE001`).
    /// Fenced transactions declare their token. Needs the right to create
    /// triggers on the table (its owner); protecting again replaces the
    /// lease name.
    pub async fn protect(&self, table: &str, name: &str) -> Result<()> {
        check_text("name", name)?;
        sqlx::query(sql::PROTECT)
            .bind(table)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Removes the protection [`LeaseManager::protect`] put on `table`;
    /// returns whether it was protected.
    pub async fn unprotect(&self, table: &str) -> Result<bool> {
        let was: bool = sqlx::query_scalar(sql::UNPROTECT)
            .bind(table)
            .fetch_one(&self.pool)
            .await?;
        Ok(was)
    }

    /// Separate-resource fencing: records `token` for `resource` and
    /// returns `true` iff it is at least the highest token seen there.
    ///
    /// This detects a stale token only after a newer one was seen: an
    /// expired lease whose token is still the highest is accepted.
    pub async fn advance(&self, resource: &str, token: i64) -> Result<bool> {
        check_text("resource", resource)?;
        check_positive_token(token)?;
        let accepted: bool = sqlx::query_scalar(sql::ADVANCE)
            .bind(resource)
            .bind(token)
            .fetch_one(&self.pool)
            .await?;
        Ok(accepted)
    }
}

impl LeaseManager {
    /// The error for a lease that `renew` found lost, with the reason read
    /// from the status view (one extra read, on the failure path only).
    pub(crate) async fn lost(&self, name: &str, token: i64) -> Error {
        let reason = match self.inspect(name).await {
            Ok(status) if status.token == Some(token) && status.holder.is_none() => {
                LossReason::Released
            }
            Ok(status) => LossReason::Stale {
                current_token: status.token,
                current_holder: status.holder,
            },
            Err(error) => return error,
        };
        Error::Lost {
            name: name.to_owned(),
            token,
            reason,
        }
    }
}

/// A validated TTL as a PostgreSQL interval of exact microseconds.
pub(crate) fn interval(ttl: Duration) -> Result<PgInterval> {
    Ok(PgInterval {
        months: 0,
        days: 0,
        microseconds: check_ttl(ttl)?,
    })
}

/// The TTL an interval made by [`interval`] stands for.
pub(crate) fn ttl_duration(ttl: PgInterval) -> Duration {
    Duration::from_micros(ttl.microseconds.unsigned_abs())
}
