//! What the measures share: the timing and the pair tables
//! ([`timing`]), the databases ([`database`]), the held leases
//! ([`hold`]), the operations several measures time ([`ops`]), pgbench
//! ([`pgbench`]) and the pairs it runs ([`pairs`]), the waiters of the
//! handover measures ([`waiters`]), and statements counted by pool
//! ([`statements`]).

pub(crate) mod database;
pub(crate) mod ops;
pub(crate) mod pairs;
pub(crate) mod pgbench;
pub(crate) mod statements;
pub(crate) mod timing;
pub(crate) mod waiters;

use std::sync::Arc;

use pglease::{AcquireOptions, Error, Lease, LeaseManager};
use sqlx::PgPool;

use ops::LONG;

/// What every measure is given: the database most of them share,
/// `pglease_bench` (as [`database::setup`] leaves it), a manager on it,
/// one held lease per client (`held-0` to `held-7`, for renewals and
/// guarded writes), and the seconds per measurement (`BENCH_SECS`,
/// default 2).
pub(crate) struct Bench {
    pub(crate) pool: PgPool,
    pub(crate) m: LeaseManager,
    pub(crate) held: Arc<Vec<Lease>>,
    pub(crate) secs: f64,
}

impl Bench {
    /// `pglease_bench` created afresh, and its held leases acquired.
    pub(crate) async fn set_up() -> Result<Self, Error> {
        let secs: f64 = std::env::var("BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2.0);
        let pool = database::setup().await?;
        let m = LeaseManager::new(pool.clone());
        let held = hold(&m, "held-", 0..8).await?;
        Ok(Self {
            pool,
            m,
            held,
            secs,
        })
    }

    /// Closes the pool and drops `pglease_bench`.
    pub(crate) async fn tear_down(self) -> Result<(), Error> {
        self.pool.close().await;
        database::drop_database("pglease_bench").await
    }
}

/// `{prefix}{n}` for each `n` of `numbers`, acquired one after the other
/// through `m`, for holder `bench` and [`LONG`].
pub(crate) async fn hold(
    m: &LeaseManager,
    prefix: &str,
    numbers: impl IntoIterator<Item = usize>,
) -> Result<Arc<Vec<Lease>>, Error> {
    let mut held = Vec::new();
    for n in numbers {
        held.push(
            m.acquire(
                &format!("{prefix}{n}"),
                AcquireOptions::ttl(LONG).holder("bench"),
            )
            .await?,
        );
    }
    Ok(Arc::new(held))
}
