//! Scenario (d): a release that arrives late, after the same holder has
//! acquired the lease again. Does the late release end the new term, so
//! that another worker takes the lease while the holder's new term runs?

use std::sync::Arc;
use std::time::{Duration, Instant};

use pglease::AcquireOptions;
use tokio::sync::oneshot;

use crate::looper::{OnDrop, Signal, signal, slot};
use crate::paused::{proxied_pool, target};
use crate::proxy::Proxy;
use crate::{BoxError, Peer, Verdict, pool, scratch};

const TTL: Duration = Duration::from_secs(1);
/// How long the second worker tries after the late release.
const WINDOW: Duration = Duration::from_secs(2);

fn looper_options() -> pg_lease::LeaseLooperOptions {
    crate::looper::options(TTL)
}

/// Scenario (d) for `peer`, in a database of its own.
///
/// # Errors
///
/// A peer or the database failing in a way the scenario does not expect.
pub async fn late_release(peer: Peer) -> Result<Verdict, BoxError> {
    let db = scratch().await?;
    match peer {
        Peer::Pglease => {
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
            Ok(Verdict {
                peer,
                violated: took_over.is_some(),
                took_over,
                detail: format!(
                    "the late release names token {}, the new term has {}: it returned {ended} \
                     and changed nothing; B {}",
                    first.token(),
                    again.token(),
                    took_over.map_or_else(
                        || format!("could not take over within {} s", WINDOW.as_secs()),
                        |t| format!("took over after {} ms", t.as_millis())
                    )
                ),
            })
        }
        Peer::PgLease => {
            let proxy = Proxy::start(target(&db).await?).await?;
            let a_pool = proxied_pool(&db, &proxy).await?;
            // A's first term; its work ends when told, and pg_lease then
            // deletes the lease row: that DELETE is held up in the network.
            let (started, a1_started) = slot();
            let (finish_tx, finish_rx) = oneshot::channel::<()>();
            let finish = Arc::new(tokio::sync::Mutex::new(Some(finish_rx)));
            let a1 = pg_lease::LeaseLooper::new(
                "res".to_owned(),
                |_ctx,
                 (started, finish): (
                    Signal,
                    Arc<tokio::sync::Mutex<Option<oneshot::Receiver<()>>>>,
                )| async move {
                    signal(&started);
                    if let Some(rx) = finish.lock().await.take() {
                        let _ = rx.await;
                    }
                    Ok(())
                },
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
            // connection of its own: pg_lease lets a worker id take back
            // its own unexpired lease.
            let direct = pool(&db, "peer-A2").await?;
            let (a2_started_slot, a2_started) = slot();
            let (a2_stopped_slot, a2_stopped) = slot();
            let a2 = pg_lease::LeaseLooper::new(
                "res".to_owned(),
                |_ctx, (started, stopped): (Signal, Signal)| async move {
                    let _guard = OnDrop(stopped);
                    signal(&started);
                    std::future::pending::<()>().await;
                    Ok(())
                },
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
            let b = pg_lease::LeaseLooper::new(
                "res".to_owned(),
                |_ctx, got: Signal| async move {
                    signal(&got);
                    std::future::pending::<()>().await;
                    Ok(())
                },
                "B".to_owned(),
                pool(&db, "peer-B").await?,
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
            // Two holders: B held it before A's second term was stopped.
            let violated = match (took_over, stopped) {
                (Some(b), Some(a)) => b < a,
                (Some(_), None) => true,
                (None, _) => false,
            };
            let ms = |d: Option<Duration>| {
                d.map_or_else(
                    || format!("not within {} s", WINDOW.as_secs()),
                    |d| format!("{} ms", d.as_millis()),
                )
            };
            Ok(Verdict {
                peer,
                violated,
                took_over,
                detail: format!(
                    "the first term's DELETE (by worker id, no token) arrived during the second \
                     term and deleted its row; B held the lease {} after it, A's second term was \
                     stopped {} after it (its next heartbeat)",
                    ms(took_over),
                    ms(stopped)
                ),
            })
        }
        Peer::DistributedLock | Peer::SqlxAdvisoryLock => Ok(Verdict {
            peer,
            violated: false,
            took_over: None,
            detail: "not applicable: release consumes the handle (guard) and waits for the \
                     unlock's answer, so the API cannot send a release late or twice"
                .to_owned(),
        }),
    }
}
