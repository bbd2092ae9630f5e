//! The manager's one renewal task: it plans with the registry, sends one
//! statement for every lease that is due, applies the answer, and sleeps
//! until the next thing to do. The deadline timer does not wait for a
//! renewal in flight.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::PgRow;
use tokio::time::Instant;

use super::registry::{Batch, Key, Registry, Renewed};
use crate::context::Context;
use crate::error::Error;
use crate::sql;

struct Outcome {
    keys: Vec<Key>,
    sent: Instant,
    rows: Result<Vec<Renewed>, Arc<Error>>,
}

type InFlight = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// Starts the renewal task, or starts it again if the runtime it ran on
/// has ended, and, if `wake`, wakes it to look at a new lease.
pub(crate) fn ensure_running(context: &Arc<Context>, registry: &Arc<Registry>, wake: bool) {
    let mut task = crate::sync::lock(&registry.task);
    if task.as_ref().is_none_or(|task| task.is_finished()) {
        *task = Some(tokio::spawn(run(Arc::clone(context), Arc::clone(registry))));
    }
    drop(task);
    if wake {
        registry.wake.notify_one();
    }
}

/// A renewal unanswered for this long (or half the time left before the
/// first lease it holds up is given up, if less) makes its leases count as
/// failing: a failover or a dead server shows within a second, not only
/// when the statement times out.
pub(crate) const LATE: Duration = Duration::from_secs(1);

async fn run(context: Arc<Context>, registry: Arc<Registry>) {
    let mut in_flight: Option<InFlight> = None;
    // When the statement in flight was sent and when it counts as late
    // (`None`: not in flight, or already said).
    let mut late: Option<(Instant, Instant)> = None;
    loop {
        let now = Instant::now();
        let idle = now + Duration::from_secs(3600);
        // Paused by a test: nothing is sent; deadlines still pass.
        #[cfg(feature = "testing")]
        if context.faults.is_paused() {
            let wake = registry.fire_due(now);
            tokio::select! {
                () = context.stop.cancelled() => return,
                () = context.faults.resumed() => {}
                () = registry.wake.notified() => {}
                () = tokio::time::sleep_until(wake.unwrap_or(idle)) => {}
                outcome = poll(&mut in_flight) => {
                    in_flight = None;
                    finish(&context, &registry, outcome);
                }
            }
            continue;
        }
        let plan = registry.schedule(now, in_flight.is_none());
        for state in &plan.given_up {
            context.release_in_background(state.lease.fence());
        }
        if let Some(batch) = plan.batch {
            let left = batch.first_fire_at.saturating_duration_since(now);
            late = Some((now, now + LATE.min(left / 2)));
            in_flight = Some(Box::pin(send(Arc::clone(&context), batch)));
        }
        tokio::select! {
            () = context.stop.cancelled() => return,
            () = registry.wake.notified() => {}
            () = tokio::time::sleep_until(plan.wake.unwrap_or(idle)) => {}
            () = tokio::time::sleep_until(late.map_or(idle, |l| l.1)), if late.is_some() => {
                let sent = late.take().map_or(now, |l| l.0);
                let error = Arc::new(Error::Timeout {
                    operation: "renewal",
                    after: Some(Instant::now().saturating_duration_since(sent)),
                });
                let started = registry.late(&error, Instant::now());
                crate::telemetry::renewal_outages(started, &[]);
                context.report_trouble();
            }
            outcome = poll(&mut in_flight) => {
                in_flight = None;
                late = None;
                finish(&context, &registry, outcome);
            }
        }
    }
}

/// Applies a statement's outcome and counts it.
fn finish(context: &Context, registry: &Registry, outcome: Outcome) {
    let applied = registry.apply(&outcome.keys, outcome.sent, outcome.rows, Instant::now());
    let counters = &context.counters;
    counters
        .leases_renewed
        .fetch_add(applied.renewed, Ordering::Relaxed);
    if applied.failed {
        counters.renewal_failures.fetch_add(1, Ordering::Relaxed);
        context.report_trouble();
    }
    crate::telemetry::renewed(applied.renewed, applied.failed);
    crate::telemetry::renewal_outages(applied.started_failing, &applied.recovered);
}

async fn poll(in_flight: &mut Option<InFlight>) -> Outcome {
    match in_flight {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

/// Sends one renewal statement with a timeout. On timeout the connection is
/// closed rather than returned to the pool with a statement still running.
#[tracing::instrument(name = "pglease.renew_many", level = "debug", skip_all,
                      fields(leases = batch.keys.len()))]
async fn send(context: Arc<Context>, batch: Batch) -> Outcome {
    let sent = Instant::now();
    let limit = context
        .options
        .get_renew_timeout()
        .min(batch.first_fire_at.saturating_duration_since(sent))
        .max(Duration::from_millis(1));
    let names: Vec<&str> = batch.keys.iter().map(|k| k.0.as_str()).collect();
    let tokens: Vec<i64> = batch.keys.iter().map(|k| k.1).collect();
    context
        .counters
        .renewal_statements
        .fetch_add(1, Ordering::Relaxed);
    crate::telemetry::renewal_statement();
    let mut slot = None;
    let answer = tokio::time::timeout(limit, async {
        // Made to fail by a test, as a server that refuses connections.
        #[cfg(feature = "testing")]
        if context.faults.is_failing() {
            return Err(crate::context::refused());
        }
        let conn = slot.insert(context.pool.acquire().await?);
        sql::query(sql::renew_many(&names, &tokens, &batch.ttls))
            .fetch_all(&mut **conn)
            .await
    })
    .await;
    let rows = match answer {
        Ok(Ok(rows)) => Ok(rows.iter().filter_map(parse).collect()),
        Ok(Err(error)) => Err(Arc::new(Error::from(error))),
        Err(_) => {
            if let Some(mut conn) = slot.take() {
                conn.close_on_drop();
            }
            Err(Arc::new(Error::Timeout {
                operation: "renewal",
                after: Some(limit),
            }))
        }
    };
    Outcome {
        keys: batch.keys,
        sent,
        rows,
    }
}

/// A row of `pglease.renew_many`; one that does not parse is skipped (its
/// lease is sent again).
fn parse(row: &PgRow) -> Option<Renewed> {
    let renewed: bool = row.try_get("renewed").ok()?;
    Some(Renewed {
        name: row.try_get("name").ok()?,
        token: row.try_get("token").ok()?,
        expires_at: if renewed {
            row.try_get("expires_at").ok()?
        } else {
            None
        },
        current_token: row.try_get("current_token").ok()?,
        current_holder: row.try_get("current_holder").ok()?,
        session_ended: row.try_get("session_ended").ok()?,
        forgotten_in: row.try_get("forgotten_in").ok()?,
    })
}
