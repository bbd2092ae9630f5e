//! The last table of `BENCH_ONLY=sql`: the uncommon paths
//! (`bench/pgbench/uncommon_*.sql`), each alternated with the common
//! acquire + release (`lease_cycle.sql`) at one client on 1,000 names,
//! default history: what each costs beside the usual case.

use pglease::Error;
use sqlx::PgPool;

use crate::shared::pgbench::Pgbench;
use crate::shared::timing::Pairs;

/// An uncommon path: what it is, its script, its pglease calls per
/// transaction, and the statements run before and after its rounds.
struct Uncommon {
    what: &'static str,
    script: &'static str,
    calls: u32,
    before: Option<&'static str>,
    after: Option<&'static str>,
}

const PATHS: [Uncommon; 4] = [
    Uncommon {
        what: "first acquisition of a name (creates its row)",
        script: "uncommon_create",
        calls: 2,
        before: None,
        after: None,
    },
    Uncommon {
        what: "session-bound acquire + release",
        script: "uncommon_session",
        calls: 2,
        before: None,
        after: None,
    },
    Uncommon {
        what: "acquire + release of a name a grant covers (checked on the second try)",
        script: "uncommon_granted",
        calls: 2,
        before: Some("SELECT pglease.grant_names('cycle-', current_user)"),
        after: Some("SELECT pglease.revoke_names('cycle-', current_user)"),
    },
    Uncommon {
        what: "acquire of a name whose term expired unreleased (records the expiry)",
        script: "uncommon_expired",
        calls: 1,
        before: Some(
            "SELECT count((pglease.acquire('expiring-' || g, 'bench', \
             interval '1 millisecond')).token) FROM generate_series(1, 1000) AS g",
        ),
        after: None,
    },
];

/// The table, through `pgbench`, `rounds` pairs of `secs` runs; `pool`
/// (on the same database) for the statements around each path.
pub(crate) async fn run(
    pool: &PgPool,
    pgbench: &Pgbench,
    secs: f64,
    rounds: usize,
) -> Result<(), Error> {
    sqlx::query("SELECT pglease.set_history('30 days'::interval)")
        .execute(pool)
        .await?;
    println!(
        "\nUncommon paths, one client, 1,000 names, default history: each script's tps \
         beside acquire + release of a free name (lease_cycle), alternated\n"
    );
    println!(
        "| path | calls per transaction | lease_cycle tps (median) | path tps (median) | ratio per pair | median |\n\
         |---|---:|---:|---:|---|---:|"
    );
    for path in &PATHS {
        if let Some(sql) = path.before {
            sqlx::query(sql).execute(pool).await?;
        }
        let mut pairs = Pairs::default();
        for _ in 0..rounds {
            let common = pgbench.tps("lease_cycle", 1, 1000, secs)?;
            let uncommon = pgbench.tps(path.script, 1, 1000, secs)?;
            pairs.push(common, uncommon);
        }
        if let Some(sql) = path.after {
            sqlx::query(sql).execute(pool).await?;
        }
        println!("| {} | {} | {} |", path.what, path.calls, pairs.cells());
    }
    Ok(())
}
