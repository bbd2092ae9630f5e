//! P5 (the full run only): acquire (with release) and renew on a leases
//! table of 1,000 rows and on one of 1,000,000 rows (a second database),
//! alternated.

use std::sync::Arc;
use std::time::Instant;

use pglease::{Error, Lease, LeaseManager};

use crate::shared::database::{drop_database, fill, fresh_database};
use crate::shared::ops::{lib_cycle, lib_renew};
use crate::shared::timing::{Op, alternate};
use crate::shared::{Bench, hold};

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    const BIG: &str = "pglease_bench_1m";
    let small = &bench.pool;
    let big = fresh_database(BIG, 8).await?;
    let (small_m, big_m) = (
        LeaseManager::new(small.clone()),
        LeaseManager::new(big.clone()),
    );
    big_m.migrate().await?;
    let started = Instant::now();
    fill(&big, 1_000_000).await?;
    fill(small, 1_000).await?;
    println!(
        "\nScale: the same operations with 1,000 and with 1,000,000 lease rows \
         (filled in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    println!(
        "| operation | clients | 1,000 rows ops/s | 1,000,000 rows ops/s | ratio |\n\
         |---|---:|---:|---:|---:|"
    );
    let tokens = [held(&small_m).await?, held(&big_m).await?];
    for clients in [1usize, 8] {
        let rows: [(&str, Op, Op); 2] = [
            ("acquire + release", lib_cycle(&small_m), lib_cycle(&big_m)),
            (
                "renew",
                lib_renew(&small_m, &tokens[0]),
                lib_renew(&big_m, &tokens[1]),
            ),
        ];
        for (label, at_small, at_big) in rows {
            // Twice the alternations of the other tables: two runs with
            // two alternations gave 0.83 to 1.11 for the same rows, as the
            // commit rate drifts during a run.
            let (s, b) = alternate(clients, bench.secs, 4, at_small, at_big).await;
            println!("| {label} | {clients} | {s:.0} | {b:.0} | {:.2} |", b / s);
        }
    }
    big.close().await;
    drop_database(BIG).await
}

/// One lease held through `m` per client, `scale-held-0` to `-7`.
async fn held(m: &LeaseManager) -> Result<Arc<Vec<Lease>>, Error> {
    hold(m, "scale-held-", 0..8).await
}
