//! How a service tests what it does when it loses its lease, with
//! `pglease::testing` (in your `Cargo.toml`, with the path of your
//! `[dependencies]` line: `[dev-dependencies] pglease = { path =
//! "../pglease", features = ["testing"] }`).
//!
//! The service: a worker that, while it holds lease `ledger`, appends
//! entries to a ledger table, each in a fenced transaction under its
//! token. Its tests (below, run by `cargo test`) take the lease from it in
//! the middle of its work, fail its renewals, and check that it stopped
//! and that no entry under the old token was committed afterwards.
//!
//! Run the tests: `cargo test -p pglease --example worker_test`; run the
//! worker once: `cargo run -p pglease --example worker_test` (on the
//! server `pglease::provision` finds).

use std::time::Duration;

use pglease::{AcquireOptions, Error, LeaseManager};

/// The service: appends numbered entries under the lease until `entries`
/// are written or the lease is lost (`Error::Lost`). Each entry is a
/// fenced transaction, so the database refuses it once the token is stale.
pub async fn run_worker(
    leases: &LeaseManager,
    holder: &str,
    entries: u32,
    pause: Duration,
) -> Result<u32, Error> {
    leases
        .with_lease(
            "ledger",
            AcquireOptions::ttl(Duration::from_secs(3))
                .holder(holder)
                .wait(Duration::from_secs(10)),
            async |held| {
                for n in 1..=entries {
                    let mut tx = held.begin_fenced().await?;
                    sqlx::query("INSERT INTO ledger (n, holder, token) VALUES ($1, $2, $3)")
                        .bind(n as i32)
                        .bind(held.lease().holder())
                        .bind(held.token())
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    tokio::time::sleep(pause).await;
                }
                Ok::<_, Error>(entries)
            },
        )
        .await
}

/// The table the worker writes, protected by the lease: the database
/// refuses writes from transactions that do not hold `ledger`.
pub async fn create_ledger(pool: &sqlx::PgPool) -> Result<(), Error> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS ledger (n int, holder text, token bigint, \
                                            at timestamptz DEFAULT clock_timestamp()); \
         SELECT pglease.protect('ledger', 'ledger');",
    )
    .execute(pool)
    .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = pglease::testing::TestDatabase::new().await?;
    println!("on {}", db.server());
    create_ledger(db.pool()).await?;
    let written = run_worker(&db.manager(), "worker", 5, Duration::from_millis(10)).await?;
    println!("the worker wrote {written} entries under its lease");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pglease::LossReason;
    use pglease::testing::{TestDatabase, take_over};

    /// The ledger's entries under `token`.
    async fn entries_under(db: &TestDatabase, token: i64) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM ledger WHERE token = $1")
            .bind(token)
            .fetch_one(db.pool())
            .await
            .expect("count")
    }

    async fn until_entries(db: &TestDatabase, at_least: i64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let count: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger")
                .fetch_one(db.pool())
                .await
                .expect("count");
            if count >= at_least {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "the worker writes");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn the_worker_stops_when_its_lease_is_taken_over_mid_work() {
        let db = TestDatabase::new().await.expect("a test database");
        create_ledger(db.pool()).await.expect("ledger");
        let manager = db.manager();
        let worker = {
            let manager = manager.clone();
            tokio::spawn(async move {
                run_worker(&manager, "worker", 1_000, Duration::from_millis(20)).await
            })
        };
        until_entries(&db, 3).await;
        let old: i64 = sqlx::query_scalar("SELECT min(token) FROM ledger")
            .fetch_one(db.pool())
            .await
            .expect("the worker's token");

        // Another instance takes the lease over, as after a real expiry.
        let other = db.manager();
        let next = take_over(
            &other,
            "ledger",
            AcquireOptions::ttl(Duration::from_secs(30)).holder("other"),
        )
        .await
        .expect("take over");
        // From here on no entry under the old token may commit.
        let before = entries_under(&db, old).await;
        // Make the worker look now rather than at its next renewal.
        manager.faults().renew_now();

        let outcome = tokio::time::timeout(Duration::from_secs(10), worker)
            .await
            .expect("the worker stops")
            .expect("worker task");
        // Whatever the worker was doing (its fenced transaction ended by the
        // takeover, or a new one refused), with_lease reports the loss.
        match outcome {
            Err(Error::Lost {
                reason: LossReason::Stale { .. },
                ..
            }) => {}
            other => panic!("the worker should have stopped on the loss: {other:?}"),
        }
        assert_eq!(
            entries_under(&db, old).await,
            before,
            "an entry under the old token committed after the takeover"
        );
        // The new holder writes (and a stray write without its token would
        // be refused by the table's protection).
        let mut tx = other.begin_fenced(&next).await.expect("fenced");
        sqlx::query("INSERT INTO ledger (n, holder, token) VALUES (0, 'other', $1)")
            .bind(next.token())
            .execute(&mut *tx)
            .await
            .expect("the new holder writes");
        tx.commit().await.expect("commit");
        assert!(next.token().get() > old);
    }

    #[tokio::test]
    async fn the_worker_stops_when_the_database_cannot_be_reached() {
        let db = TestDatabase::new().await.expect("a test database");
        create_ledger(db.pool()).await.expect("ledger");
        let manager = db.manager();
        manager.faults().fail_renewals();
        let outcome = tokio::time::timeout(
            Duration::from_secs(15),
            run_worker(&manager, "worker", 1_000, Duration::from_millis(20)),
        )
        .await
        .expect("the worker stops by its deadline");
        match outcome {
            Err(Error::Lost {
                reason: LossReason::Unreachable { .. },
                ..
            }) => {}
            other => panic!("the worker should have lost its lease: {other:?}"),
        }
    }
}
