//! `pglease run` across a failover without a stable endpoint: its URL
//! names the primary, which is killed. CMD must be stopped before the
//! database's expiry of the lease, and `pglease` must exit 4 within a
//! couple of seconds of that, whatever its final release does.

use std::process::Stdio;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use pglease::{LeaseManager, sqlx};
use pglease_formations::{Replicated, SetupError, Standby};

use crate::common::{stop_recorder, stopped_at};

const BIN: &str = env!("CARGO_BIN_EXE_pglease");

async fn run_stops_the_command_before_the_expiry_and_exits_4_soon_after() -> Result<(), SetupError>
{
    let cluster = Replicated::start(Standby::Synchronous).await?;
    let primary = cluster.primary().pool().await?;
    LeaseManager::new(primary.clone())
        .migrate()
        .await
        .expect("migrate");
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        cluster.primary().port()
    );
    let stopped = std::env::temp_dir().join(format!("pglease-failover-{}", std::process::id()));
    // CMD writes the wall-clock time at which it is told to stop.
    let script = stop_recorder(&stopped);
    let mut run = tokio::process::Command::new(BIN)
        .args([
            "--database-url",
            &url,
            "run",
            "job",
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pglease run");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let held: Option<bool> =
            sqlx::query_scalar("SELECT held FROM pglease.status WHERE name = 'job'")
                .fetch_optional(&primary)
                .await
                .expect("read the status");
        if held == Some(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pglease run did not acquire within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    primary.close().await;

    cluster.crash_primary()?;
    let crashed = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(15), run.wait())
        .await
        .expect("pglease run exits within 15 s of the crash")
        .expect("wait for pglease run");
    let exited = crashed.elapsed();
    assert_eq!(
        status.code(),
        Some(4),
        "exit status after the lease was lost"
    );

    // The standby is synchronous: it has the lease's last expiry.
    cluster.promote().await?;
    let promoted = cluster.standby().pool().await?;
    let expires_at: DateTime<Utc> =
        sqlx::query_scalar("SELECT expires_at FROM pglease.leases WHERE name = 'job'")
            .fetch_one(&promoted)
            .await
            .expect("read the lease on the promoted standby");
    // Someone else gets the lease once it has expired, not before (the
    // run's release went to the dead primary).
    let taken = LeaseManager::new(promoted)
        .acquire(
            "job",
            pglease::AcquireOptions::ttl(Duration::from_secs(60))
                .holder("B")
                .wait(Duration::from_secs(5)),
        )
        .await
        .expect("B acquires on the promoted standby");
    assert!(
        taken.acquired_at() >= expires_at,
        "B acquired at {}, before the expiry {expires_at}",
        taken.acquired_at()
    );
    let stop_at = stopped_at(&stopped);
    assert!(
        stop_at < expires_at,
        "CMD was stopped at {stop_at}, after the database expiry {expires_at}"
    );
    let exit_after_expiry = Utc::now()
        - chrono::Duration::from_std(crashed.elapsed() - exited).expect("a duration")
        - expires_at;
    assert!(
        exit_after_expiry < chrono::Duration::seconds(4),
        "pglease exited {exit_after_expiry} after the database expiry"
    );
    eprintln!(
        "CMD stopped {} ms before the database expiry; pglease exited {} ms after it",
        (expires_at - stop_at).num_milliseconds(),
        exit_after_expiry.num_milliseconds()
    );
    Ok(())
}

pglease_formations::tests![run_stops_the_command_before_the_expiry_and_exits_4_soon_after(2),];
