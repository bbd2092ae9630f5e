//! `BENCH_ONLY=p4` (also in the full run), P4: a holder acquires with a
//! 1 s TTL and then either dies without releasing, or freezes inside a
//! fenced transaction (left open and idle, as by a stopped process); a
//! waiter (listening) takes over. Reported: time from the holder's expiry
//! to the waiter's acquisition (both on the database clock), and from the
//! holder's acquisition, which must stay within TTL + 1 s. The two kinds
//! alternate, round by round.

use std::time::{Duration, Instant};

use pglease::{AcquireOptions, Error, LeaseManager};

use crate::shared::Bench;
use crate::shared::ops::LONG;
use crate::shared::timing::{median, ms};

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    const TTL: Duration = Duration::from_secs(1);
    const ROUNDS: usize = 7;
    let pool = &bench.pool;
    let waiter = LeaseManager::new(pool.clone());
    let holder = LeaseManager::new(pool.clone());
    // [dead, frozen]: (after expiry, after acquisition)
    let mut after: [(Vec<Duration>, Vec<Duration>); 2] = Default::default();
    for round in 0..ROUNDS {
        for (kind, frozen) in [false, true].into_iter().enumerate() {
            let name = format!("takeover-{round}-{kind}");
            let start = Instant::now();
            let lease = holder
                .acquire(&name, AcquireOptions::ttl(TTL).holder("holder"))
                .await?;
            let fenced = if frozen {
                Some(holder.begin_fenced(&lease).await?)
            } else {
                None
            };
            let got = waiter
                .acquire(&name, AcquireOptions::ttl(LONG).holder("waiter").wait(LONG))
                .await?;
            after[kind].1.push(start.elapsed());
            after[kind].0.push(
                (got.acquired_at() - lease.expires_at())
                    .to_std()
                    .unwrap_or_default(),
            );
            // The frozen holder's session was ended by the takeover.
            drop(fenced);
            waiter.release(&got).await?;
        }
    }
    println!(
        "\nTakeover, TTL 1 s, {ROUNDS} rounds each (bound: TTL + 1 s = 2000 ms after the acquisition):\n\n\
         | old holder | after its expiry, median | worst | after its acquisition, median | worst |\n\
         |---|---:|---:|---:|---:|"
    );
    for (kind, label) in ["died", "frozen inside a fenced transaction"]
        .iter()
        .enumerate()
    {
        let (expiry, acquisition) = &after[kind];
        println!(
            "| {label} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |",
            ms(median(expiry)),
            ms(expiry.iter().max().copied().unwrap_or_default()),
            ms(median(acquisition)),
            ms(acquisition.iter().max().copied().unwrap_or_default()),
        );
    }
    Ok(())
}
