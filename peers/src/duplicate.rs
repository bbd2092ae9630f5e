//! Scenario (d): a release that arrives late, after the same holder has
//! acquired the lease again. Does the late release end the new term, so
//! that another worker takes the lease while the holder's new term runs?

use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_lease::{LeaseContext, LeaseLooper};
use pglease::AcquireOptions;
use pglease::testing::TestDatabase;
use tokio::sync::{Mutex, oneshot};

use crate::looper::{Signal, holds, holds_watched, signal, slot};
use crate::paused::{proxied_pool, target};
use crate::proxy::Proxy;
use crate::{BoxError, Peer, Verdict, pool, scratch};

/// The leases' TTL in this scenario.
const TTL: Duration = Duration::from_secs(1);
/// How long the second worker tries after the late release.
const WINDOW: Duration = Duration::from_secs(2);

/// pg_lease's settings in this scenario.
fn looper_options() -> pg_lease::LeaseLooperOptions {
    crate::looper::options(TTL)
}

/// What a peer's part of the scenario found: when B held the lease and
/// when A's new term was stopped, both after the late release (`None`: not
/// within the window), and what happened.
type Outcome = (Option<Duration>, Option<Duration>, String);

/// Scenario (d) for `peer`, in a database of its own.
///
/// # Errors
///
/// A peer or the database failing in a way the scenario does not expect.
pub async fn late_release(peer: Peer) -> Result<Verdict, BoxError> {
    let db = scratch().await?;
    let (took_over, stopped, detail) = match peer {
        Peer::Pglease => late_pglease(&db).await?,
        Peer::PgLease => late_pg_lease(&db).await?,
        Peer::DistributedLock | Peer::SqlxAdvisoryLock => (
            None,
            None,
            "not applicable: release consumes the handle (guard) and waits for the unlock's \
             answer, so the API cannot send a release late or twice"
                .to_owned(),
        ),
    };
    // Two holders: B held it before A's new term was stopped.
    let violated = match (took_over, stopped) {
        (Some(b), Some(a)) => b < a,
        (Some(_), None) => true,
        (None, _) => false,
    };
    Ok(Verdict {
        peer,
        violated,
        took_over,
        detail,
    })
}

/// Scenario (d) for pglease: A releases its first term again during its
/// second, B then tries to acquire. Nothing stops A's second term: it is
/// released after B's attempt.
async fn late_pglease(db: &TestDatabase) -> Result<Outcome, BoxError> {
    let a = db.manager();
    let first = a
        .acquire("res", AcquireOptions::ttl(TTL * 30).holder("A"))
        .await?;
    assert!(a.release(&first).await?);
    let again = a
        .acquire("res", AcquireOptions::ttl(TTL * 30).holder("A"))
        .await?;
    // The first release again, as a late duplicate.
    let ended = a.release(&first).await?;
    let b = db.manager();
    let started = Instant::now();
    let took_over = b
        .acquire("res", AcquireOptions::ttl(TTL).holder("B").wait(WINDOW))
        .await
        .ok()
        .map(|_| started.elapsed());
    a.release(&again).await?;
    let detail = format!(
        "the late release names token {}, the new term has {}: it returned {ended} and changed \
         nothing; B {}",
        first.token(),
        again.token(),
        took_over.map_or_else(
            || format!("could not take over within {} s", WINDOW.as_secs()),
            |t| format!("took over after {} ms", t.as_millis())
        )
    );
    Ok((took_over, None, detail))
}

/// The state of A's first term's looper function: its start, and the
/// order to finish.
type Finish = (Signal, Arc<Mutex<Option<oneshot::Receiver<()>>>>);

/// A's first term for pg_lease: signals once it holds the lease, then
/// returns when told (and pg_lease deletes the lease row).
async fn finishes_when_told(_ctx: LeaseContext, (started, finish): Finish) -> Result<(), BoxError> {
    signal(&started);
    if let Some(rx) = finish.lock().await.take() {
        let _ = rx.await;
    }
    Ok(())
}

/// Scenario (d) for pg_lease: the DELETE ending A's first term is held up
/// in the network until A's second term (same worker id) has begun and B
/// is trying to take over.
async fn late_pg_lease(db: &TestDatabase) -> Result<Outcome, BoxError> {
    let proxy = Proxy::start(target(db).await?).await?;
    let a_pool = proxied_pool(db, &proxy).await?;
    // A's first term; its work ends when told, and pg_lease then deletes
    // the lease row: that DELETE is held up in the network.
    let (started, a1_started) = slot();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let finish = Arc::new(Mutex::new(Some(finish_rx)));
    let a1 = LeaseLooper::new(
        "res".to_owned(),
        finishes_when_told,
        "A".to_owned(),
        a_pool.clone(),
        looper_options(),
        (started, finish),
    );
    a1.start().await?;
    tokio::time::timeout(Duration::from_secs(10), a1_started)
        .await
        .map_err(|_| "pg_lease: A never acquired")??;
    proxy.freeze();
    let _ = finish_tx.send(());
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The same holder (same worker id) acquires again, through a
    // connection of its own: pg_lease lets a worker id take back its own
    // unexpired lease.
    let direct = pool(db, "peer-A2").await?;
    let (a2_started_slot, a2_started) = slot();
    let (a2_stopped_slot, a2_stopped) = slot();
    let a2 = LeaseLooper::new(
        "res".to_owned(),
        holds_watched,
        "A".to_owned(),
        direct.clone(),
        looper_options(),
        (a2_started_slot, a2_stopped_slot),
    );
    a2.start().await?;
    tokio::time::timeout(Duration::from_secs(10), a2_started)
        .await
        .map_err(|_| "pg_lease: A's second term never began")??;
    // B is ready to take the lease as soon as it is free.
    let (b_slot, b_got) = slot();
    let b = LeaseLooper::new(
        "res".to_owned(),
        holds,
        "B".to_owned(),
        pool(db, "peer-B").await?,
        looper_options(),
        b_slot,
    );
    b.start().await?;
    // The late release arrives.
    proxy.thaw();
    let released = Instant::now();
    let took_over = tokio::time::timeout(WINDOW, b_got)
        .await
        .ok()
        .and_then(Result::ok)
        .map(|at| at.duration_since(released));
    let mut a2_stopped = a2_stopped;
    let stopped = tokio::time::timeout(WINDOW, &mut a2_stopped)
        .await
        .ok()
        .and_then(Result::ok)
        .map(|at| at.duration_since(released));
    a1.stop().await?;
    a2.stop().await?;
    b.stop().await?;
    a_pool.close().await;
    direct.close().await;
    Ok((took_over, stopped, late_pg_lease_detail(took_over, stopped)))
}

/// What happened to pg_lease, with the figures.
fn late_pg_lease_detail(took_over: Option<Duration>, stopped: Option<Duration>) -> String {
    let ms = |d: Option<Duration>| {
        d.map_or_else(
            || format!("not within {} s", WINDOW.as_secs()),
            |d| format!("{} ms", d.as_millis()),
        )
    };
    format!(
        "the first term's DELETE (by worker id, no token) arrived during the second term and \
         deleted its row; B held the lease {} after it, A's second term was stopped {} after it \
         (its next heartbeat)",
        ms(took_over),
        ms(stopped)
    )
}
