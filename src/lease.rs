//! What a lease is, as values: its fence (name and token), an acquisition
//! ([`Lease`]), a row of the status view ([`LeaseStatus`]) and a filter of
//! them ([`ListFilter`]). No I/O here.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::types::PgInterval;

use crate::error::{Error, Result};
use crate::limits::{check_text, check_ttl};
use crate::token::Token;

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
    /// A shared holder's token ([`AcquireOptions::shared`](crate::AcquireOptions::shared)):
    /// checked with `pglease.assert_shared`, never accepted for writes.
    shared: bool,
}

impl Fence {
    /// The fence of lease `name` under `token`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (argument `name`) for an empty name, one
    /// over [`MAX_NAME_BYTES`](crate::limits::MAX_NAME_BYTES), or one with a NUL.
    pub fn new(name: impl Into<String>, token: Token) -> Result<Fence> {
        let name = name.into();
        check_text("name", &name)?;
        Ok(Fence {
            name,
            token,
            shared: false,
        })
    }

    /// The fence of a shared holder of lease `name` under `token` (see
    /// [`AcquireOptions::shared`](crate::AcquireOptions::shared)): fenced
    /// transactions under it check it with `pglease.assert_shared`, which
    /// keeps exclusive acquisitions out but declares no write.
    ///
    /// # Errors
    ///
    /// As [`Fence::new`].
    pub fn shared(name: impl Into<String>, token: Token) -> Result<Fence> {
        Ok(Fence {
            shared: true,
            ..Fence::new(name, token)?
        })
    }

    /// Whether this is a shared holder's token.
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// The fence `pglease run` hands to its command: `PGLEASE_NAME` and
    /// `PGLEASE_TOKEN`, shared when `PGLEASE_SHARED` is `1` (`run --shared`).
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
        let name = var("PGLEASE_NAME")?;
        let fence = if std::env::var("PGLEASE_SHARED").is_ok_and(|v| v == "1") {
            Fence::shared(name, token)
        } else {
            Fence::new(name, token)
        };
        fence.map_err(|e| Error::invalid("PGLEASE_NAME", e.to_string()))
    }

    /// The fences `pglease run` hands to its command, one per lease in
    /// the order its names were given: `PGLEASE_LEASES` (how many), then
    /// `PGLEASE_NAME_k` and `PGLEASE_TOKEN_k` for k = 1..N. With a single
    /// lease this is [`Fence::from_env`]'s fence alone.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the variable that is missing or not
    /// valid.
    pub fn all_from_env() -> Result<Vec<Fence>> {
        Fence::all_from(|key| std::env::var(key).map_err(|e| e.to_string()))
    }

    /// [`Fence::all_from_env`] over the variables `var` reads.
    fn all_from(var: impl Fn(&str) -> std::result::Result<String, String>) -> Result<Vec<Fence>> {
        // `argument` names the variable's family; the reason says which.
        let read = |family: &'static str, key: &str| {
            var(key).map_err(|e| Error::invalid(family, format!("{key} cannot be read: {e}")))
        };
        let count = read("PGLEASE_LEASES", "PGLEASE_LEASES")?
            .parse::<usize>()
            .map_err(|e| Error::invalid("PGLEASE_LEASES", e.to_string()))?;
        (1..=count)
            .map(|k| {
                let (name, token) = (format!("PGLEASE_NAME_{k}"), format!("PGLEASE_TOKEN_{k}"));
                let parsed = read("PGLEASE_TOKEN_k", &token)?
                    .parse::<Token>()
                    .map_err(|e| Error::invalid("PGLEASE_TOKEN_k", format!("{token}: {e}")))?;
                Fence::new(read("PGLEASE_NAME_k", &name)?, parsed)
                    .map_err(|e| Error::invalid("PGLEASE_NAME_k", format!("{name}: {e}")))
            })
            .collect()
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
                shared: false,
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

    /// This lease as a shared holder's, if `shared`.
    pub(crate) fn shared_if(mut self, shared: bool) -> Self {
        self.fence.shared = shared;
        self
    }

    /// Whether it was acquired shared ([`AcquireOptions::shared`](crate::AcquireOptions::shared)).
    pub fn is_shared(&self) -> bool {
        self.fence.shared
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

/// Which leases [`LeaseManager::list`](crate::LeaseManager::list)
/// returns: all by default; narrowed with its builder methods, read with
/// `get_*`. The conditions add up: every one set must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListFilter {
    held: bool,
    expired: bool,
    prefix: Option<String>,
    limit: Option<usize>,
}

impl ListFilter {
    /// Only names held now, by anyone: an exclusive holder, shared
    /// holders, or slots of a counted lease ([`LeaseStatus::kind`] is not
    /// [`LeaseKind::Free`]).
    #[must_use]
    pub fn held(mut self) -> Self {
        self.held = true;
        self
    }

    /// Only leases that expired (ended without a release) and that nobody
    /// holds now.
    #[must_use]
    pub fn expired(mut self) -> Self {
        self.expired = true;
        self
    }

    /// Only names that start with `prefix` (taken as it is: `%` and `_`
    /// are not patterns).
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// At most `limit` leases (the first by name).
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Whether only names held now are kept.
    pub fn get_held(&self) -> bool {
        self.held
    }

    /// Whether only expired leases are kept.
    pub fn get_expired(&self) -> bool {
        self.expired
    }

    /// The prefix names must start with, if any.
    pub fn get_prefix(&self) -> Option<&str> {
        self.prefix.as_deref()
    }

    /// How many leases at the most, if bounded.
    pub fn get_limit(&self) -> Option<usize> {
        self.limit
    }
}

/// Who holds a name now ([`LeaseStatus::kind`], the status view's `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseKind {
    /// Nobody holds it.
    Free,
    /// One exclusive holder: [`LeaseStatus::holder`], `token`,
    /// `expires_at`.
    Exclusive,
    /// Shared holders ([`AcquireOptions::shared`](crate::AcquireOptions::shared)):
    /// [`LeaseStatus::readers`] of them, the last expiring at
    /// [`LeaseStatus::readers_until`].
    Shared,
    /// A counted lease name ([`AcquireOptions::limit`](crate::AcquireOptions::limit))
    /// with [`LeaseStatus::slots_held`] of its slots held; each slot is
    /// the lease `NAME#k`, listed on its own.
    Counted,
}

impl LeaseKind {
    /// The view's word for it.
    fn from_sql(kind: &str) -> Result<Self> {
        Ok(match kind {
            "free" => LeaseKind::Free,
            "exclusive" => LeaseKind::Exclusive,
            "shared" => LeaseKind::Shared,
            "counted" => LeaseKind::Counted,
            other => {
                return Err(crate::Error::Database(sqlx::Error::Decode(
                    format!("pglease.status answered kind {other:?}").into(),
                )));
            }
        })
    }

    /// The view's word for it: `free`, `exclusive`, `shared`, `counted`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseKind::Free => "free",
            LeaseKind::Exclusive => "exclusive",
            LeaseKind::Shared => "shared",
            LeaseKind::Counted => "counted",
        }
    }
}

/// One row of the `pglease.status` view: a name, whoever holds it. The
/// fields from `holder` to `session_ended` describe its exclusive term;
/// [`kind`](Self::kind) says who holds it now.
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
    /// The value the latest acquisition published ([`AcquireOptions::value`](crate::AcquireOptions::value),
    /// [`LeaseManager::set_value`](crate::LeaseManager::set_value)); it
    /// stays after a release or expiry until the next acquisition.
    pub value: Option<String>,
    /// Who asked the current holder to step down
    /// ([`LeaseManager::request_step_down`](crate::LeaseManager::request_step_down));
    /// `None` if nobody did, or once the lease is not held.
    pub step_down_requested_by: Option<String>,
    /// When that request was made (database clock).
    pub step_down_requested_at: Option<DateTime<Utc>>,
    /// How many times the latest acquisition has been renewed.
    pub renewals: u64,
    /// For a session-bound lease ([`AcquireOptions::session_bound`](crate::AcquireOptions::session_bound)):
    /// the process id of the server session it is bound to; `None` for
    /// any other, and once released.
    pub holder_session: Option<i32>,
    /// Whether the lease's session has ended before its expiry: it is not
    /// held, and the next acquirer takes it.
    pub session_ended: bool,
    /// Who holds the name now (database clock).
    pub kind: LeaseKind,
    /// How many valid shared holders it has (each one in the
    /// `pglease.shared` view).
    pub readers: u32,
    /// When the last valid shared holder expires; `None` without one.
    pub readers_until: Option<DateTime<Utc>>,
    /// For a counted lease name: the limit its latest acquisition passed.
    pub slots: Option<u32>,
    /// For a counted lease name: how many of its slots are held.
    pub slots_held: u32,
    /// Whether every waiter waits in line ([`Admin::set_fair`](crate::Admin::set_fair)).
    pub fair: bool,
    /// How many acquirers wait in its line (live places).
    pub waiting: u32,
}

impl LeaseStatus {
    pub(crate) fn never_acquired(name: &str) -> Self {
        LeaseStatus {
            name: name.to_owned(),
            holder: None,
            token: None,
            expires_at: None,
            remaining: None,
            held: false,
            value: None,
            step_down_requested_by: None,
            step_down_requested_at: None,
            renewals: 0,
            holder_session: None,
            session_ended: false,
            kind: LeaseKind::Free,
            readers: 0,
            readers_until: None,
            slots: None,
            slots_held: 0,
            fair: false,
            waiting: 0,
        }
    }

    /// Whether anyone holds the name now: an exclusive holder, shared
    /// holders or slots ([`kind`](Self::kind) is not [`LeaseKind::Free`]).
    pub fn is_held_by_anyone(&self) -> bool {
        self.kind != LeaseKind::Free
    }

    pub(crate) fn from_row(row: &sqlx::postgres::PgRow) -> Result<Self> {
        let remaining_us: Option<i64> = row.try_get("remaining_us")?;
        Ok(LeaseStatus {
            name: row.try_get("name")?,
            holder: row.try_get("holder")?,
            token: row.try_get::<Option<i64>, _>("token")?.map(Token::issued),
            expires_at: row.try_get("expires_at")?,
            remaining: remaining_us.map(|us| Duration::from_micros(us.max(0).unsigned_abs())),
            held: row.try_get("held")?,
            value: row.try_get("value")?,
            step_down_requested_by: row.try_get("step_down_requested_by")?,
            step_down_requested_at: row.try_get("step_down_requested_at")?,
            renewals: row
                .try_get::<i32, _>("renewals")?
                .max(0)
                .unsigned_abs()
                .into(),
            holder_session: row.try_get("holder_session")?,
            session_ended: row.try_get("session_ended")?,
            kind: LeaseKind::from_sql(row.try_get("kind")?)?,
            readers: count(row, "readers")?,
            readers_until: row.try_get("readers_until")?,
            slots: row
                .try_get::<Option<i32>, _>("slots")?
                .map(|n| n.max(0).unsigned_abs()),
            slots_held: count(row, "slots_held")?,
            fair: row.try_get("fair")?,
            waiting: count(row, "waiting")?,
        })
    }
}

/// One valid shared holder of a lease, as
/// [`Admin::shared_holders`](crate::Admin::shared_holders)
/// reads it from the `pglease.shared` view.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedHolder {
    /// Its own token.
    pub token: Token,
    /// Who holds it.
    pub holder: String,
    /// The login role that acquired it (the one that may act under it).
    pub role: String,
    /// When it was acquired (database clock).
    pub acquired_at: DateTime<Utc>,
    /// When it expires unless renewed.
    pub expires_at: DateTime<Utc>,
    /// How many times it has been renewed.
    pub renewals: u64,
}

impl SharedHolder {
    pub(crate) fn from_row(row: &sqlx::postgres::PgRow) -> Result<Self> {
        Ok(SharedHolder {
            token: Token::issued(row.try_get("token")?),
            holder: row.try_get("holder")?,
            role: row.try_get("role")?,
            acquired_at: row.try_get("acquired_at")?,
            expires_at: row.try_get("expires_at")?,
            renewals: u64::from(count(row, "renewals")?),
        })
    }
}

/// A count column of the status view (NULL as 0).
fn count(row: &sqlx::postgres::PgRow, column: &str) -> Result<u32> {
    Ok(row
        .try_get::<Option<i32>, _>(column)?
        .unwrap_or(0)
        .max(0)
        .unsigned_abs())
}

/// A validated TTL as a PostgreSQL interval of exact microseconds.
pub(crate) fn interval(ttl: Duration) -> Result<PgInterval> {
    Ok(micros_interval(check_ttl(ttl)?))
}

/// A PostgreSQL interval of exactly `microseconds`.
pub(crate) fn micros_interval(microseconds: i64) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds,
    }
}

/// The TTL an interval made by [`interval`] stands for.
pub(crate) fn ttl_duration(ttl: PgInterval) -> Duration {
    Duration::from_micros(ttl.microseconds.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::Fence;
    use crate::error::Error;

    /// `Fence::all_from` over these variables.
    fn fences(vars: &[(&str, &str)]) -> crate::error::Result<Vec<Fence>> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Fence::all_from(|key| vars.get(key).cloned().ok_or_else(|| "not set".to_owned()))
    }

    #[test]
    fn every_lease_of_a_run_in_the_order_given() {
        let read = fences(&[
            ("PGLEASE_LEASES", "2"),
            ("PGLEASE_NAME_1", "account:9"),
            ("PGLEASE_TOKEN_1", "12"),
            ("PGLEASE_NAME_2", "account:7"),
            ("PGLEASE_TOKEN_2", "11"),
        ])
        .expect("two fences");
        let pairs: Vec<(&str, i64)> = read.iter().map(|f| (f.name(), f.token().get())).collect();
        assert_eq!(pairs, [("account:9", 12), ("account:7", 11)]);
    }

    #[test]
    fn a_missing_or_bad_variable_is_named() {
        for (vars, argument, says) in [
            (&[][..], "PGLEASE_LEASES", "PGLEASE_LEASES cannot be read"),
            (
                &[("PGLEASE_LEASES", "two")],
                "PGLEASE_LEASES",
                "invalid digit",
            ),
            (
                &[("PGLEASE_LEASES", "1"), ("PGLEASE_TOKEN_1", "3")],
                "PGLEASE_NAME_k",
                "PGLEASE_NAME_1 cannot be read",
            ),
            (
                &[
                    ("PGLEASE_LEASES", "1"),
                    ("PGLEASE_TOKEN_1", "0"),
                    ("PGLEASE_NAME_1", "a"),
                ],
                "PGLEASE_TOKEN_k",
                "PGLEASE_TOKEN_1: ",
            ),
            (
                &[
                    ("PGLEASE_LEASES", "1"),
                    ("PGLEASE_TOKEN_1", "3"),
                    ("PGLEASE_NAME_1", ""),
                ],
                "PGLEASE_NAME_k",
                "PGLEASE_NAME_1: ",
            ),
        ] {
            match fences(vars) {
                Err(Error::InvalidInput {
                    argument: got,
                    reason,
                }) => {
                    assert_eq!(got, argument, "{reason}");
                    assert!(reason.contains(says), "{reason}");
                }
                other => panic!("{vars:?}: {other:?}"),
            }
        }
    }
}
