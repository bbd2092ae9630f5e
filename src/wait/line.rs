//! First come, first served (`AcquireOptions::fair`): a waiter's place in
//! the line of its names (`pglease.enqueue`), left in the background when
//! the waiter stops waiting without the lease; and the line as an
//! observer reads it (`pglease.line`).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::types::PgInterval;

use super::detach::detached;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::options::AcquireOptions;
use crate::sql;

/// A waiter's own place in line, known by its ticket (a [`LinePlace`] is
/// a place as an observer reads it). Dropped while it still holds the
/// place (the waiter gave up, failed or was cancelled), it leaves the line
/// in the background; an acquisition with its ticket that succeeds ends the
/// place in the database, and [`Ticket::taken`] says so here.
pub(super) struct Ticket {
    ticket: i64,
    context: Arc<Context>,
    held: bool,
}

impl Ticket {
    /// Joins the line of every name of `names` for `holder`, the place
    /// kept for `ttl` between attempts.
    ///
    /// # Errors
    ///
    /// [`Error::LineFull`] when `max_waiting` (or the schema's limit)
    /// wait already; database errors (42501 for a name granted to other
    /// roles).
    pub(super) async fn join(
        context: &Arc<Context>,
        names: &[String],
        holder: &str,
        ttl: &PgInterval,
        max_waiting: Option<u32>,
    ) -> Result<(Ticket, u32)> {
        let row = sql::query(sql::enqueue(names, holder, ttl, max_waiting))
            .fetch_one(&context.pool)
            .await?;
        let ticket: Option<i64> = row.try_get("ticket")?;
        let waiting: i32 = row.try_get("waiting")?;
        let Some(ticket) = ticket else {
            return Err(Error::LineFull {
                name: names.join(", "),
                waiting: u32::try_from(waiting).unwrap_or(0),
            });
        };
        let position: i32 = row.try_get("position")?;
        tracing::debug!(ticket, position, waiting, "joined the line");
        let place = Ticket {
            ticket,
            context: Arc::clone(context),
            held: true,
        };
        Ok((place, u32::try_from(position).unwrap_or(0)))
    }

    /// The ticket's number, for the attempts.
    pub(super) fn number(&self) -> i64 {
        self.ticket
    }

    /// The acquisition with this ticket succeeded, or the database ended
    /// the place: nothing to leave.
    pub(super) fn taken(mut self) {
        self.held = false;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = self.context.pool.clone();
        let limit = self.context.options.get_renew_timeout();
        let ticket = self.ticket;
        self.context.background.spawn_on(
            async move {
                let leave = sql::query(sql::dequeue(ticket)).execute(&pool);
                if let Ok(Err(error)) = tokio::time::timeout(limit, leave).await {
                    // The place ends anyway once its TTL passes.
                    tracing::debug!(ticket, %error, "leaving the line failed");
                }
            },
            &runtime,
        );
    }
}

/// The longest nap for a waiter with a place in line: a third of the TTL,
/// so that its attempts keep the place.
pub(super) fn keep_place(nap: Duration, ttl: Duration) -> Duration {
    nap.min(ttl / 3)
}

/// One place in a lease's line, as [`crate::LeaseManager::line`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinePlace {
    /// The waiter's ticket (a set has one ticket in each of its lines).
    pub ticket: i64,
    /// Who waits.
    pub holder: String,
    /// 1 for the next to be served.
    pub position: u32,
    /// When it joined (database clock).
    pub joined_at: DateTime<Utc>,
    /// When the place ends unless its waiter tries again.
    pub expires_at: DateTime<Utc>,
}

/// Who waits in line for `name`, from the front (ended places left out).
pub(crate) async fn places(context: &Context, name: &str) -> Result<Vec<LinePlace>> {
    let rows = sql::query(sql::places_in_line(name))
        .fetch_all(&context.pool)
        .await?;
    rows.iter()
        .map(|row| {
            let position: i32 = row.try_get("position")?;
            Ok(LinePlace {
                ticket: row.try_get("ticket")?,
                holder: row.try_get("holder")?,
                position: u32::try_from(position).unwrap_or(0),
                joined_at: row.try_get("joined_at")?,
                expires_at: row.try_get("expires_at")?,
            })
        })
        .collect()
}

/// A fair acquisition's standing in line across its attempts: its ticket
/// (none for an acquisition that is not fair, or before its first
/// refusal), and how many places ended under it in a row.
#[derive(Default)]
pub(super) struct Standing {
    pub(super) place: Option<Ticket>,
    /// Places that ended under the waiter in a row (see `ended`).
    pub(super) ended: u32,
}

impl Standing {
    /// Whether `outcome` says the place has ended (SQLSTATE LE003): the
    /// waiter then joins again after its next attempt. Three in a row
    /// are reported as the error.
    pub(super) fn ended<T>(&mut self, outcome: &Result<T>) -> Result<bool> {
        let Err(error) = outcome else {
            self.ended = 0;
            return Ok(false);
        };
        if error.sqlstate() != Some(crate::sqlstate::NOT_IN_LINE) || self.ended >= 2 {
            return Ok(false);
        }
        self.ended += 1;
        if let Some(place) = self.place.take() {
            place.taken();
        }
        Ok(true)
    }

    /// Joins the line of `names` if the acquisition is fair and has no
    /// place yet; whether it joined now.
    pub(super) async fn join(
        &mut self,
        context: &Arc<Context>,
        names: &[String],
        how: &AcquireOptions,
        name_fair: bool,
        ttl: &PgInterval,
    ) -> Result<bool> {
        if !(how.get_fair() || name_fair) || self.place.is_some() {
            return Ok(false);
        }
        // On a task of its own, as attempts are: a waiter cancelled while
        // its join is in flight leaves the place in the background.
        let (joining, holder, ttl, max) = (
            names.to_vec(),
            how.get_holder().into_owned(),
            *ttl,
            how.get_max_waiting(),
        );
        let (place, position) = detached(context, move |context| async move {
            Ticket::join(&context, &joining, &holder, &ttl, max).await
        })
        .await?;
        tracing::debug!(?names, position, "waiting in line");
        self.place = Some(place);
        Ok(true)
    }

    /// The acquisition succeeded: its place ended with it.
    pub(super) fn taken(&mut self) {
        if let Some(place) = self.place.take() {
            place.taken();
        }
    }

    /// `nap`, shortened so that the place is kept.
    pub(super) fn nap(&self, nap: Duration, how: &AcquireOptions) -> Duration {
        match self.place {
            Some(_) => keep_place(nap, how.get_ttl()),
            None => nap,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::keep_place;
    use std::time::Duration;

    #[test]
    fn a_place_is_kept_by_an_attempt_every_third_of_the_ttl() {
        let ttl = Duration::from_secs(9);
        assert_eq!(
            keep_place(Duration::from_secs(60), ttl),
            Duration::from_secs(3)
        );
        assert_eq!(
            keep_place(Duration::from_millis(20), ttl),
            Duration::from_millis(20)
        );
    }
}
