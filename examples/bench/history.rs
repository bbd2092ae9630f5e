//! `BENCH_ONLY=history` (also in the full run), the history's cost:
//! library acquire+release cycles with the history off
//! (`pglease.set_history('0')`) and on, alternated in one run.

use pglease::Error;

use crate::shared::Bench;
use crate::shared::database::set_history;
use crate::shared::ops::lib_cycle;
use crate::shared::timing::rate;

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let (pool, m, secs) = (&bench.pool, &bench.m, bench.secs);
    println!(
        "\nThe history on library acquire+release cycles, off (pglease.set_history('0')) \
         and on, alternated in one run:\n\n\
         | clients | without history ops/s | with history ops/s | ratio |\n|---:|---:|---:|---:|"
    );
    for clients in [1usize, 8] {
        let (mut off, mut on) = (0.0, 0.0);
        for _ in 0..2 {
            set_history(pool, false).await?;
            off += rate(clients, secs / 2.0, lib_cycle(m)).await;
            set_history(pool, true).await?;
            on += rate(clients, secs / 2.0, lib_cycle(m)).await;
        }
        println!(
            "| {clients} | {:.0} | {:.0} | {:.2} |",
            off / 2.0,
            on / 2.0,
            on / off
        );
    }
    Ok(())
}
