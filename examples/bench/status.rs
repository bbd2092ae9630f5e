//! `BENCH_ONLY=status` (also in the full run): the status of 100,000
//! leases (half held), as `status` reads it: all of them, and filtered in
//! the database.

use std::time::{Duration, Instant};

use pglease::{Error, ListFilter};

use crate::shared::Bench;
use crate::shared::database::fill;
use crate::shared::timing::median;

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    const ROWS: i64 = 100_000;
    let (pool, m) = (&bench.pool, &bench.m);
    fill(pool, ROWS).await?;
    let filters = [
        ("all", ListFilter::default()),
        ("--held", ListFilter::default().held()),
        (
            "--prefix filler-4242",
            ListFilter::default().prefix("filler-4242"),
        ),
        ("--limit 100", ListFilter::default().limit(100)),
        (
            "--held --limit 100",
            ListFilter::default().held().limit(100),
        ),
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); filters.len()];
    let mut counts = vec![0usize; filters.len()];
    for _ in 0..5 {
        for (i, (_, filter)) in filters.iter().enumerate() {
            let start = Instant::now();
            counts[i] = m.list(filter).await?.len();
            times[i].push(start.elapsed());
        }
    }
    let all = median(&times[0]).as_secs_f64();
    println!(
        "\nstatus of {ROWS} leases (library list, as `pglease status` reads them; \
         median of 5):\n\n| filter | leases | ms | / all |\n|---|---:|---:|---:|"
    );
    for (i, (label, _)) in filters.iter().enumerate() {
        let t = median(&times[i]).as_secs_f64();
        println!(
            "| {label} | {} | {:.1} | {:.3} |",
            counts[i],
            t * 1e3,
            t / all
        );
    }
    Ok(())
}
