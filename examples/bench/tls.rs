//! `BENCH_ONLY=tls`: what TLS costs per operation. On the TLS formation (a
//! non-superuser owner, `scram-sha-256`), plain connections allowed beside
//! TLS for the baseline, the same operations through a manager connected
//! with `sslmode=disable` and one with `sslmode=verify-full`, alternated.

use std::sync::Arc;

use pglease::{Error, Lease, LeaseManager};

use crate::shared::database::kit;
use crate::shared::ops::{lib_cycle, lib_fenced, lib_renew};
use crate::shared::timing::{Op, alternate};
use crate::shared::{Bench, hold};

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let Some(server) = kit("TLS", pglease_formations::TlsServer::start().await)? else {
        return Ok(());
    };
    server
        .allow_plain()
        .await
        .map_err(|e| Error::Database(sqlx::Error::Configuration(Box::new(e))))?;
    let plain = LeaseManager::connect(&server.url("sslmode=disable")).await?;
    let tls = LeaseManager::connect(&server.url("sslmode=verify-full")).await?;
    let held = set_up(&plain).await?;
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(tls.pool())
            .await?;
    let version: String = sqlx::query_scalar(
        "SELECT coalesce(version || ' ' || cipher, 'none') FROM pg_stat_ssl \
         WHERE pid = pg_backend_pid()",
    )
    .fetch_one(tls.pool())
    .await?;
    println!(
        "\nTLS per operation: the TLS formation, as its non-superuser owner, \
         sslmode=disable vs verify-full ({version}, encrypted: {encrypted}), alternated\n\
         | operation | clients | without TLS ops/s | with TLS ops/s | with / without |\n\
         |---|---:|---:|---:|---:|"
    );
    for clients in [1usize, 8] {
        let rows: Vec<(&str, Op, Op)> = vec![
            ("acquire + release", lib_cycle(&plain), lib_cycle(&tls)),
            ("renew", lib_renew(&plain, &held), lib_renew(&tls, &held)),
            (
                "fenced transaction, one write",
                lib_fenced(&plain, &held, false),
                lib_fenced(&tls, &held, false),
            ),
        ];
        for (label, without, with) in rows {
            let (a, b) = alternate(clients, bench.secs, 3, without, with).await;
            println!("| {label} | {clients} | {a:.0} | {b:.0} | {:.2} |", b / a);
        }
    }
    Ok(())
}

/// The schema, the data table and one held lease per client on the TLS
/// formation, through `plain`.
async fn set_up(plain: &LeaseManager) -> Result<Arc<Vec<Lease>>, Error> {
    plain.migrate().await?;
    sqlx::raw_sql(
        "CREATE TABLE data (id int PRIMARY KEY, value bigint NOT NULL); \
         INSERT INTO data SELECT g, 0 FROM generate_series(0, 15) g",
    )
    .execute(plain.pool())
    .await?;
    hold(plain, "held-", 0..8).await
}
