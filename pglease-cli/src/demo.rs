//! The article's central failure, live against the database: a holder
//! pauses past its TTL, another takes over, and the paused holder's late
//! write is rejected by PostgreSQL, not by a client timer.

use std::time::Duration;

use sqlx::{Connection, PgConnection};

use pglease::{AcquireOptions, Error, Lease, LeaseManager, Result, assert_held};

/// Runs the paused-holder scenario on lease `name`, reporting each step to
/// `report`. One step of the scenario is `unit` long (the whole run is
/// about ten units). Leaves the lease released.
pub async fn paused_holder(
    manager: &LeaseManager,
    name: &str,
    unit: Duration,
    mut report: impl FnMut(&str),
) -> Result<()> {
    let ttl = unit * 3;
    // A private table on one connection stands for the protected data.
    let mut conn = PgConnection::connect_with(&manager.pool().connect_options()).await?;
    sqlx::query("CREATE TEMP TABLE pglease_demo_data (written_by text, token bigint)")
        .execute(&mut conn)
        .await?;

    let a = manager
        .acquire(name, AcquireOptions::ttl(ttl).holder("worker-A"))
        .await?;
    report(&format!(
        "worker-A acquires {name:?} for {ttl:?}: token {}",
        a.token()
    ));
    write(&mut conn, "worker-A", &a, &mut report).await?;

    report(&format!(
        "worker-A pauses for {:?} (a GC pause, a stopped VM...): its lease expires",
        unit * 4
    ));
    tokio::time::sleep(unit * 4).await;

    let b = manager
        .acquire(name, AcquireOptions::ttl(ttl).holder("worker-B"))
        .await?;
    report(&format!(
        "worker-B acquires the expired lease: token {} > {}",
        b.token(),
        a.token()
    ));
    write(&mut conn, "worker-B", &b, &mut report).await?;

    report("worker-A resumes and sends the write it had prepared:");
    write(&mut conn, "worker-A", &a, &mut report).await?;
    let released = manager.release(&a).await?;
    report(&format!(
        "worker-A's delayed release with token {}: {}",
        a.token(),
        if released {
            "ENDED the lease (wrong!)"
        } else {
            "ignored, worker-B still holds it"
        }
    ));
    manager.release(&b).await?;

    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT written_by, token FROM pglease_demo_data")
            .fetch_all(&mut conn)
            .await?;
    let summary: Vec<String> = rows.iter().map(|(w, t)| format!("{w}@{t}")).collect();
    report(&format!("committed writes: {}", summary.join(", ")));
    let _ = conn.close().await;
    Ok(())
}

async fn write(
    conn: &mut PgConnection,
    who: &str,
    lease: &Lease,
    report: &mut impl FnMut(&str),
) -> Result<()> {
    let token = lease.token();
    let mut tx = conn.begin().await?;
    match assert_held(&mut tx, lease).await {
        Ok(()) => {
            sqlx::query("INSERT INTO pglease_demo_data VALUES ($1, $2)")
                .bind(who)
                .bind(token)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            report(&format!("  {who} writes under token {token}: committed"));
            Ok(())
        }
        Err(rejected @ Error::NotHeld { .. }) => {
            report(&format!(
                "  {who} writes under token {token}: REJECTED by PostgreSQL (LE001): {rejected}"
            ));
            Ok(())
        }
        Err(e) => Err(e),
    }
}
