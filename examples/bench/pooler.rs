//! `BENCH_ONLY=pooler` (also in the full run): lease operations through
//! PgBouncer (transaction mode, as many server sessions as clients) beside
//! the same operations on direct connections, alternated. The write in the
//! fenced transaction is an unnamed statement on both sides
//! (`persistent(false)`), as it must be through a pooler without
//! prepared-statement support.

use pglease::{Error, LeaseManager};
use pglease_formations::PgBouncer;
use sqlx::postgres::PgPoolOptions;

use crate::shared::Bench;
use crate::shared::database::kit;
use crate::shared::ops::{lib_cycle, lib_fenced, lib_renew};
use crate::shared::timing::{Op, alternate};

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let (m, leases) = (&bench.m, &bench.held);
    let server = bench.pool.connect_options();
    let started = PgBouncer::builder().server_pool(8).start(&server);
    let Some(bouncer) = kit("Through PgBouncer", started)? else {
        return Ok(());
    };
    let pooled_pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(bouncer.options(&server))
        .await?;
    let pooled = LeaseManager::new(pooled_pool);
    println!(
        "\nThrough PgBouncer {} (pool_mode = transaction, 8 server sessions) vs direct, \
         alternated\n| operation | clients | direct ops/s | through PgBouncer ops/s | ratio |\n\
         |---|---:|---:|---:|---:|",
        PgBouncer::version().unwrap_or_default()
    );
    for clients in [1usize, 8] {
        let rows: Vec<(&str, Op, Op)> = vec![
            ("acquire + release", lib_cycle(m), lib_cycle(&pooled)),
            ("renew", lib_renew(m, leases), lib_renew(&pooled, leases)),
            (
                "fenced transaction, one write",
                lib_fenced(m, leases, false),
                lib_fenced(&pooled, leases, false),
            ),
        ];
        for (label, direct, through) in rows {
            let (d, p) = alternate(clients, bench.secs, 2, direct, through).await;
            println!("| {label} | {clients} | {d:.0} | {p:.0} | {:.2} |", p / d);
        }
    }
    Ok(())
}
