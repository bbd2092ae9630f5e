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

/// A fencing token: which acquisition of a lease. Every acquisition of a
/// name gets a token greater than all tokens issued before for that name;
/// tokens start at 1 and are never reused.
///
/// Binds to SQL as a `bigint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(i64);

impl Token {
    /// A token read from elsewhere (a database row, `PGLEASE_TOKEN`, a
    /// message). Tokens start at 1.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (argument `token`) for zero or less, which
    /// was never issued and can only be a mistake.
    pub fn new(token: i64) -> Result<Token> {
        check_positive_token(token)?;
        Ok(Token(token))
    }

    /// A token the database issued.
    pub(crate) fn issued(token: i64) -> Token {
        Token(token)
    }

    /// The token as the database stores it.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<Token> for i64 {
    fn from(token: Token) -> i64 {
        token.0
    }
}

impl PartialEq<i64> for Token {
    fn eq(&self, other: &i64) -> bool {
        self.0 == *other
    }
}

impl PartialEq<Token> for i64 {
    fn eq(&self, other: &Token) -> bool {
        *self == other.0
    }
}

impl PartialOrd<i64> for Token {
    fn partial_cmp(&self, other: &i64) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(other)
    }
}

impl std::str::FromStr for Token {
    type Err = Error;

    fn from_str(s: &str) -> Result<Token> {
        let token: i64 = s
            .trim()
            .parse()
            .map_err(|e| Error::invalid("token", format!("{s:?} is not a whole number ({e})")))?;
        Token::new(token)
    }
}

impl sqlx::Type<sqlx::Postgres> for Token {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <i64 as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

impl<'q> sqlx::Encode<'q, sqlx::Postgres> for Token {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> std::result::Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <i64 as sqlx::Encode<'q, sqlx::Postgres>>::encode_by_ref(&self.0, buf)
    }
}

/// A lease name and a token: what the database checks before it lets a
/// holder renew, release or write. Every operation on an acquired lease
/// takes one, through `AsRef<Fence>`: a [`Lease`], a
/// [`HeldLease`](crate::HeldLease), or a `Fence` built from a name and a
/// token that came from elsewhere (another process, `pglease run`'s
/// `PGLEASE_NAME` and `PGLEASE_TOKEN`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    name: String,
    token: Token,
}

impl Fence {
    /// The fence of lease `name` under `token`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (argument `name`) for an empty name, one
    /// over [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES), or one with a NUL.
    pub fn new(name: impl Into<String>, token: Token) -> Result<Fence> {
        let name = name.into();
        check_text("name", &name)?;
        Ok(Fence { name, token })
    }

    /// The fence `pglease run` hands to its command: `PGLEASE_NAME` and
    /// `PGLEASE_TOKEN`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the variable that is missing or not
    /// valid.
    pub fn from_env() -> Result<Fence> {
        let var = |key: &'static str| {
            std::env::var(key).map_err(|e| Error::invalid(key, format!("cannot be read: {e}")))
        };
        let token = var("PGLEASE_TOKEN")?
            .parse::<Token>()
            .map_err(|e| Error::invalid("PGLEASE_TOKEN", e.to_string()))?;
        Fence::new(var("PGLEASE_NAME")?, token)
            .map_err(|e| Error::invalid("PGLEASE_NAME", e.to_string()))
    }

    /// The lease name (the resource).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The token.
    pub fn token(&self) -> Token {
        self.token
    }
}

impl AsRef<Fence> for Fence {
    fn as_ref(&self) -> &Fence {
        self
    }
}

/// A lease acquired by this process: the name, the holder, and the token
/// (fence) that identifies this acquisition.
///
/// The token is what proves ownership to the database: renew, release and
/// fenced transactions carry it, and a later acquisition, by anyone, gets a
/// strictly greater one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    fence: Fence,
    holder: String,
    expires_at: DateTime<Utc>,
    acquired_at: DateTime<Utc>,
}

impl Lease {
    pub(crate) fn new(
        name: &str,
        holder: String,
        token: Token,
        expires_at: DateTime<Utc>,
        acquired_at: DateTime<Utc>,
    ) -> Self {
        Lease {
            fence: Fence {
                name: name.to_owned(),
                token,
            },
            holder,
            expires_at,
            acquired_at,
        }
    }

    /// The lease name (the resource).
    pub fn name(&self) -> &str {
        &self.fence.name
    }

    /// Who acquired it.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The fencing token of this acquisition.
    pub fn token(&self) -> Token {
        self.fence.token
    }

    /// The name and token, as every operation on the lease takes them.
    pub fn fence(&self) -> &Fence {
        &self.fence
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

impl AsRef<Fence> for Lease {
    fn as_ref(&self) -> &Fence {
        &self.fence
    }
}

/// How to acquire a lease: for how long (the TTL, required), for whom
/// (default: this host and process), and how long to wait for the current
/// holder (default: not at all, one attempt).
///
/// ```
/// use std::time::Duration;
/// use pglease::Acquire;
///
/// let how = Acquire::ttl(Duration::from_secs(30))
///     .holder("worker-7")
///     .wait(Duration::from_secs(5));
/// assert_eq!(how.max_wait(), Duration::from_secs(5));
/// ```
///
/// The TTL and the wait are named, so they cannot be swapped by position:
///
/// ```compile_fail
/// # async fn f(leases: pglease::LeaseManager) {
/// use std::time::Duration;
/// // The positional form of earlier versions does not compile:
/// leases.hold("job", "worker-7", Duration::from_secs(5), Duration::from_secs(30)).await;
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquire {
    ttl: Duration,
    holder: Option<String>,
    max_wait: Duration,
}

impl Acquire {
    /// Acquire for `ttl`: the lease expires `ttl` after the database
    /// grants it (or after each renewal), on the database clock. At most
    /// [`MAX_TTL`](crate::MAX_TTL), at least 1 µs.
    pub fn ttl(ttl: Duration) -> Acquire {
        Acquire {
            ttl,
            holder: None,
            max_wait: Duration::ZERO,
        }
    }

    /// Who acquires, as the status view and other holders see it (1 to
    /// [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES) bytes). Default:
    /// [`default_holder`].
    pub fn holder(mut self, holder: impl Into<String>) -> Acquire {
        self.holder = Some(holder.into());
        self
    }

    /// Wait up to `max_wait` for the current holder to release the lease
    /// or let it expire. Default: zero, one attempt.
    pub fn wait(mut self, max_wait: Duration) -> Acquire {
        self.max_wait = max_wait;
        self
    }

    /// The TTL.
    pub fn lease_ttl(&self) -> Duration {
        self.ttl
    }

    /// The holder name that will be used.
    pub fn holder_name(&self) -> std::borrow::Cow<'_, str> {
        match &self.holder {
            Some(holder) => std::borrow::Cow::Borrowed(holder),
            None => std::borrow::Cow::Owned(default_holder()),
        }
    }

    /// The longest wait.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }
}

/// The holder name used when none is given: `HOST:PID`, this machine's
/// host name and this process's id, so that the status view tells where a
/// holder runs.
pub fn default_holder() -> String {
    static HOLDER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOLDER
        .get_or_init(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
                .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
                .or_else(|| std::env::var("COMPUTERNAME").ok().filter(|h| !h.is_empty()))
                .unwrap_or_else(|| "localhost".to_owned());
            let mut holder = format!("{host}:{}", std::process::id());
            // A host name is at most 253 bytes; keep the whole within the
            // limit (on a character boundary).
            while holder.len() > crate::MAX_NAME_BYTES {
                holder.remove(0);
            }
            holder
        })
        .clone()
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
    pub token: Option<Token>,
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
            token: row.try_get::<Option<i64>, _>("token")?.map(Token::issued),
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

    /// Extends the lease to database-now + `ttl`, and returns the new
    /// expiry (database clock). Renewal is keyed on (name, token), so a
    /// retry after a lost answer succeeds while the lease is still valid.
    /// A [`HeldLease`](crate::HeldLease) is renewed in the background; this
    /// is for leases held by hand.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if the token is no longer valid (expired, released,
    /// or taken over; the reason says which); [`Error::InvalidInput`]
    /// for a bad `ttl` (nothing sent); [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the renewal may or may not commit; either way the
    /// lease stays valid until the later of the two expiries.
    pub async fn renew(&self, lease: impl AsRef<Fence>, ttl: Duration) -> Result<DateTime<Utc>> {
        let fence = lease.as_ref();
        let ttl = interval(ttl)?;
        let expires_at: Option<DateTime<Utc>> = sqlx::query_scalar(sql::RENEW)
            .bind(fence.name())
            .bind(fence.token())
            .bind(ttl)
            .fetch_one(&self.pool)
            .await?;
        match expires_at {
            Some(expires_at) => Ok(expires_at),
            None => Err(self.lost(fence).await),
        }
    }

    /// Ends the lease at once, and wakes acquirers waiting for it.
    ///
    /// Returns `true` if this call ended it, `false` if the token was not
    /// valid (already released, expired, or stale). A delayed duplicate
    /// release carrying an older token never ends a newer acquisition, also
    /// when the holder name is the same.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] if the database cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the release may or may not commit; call it again
    /// (it is idempotent) or let the lease expire.
    pub async fn release(&self, lease: impl AsRef<Fence>) -> Result<bool> {
        let fence = lease.as_ref();
        let released: bool = sqlx::query_scalar(sql::RELEASE)
            .bind(fence.name())
            .bind(fence.token())
            .fetch_one(&self.pool)
            .await?;
        Ok(released)
    }

    /// The status of lease `name`; a name never acquired is reported with
    /// no holder and no token.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name (nothing sent);
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
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
    ///
    /// # Errors
    ///
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
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
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name, a table that is not an
    /// ordinary table, or one in a partition or inheritance tree;
    /// [`Error::Database`] (SQLSTATE `42501`) unless the caller owns the
    /// table.
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the protection may or may not be in place (it is
    /// one statement): call it again.
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
    ///
    /// # Errors
    ///
    /// [`Error::Database`] (SQLSTATE `42501`) unless the caller owns the
    /// table, or if the table does not exist.
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the protection may or may not be removed: call it
    /// again.
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
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad `resource`; [`Error::Database`].
    pub async fn advance(&self, resource: &str, token: Token) -> Result<bool> {
        check_text("resource", resource)?;
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
    pub(crate) async fn lost(&self, fence: &Fence) -> Error {
        let reason = match self.inspect(fence.name()).await {
            Ok(status) if status.token == Some(fence.token()) && status.holder.is_none() => {
                LossReason::Released
            }
            Ok(status) => LossReason::Stale {
                current_token: status.token,
                current_holder: status.holder,
            },
            Err(error) => return error,
        };
        Error::Lost {
            name: fence.name().to_owned(),
            token: fence.token(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_holder_names_this_host_and_process() {
        let holder = default_holder();
        assert!(
            holder.ends_with(&format!(":{}", std::process::id())),
            "{holder}"
        );
        assert!(holder.len() <= crate::MAX_NAME_BYTES && holder.len() > 2);
        assert_eq!(Acquire::ttl(Duration::from_secs(1)).holder_name(), holder);
    }

    #[test]
    fn tokens_start_at_one_and_parse_from_text() {
        assert!(Token::new(0).is_err());
        assert_eq!(" 7 ".parse::<Token>().expect("token").get(), 7);
        assert!(matches!(
            "x".parse::<Token>(),
            Err(Error::InvalidInput {
                argument: "token",
                ..
            })
        ));
    }
}
