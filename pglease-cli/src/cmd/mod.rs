//! The commands that talk to the database, one file each, and what they
//! share: an acquisition that announces its wait, the report of one
//! refused, a scalar read that works through a transaction pooler.

pub(crate) mod acquire;
pub(crate) mod demo;
pub(crate) mod doctor;
pub(crate) mod elect;
pub(crate) mod force_release;
pub(crate) mod hand_over;
pub(crate) mod history;
pub(crate) mod leader;
pub(crate) mod migrate;
pub(crate) mod observe;
pub(crate) mod protect;
pub(crate) mod release;
pub(crate) mod renew;
pub(crate) mod run;
pub(crate) mod share;
pub(crate) mod status;
pub(crate) mod step_down;

use std::time::Duration;

use chrono::{DateTime, Utc};
use pglease::{Error, HeldLease, LeaseKind, LeaseManager, RenewalHealth};

use crate::exit::{self, Outcome};
use crate::output::{ago, from_now, human, note};

/// Says on stderr, one line each time, when renewals of `held` start
/// failing (with the time left before the command is stopped) and when
/// they succeed again (a failover, a network drop). Never completes: it
/// sits in a `select!` beside the command, and is cancel-safe.
pub(crate) async fn report_renewals(held: &HeldLease) {
    let mut last = RenewalHealth::Confirmed;
    loop {
        let health = held.renewal_health_changed(&last).await;
        if held.is_lost() {
            return std::future::pending().await;
        }
        match &health {
            RenewalHealth::Failing {
                deadline, error, ..
            } => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                eprintln!(
                    "pglease: renewals of {:?} (token {}) are failing: {error}; the command is \
                     stopped in {:.1} s (local deadline) unless one succeeds first",
                    held.name(),
                    held.token(),
                    left.as_secs_f64()
                );
            }
            _ => {
                eprintln!(
                    "pglease: renewals of {:?} (token {}) succeed again; the lease is held {}",
                    held.name(),
                    held.token(),
                    from_now(held.expires_at())
                );
            }
        }
        last = health;
    }
}

/// The first of `futures` to complete: its index and output. Cancel-safe
/// if each of them is.
pub(crate) async fn first_of<F: Future>(
    futures: impl IntoIterator<Item = F>,
) -> (usize, F::Output) {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        futures
            .iter_mut()
            .enumerate()
            .find_map(|(i, future)| match future.as_mut().poll(cx) {
                std::task::Poll::Ready(output) => Some((i, output)),
                std::task::Poll::Pending => None,
            })
            .map_or(std::task::Poll::Pending, std::task::Poll::Ready)
    })
    .await
}

/// What an acquisition asked for, to word its refusal.
#[derive(Clone, Copy)]
pub(crate) struct Asked<'a> {
    pub(crate) manager: &'a LeaseManager,
    /// The `--limit` of a counted lease.
    pub(crate) limit: Option<u32>,
    /// Exclusive (not `--shared`).
    pub(crate) exclusive: bool,
}

impl Asked<'_> {
    /// Who holds the lease, for a refusal: `"NAME" is held by "HOLDER"
    /// for another 9.9s`; with the `limit` of a counted lease, every slot
    /// is held and NAME is the slot that ends first; an exclusive
    /// acquisition refused by shared holders (the database names the one
    /// that ends last, for at most 2 s, so that waiters look again) says
    /// how many hold it shared and until when, read from `status`.
    async fn held_by(self, name: &str, holder: &str, expires_at: DateTime<Utc>) -> String {
        let left = from_now(expires_at);
        match (self.limit, name.rsplit_once('#')) {
            (Some(limit), Some((counted, _))) => format!(
                "{limit} of {limit} slots of {counted:?} are held; the first to end, {name:?}, \
                 is held by {holder:?} {left}"
            ),
            _ if self.exclusive => match self.manager.inspect(name).await {
                Ok(status) if status.kind == LeaseKind::Shared => format!(
                    "{name:?} is held shared by {} holder(s), the last {}",
                    status.readers,
                    status.readers_until.map_or(left, from_now)
                ),
                _ => format!("{name:?} is held by {holder:?} {left}"),
            },
            _ => format!("{name:?} is held by {holder:?} {left}"),
        }
    }
}

/// `attempt(Duration::ZERO)` first, so that a wait can be announced (for
/// the lease that was held); then, if a lease is held and `wait` allows
/// it, `attempt(wait)`.
pub(crate) async fn announced<T, F, Fut>(
    asked: Asked<'_>,
    wait: Duration,
    attempt: F,
) -> Result<T, Error>
where
    F: Fn(Duration) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    match attempt(Duration::ZERO).await {
        Err(Error::Held {
            name,
            holder: current,
            expires_at,
        }) if !wait.is_zero() => {
            note!(
                "pglease: {}; waiting up to {}",
                asked.held_by(&name, &current, expires_at).await,
                human(wait)
            );
            attempt(wait).await
        }
        Err(e @ (Error::Pinned { .. } | Error::GrantDelayed { .. } | Error::InLine { .. }))
            if !wait.is_zero() =>
        {
            note!("pglease: {e}; waiting up to {}", human(wait));
            attempt(wait).await
        }
        other => other,
    }
}

/// Exit 3 with the reason for an acquisition refused (held, pinned,
/// delayed after a failover, or lost before it could be confirmed); any
/// other error is `what` failing.
pub(crate) async fn not_acquired(asked: Asked<'_>, e: Error, what: &'static str) -> Outcome {
    match e {
        Error::Held {
            name,
            holder,
            expires_at,
        } => note!(
            "pglease: not acquired: {}",
            asked.held_by(&name, &holder, expires_at).await
        ),
        // Times relative, as `status` says them (`--json` has them whole).
        Error::Pinned {
            name,
            holder,
            ended_at,
            reason,
        } => {
            let ended = match holder {
                Some(holder) => format!("{holder:?}'s lease on {name:?} expired {}", ago(ended_at)),
                None => format!("{name:?} is free"),
            };
            eprintln!("pglease: not acquired: {ended}, but it cannot be taken yet: {reason}");
        }
        Error::InLine { .. } | Error::LineFull { .. } => {
            eprintln!("pglease: not acquired: {e}");
        }
        Error::GrantDelayed {
            name,
            until,
            reason,
        } => eprintln!(
            "pglease: not acquired: {name:?}: no lease is granted {}: {reason}; try again after \
             that, or wait for it with --wait",
            from_now(until)
        ),
        Error::Lost { .. } => eprintln!(
            "pglease: not acquired: the answer came later than a third of the TTL, and the \
             lease had expired before a renewal could confirm it ({e}); use a --ttl well above \
             the time a round trip to the database takes"
        ),
        e => return Err((e, what)),
    }
    Ok(exit::conflict())
}
