//! The recorded transitions of leases (`pglease.history`, see
//! migrations/0001_schema.sql, "the history"), and the break-glass release that moves a
//! lease's fence.

use chrono::{DateTime, Utc};
use sqlx::Row;

use crate::db;
use crate::error::Result;
use crate::limits::check_text;
use crate::manager::{Admin, LeaseManager};
use crate::token::Token;

/// What happened to a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A holder got it under a new token.
    Acquired,
    /// Its holder released it.
    Released,
    /// It expired unrenewed (recorded when it was next acquired, at the
    /// time it expired).
    Expired,
    /// Sessions still inside fenced transactions under the ended term's
    /// token were ended by the acquisition that took the lease over (or by
    /// a force release): the holder was evicted, its writes rolled back.
    /// The detail names the process ids (`ended sessions 4711, 4712`).
    Evicted,
    /// An administrator ended it and moved its fence
    /// ([`Admin::force_release`](crate::Admin::force_release)); the detail is the reason.
    ForceReleased,
    /// The holder published a value; the detail is the value (the first
    /// 16 values of a term are recorded).
    ValueChanged,
    /// Somebody asked the holder to step down; the detail is who (the
    /// first request of a term is recorded).
    StepDownRequested,
    /// The database changed timeline (a failover or a restore) and moved
    /// every lease's fence: an event of the whole server, shown in every
    /// lease's history. The token is the floor that tokens continue above;
    /// the detail says from which timeline to which (see
    /// [`TimelineChange`]).
    TimelineChanged,
    /// An event this version does not know (a newer schema).
    Other(String),
}

impl Event {
    fn parse(text: &str) -> Event {
        match text {
            "acquired" => Event::Acquired,
            "released" => Event::Released,
            "expired" => Event::Expired,
            "evicted" => Event::Evicted,
            "force_released" => Event::ForceReleased,
            "value" => Event::ValueChanged,
            "step_down_requested" => Event::StepDownRequested,
            "timeline" => Event::TimelineChanged,
            other => Event::Other(other.to_owned()),
        }
    }

    /// The event as the history view names it.
    pub fn as_str(&self) -> &str {
        match self {
            Event::Acquired => "acquired",
            Event::Released => "released",
            Event::Expired => "expired",
            Event::Evicted => "evicted",
            Event::ForceReleased => "force_released",
            Event::ValueChanged => "value",
            Event::StepDownRequested => "step_down_requested",
            Event::TimelineChanged => "timeline",
            Event::Other(other) => other,
        }
    }
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the `pglease.history` view.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Transition {
    /// Its place in the history (increasing in the order recorded, which
    /// is not always the order of `at`: an expiry is recorded at the next
    /// acquisition, after an eviction that acquisition made).
    pub id: i64,
    /// The lease name.
    pub name: String,
    /// The acquisition it concerns.
    pub token: Token,
    /// What happened.
    pub event: Event,
    /// That acquisition's holder.
    pub holder: Option<String>,
    /// When (database clock).
    pub at: DateTime<Utc>,
    /// On the row that ends a term (released, expired, force released):
    /// how many times it was renewed.
    pub renewals: Option<u64>,
    /// The reason, value or requester, by event (a value: its first 1,000
    /// characters).
    pub detail: Option<String>,
    /// The login role (`session_user`) whose call recorded it: the
    /// acquirer, the releaser, the administrator who forced it, the
    /// requester of a step-down.
    pub role: Option<String>,
}

/// A change of timeline that the database found (a promotion of a
/// standby, a restore that ended on a new timeline) or that an
/// administrator declared (`pglease.restored`), from `pglease.timelines`.
/// Every token drawn after it is above `floor`; acquisitions the server
/// did not know when it changed are refused with
/// [`LossReason::Forgotten`](crate::LossReason::Forgotten).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TimelineChange {
    /// The timeline the server is on from then on.
    pub timeline: i64,
    /// The timeline recorded before.
    pub previous: Option<i64>,
    /// The highest token the server could have drawn before the change (the
    /// fence sequence as it found it): tokens above it and at most `floor`
    /// were drawn, if at all, on the old timeline only.
    pub seen: i64,
    /// Every token drawn after the change is greater than this.
    pub floor: i64,
    /// When the change was found (database clock): at the first
    /// acquisition, forced release or `admit` after it.
    pub at: DateTime<Utc>,
    /// The end of the grant delay after it, if one was set
    /// (`pglease.set_grant_delay`): no lease is granted before.
    pub grant_after: Option<DateTime<Utc>>,
    /// `None` for a change the database found; the administrator's reason
    /// for a rollback declared with `pglease.restored`.
    pub declared: Option<String>,
}

impl LeaseManager {
    /// The recorded transitions of lease `name`, oldest first (by `at`,
    /// then by `id`), from
    /// `since` on (all that are kept without it: 30 days by default, see
    /// docs/design.md, "History"), with the changes of timeline of the
    /// whole server ([`Event::TimelineChanged`]). One statement. `since` is compared with
    /// the times the database recorded: take it from the database clock
    /// (a transition's `at`, a lease's `expires_at`, `SELECT
    /// clock_timestamp()`), not from this machine's.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name
    /// (nothing sent); [`Error::NotPermitted`](crate::Error::NotPermitted)
    /// when the role may not read `pglease.history`;
    /// [`Error::Database`](crate::Error::Database) if the database fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    #[tracing::instrument(name = "pglease.history", level = "debug", skip(self))]
    pub async fn history(
        &self,
        name: &str,
        since: Option<DateTime<Utc>>,
    ) -> Result<Vec<Transition>> {
        check_text("name", name)?;
        let rows = db::history(self.pool(), name, since).await?;
        rows.iter()
            .map(|row| {
                let renewals: Option<i32> = row.try_get("renewals")?;
                let event: String = row.try_get("event")?;
                Ok(Transition {
                    id: row.try_get("id")?,
                    name: row.try_get("name")?,
                    token: Token::issued(row.try_get("token")?),
                    event: Event::parse(&event),
                    holder: row.try_get("holder")?,
                    at: row.try_get("at")?,
                    renewals: renewals.map(|r| r.max(0).unsigned_abs().into()),
                    detail: row.try_get("detail")?,
                    role: row.try_get("role")?,
                })
            })
            .collect()
    }
}

impl Admin<'_> {
    /// The changes of timeline the database has recorded, oldest first
    /// (none for a database that never failed over or was restored). One
    /// statement.
    ///
    /// # Errors
    ///
    /// [`Error::NotPermitted`](crate::Error::NotPermitted) when the role
    /// may not read `pglease.timelines`; [`Error::Database`](crate::Error::Database)
    /// if the database fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn timeline_changes(&self) -> Result<Vec<TimelineChange>> {
        let rows = db::timeline_changes(self.pool()).await?;
        rows.iter()
            .map(|row| {
                let cause: String = row.try_get("cause")?;
                Ok(TimelineChange {
                    timeline: row.try_get("timeline")?,
                    previous: row.try_get("previous")?,
                    seen: row.try_get("seen")?,
                    floor: row.try_get("floor")?,
                    at: row.try_get("at")?,
                    grant_after: row.try_get("grant_after")?,
                    declared: (cause != "timeline").then_some(cause),
                })
            })
            .collect()
    }

    /// Break-glass: ends the lease `name` at once and moves its fence, so
    /// that its holder's token is stale from this instant (its renewal
    /// fails with [`LossReason::Stale`](crate::LossReason::Stale), its
    /// fenced writes are rejected, its release is ignored); the holder's
    /// open fenced transactions are ended (their sessions, as a takeover
    /// does). Recorded in the history with `reason`. For an administrator
    /// role: `pglease.force_release` is not granted to PUBLIC. Returns the
    /// token ended, or `None` if nobody held the lease.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name
    /// or an empty or over-long reason (nothing sent);
    /// [`Error::NotPermitted`](crate::Error::NotPermitted) for a role that
    /// is not an administrator (see docs/design.md, "Roles and grants");
    /// [`Error::Database`](crate::Error::Database) with SQLSTATE 55P03 when
    /// the holder's fenced transactions cannot be ended (the message says
    /// why).
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the lease may or may not have been forced; look
    /// at [`LeaseManager::inspect`] or the history.
    #[tracing::instrument(name = "pglease.force_release", level = "debug", skip(self))]
    pub async fn force_release(&self, name: &str, reason: &str) -> Result<Option<Token>> {
        check_text("name", name)?;
        crate::limits::check_reason(reason)?;
        db::force_release(self.pool(), name, reason).await
    }
}
