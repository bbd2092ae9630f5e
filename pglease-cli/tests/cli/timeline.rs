//! The command line after a failover to an asynchronous standby that had
//! not received the acquisition: `run` (on a multi-host URL, following the
//! primary) stops its command and exits 4, saying the database failed over
//! or was restored; `renew` and `release` under the forgotten token exit 4
//! with the same reason; `status`, `history` and `doctor` show the change;
//! the grant delay an administrator set makes `acquire` exit 3 until it
//! ends, and `acquire --wait` waits for it.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use pglease::{LeaseManager, sqlx};
use pglease_formations::{Replicated, SetupError, Standby};

use crate::common::{code, stderr, stdout, stop_recorder, stopped_at};

const BIN: &str = env!("CARGO_BIN_EXE_pglease");

/// `pglease --database-url URL ARGS...`, run to its end.
fn pglease(url: &str, args: &[&str]) -> Output {
    std::process::Command::new(BIN)
        .arg("--database-url")
        .arg(url)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run pglease")
}

async fn a_forgotten_acquisition_stops_run_and_is_refused_with_its_reason() -> Result<(), SetupError>
{
    let pair = Replicated::start(Standby::Asynchronous).await?;
    let primary = pair.primary().pool().await?;
    LeaseManager::new(primary.clone())
        .migrate()
        .await
        .expect("migrate");
    sqlx::query("SELECT pglease.set_grant_delay('3 s')")
        .execute(&primary)
        .await
        .expect("set the grant delay");
    pair.wait_for_replay().await?;
    // The standby receives nothing of what follows.
    pair.stop_standby(true)?;
    let url = format!(
        "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?connect_timeout=2",
        pair.primary().port(),
        pair.standby().port()
    );
    let stopped = std::env::temp_dir().join(format!("pglease-timeline-{}", std::process::id()));
    let script = stop_recorder(&stopped);
    let mut run = tokio::process::Command::new(BIN)
        .args([
            "--database-url",
            &url,
            "run",
            "victim",
            "--ttl",
            "20s",
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
    let token = loop {
        let token: Option<i64> =
            sqlx::query_scalar("SELECT token FROM pglease.status WHERE name = 'victim' AND held")
                .fetch_optional(&primary)
                .await
                .expect("read the status");
        if let Some(token) = token {
            break token;
        }
        assert!(Instant::now() < deadline, "run did not acquire in 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    primary.close().await;

    pair.crash_primary()?;
    pair.stop_standby(false)?;
    pair.promote().await?;
    let status = tokio::time::timeout(Duration::from_secs(40), run.wait())
        .await
        .expect("run exits within 40 s of the failover")
        .expect("wait for run");
    assert_eq!(status.code(), Some(4), "run's exit after the loss");
    let mut said = String::new();
    if let Some(mut err) = run.stderr.take() {
        use tokio::io::AsyncReadExt;
        err.read_to_string(&mut said).await.expect("run's stderr");
    }
    assert!(
        said.contains("failed over or was restored") && said.contains("stopping the command"),
        "{said}"
    );
    let _ = stopped_at(&stopped);

    let new = format!(
        "postgresql://postgres@127.0.0.1:{}/postgres",
        pair.standby().port()
    );
    let token = token.to_string();
    for args in [
        &["renew", "victim", "--token", &token, "--ttl", "10s"][..],
        &["release", "victim", "--token", &token][..],
    ] {
        let out = pglease(&new, args);
        assert_eq!(code(&out), 4, "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("failed over or was restored"),
            "{args:?}: {}",
            stderr(&out)
        );
    }

    // The grant delay (3 s from the change, which run's renewal found).
    let out = pglease(&new, &["acquire", "victim", "--ttl", "10s"]);
    if code(&out) == 3 {
        assert!(
            stderr(&out).contains("no lease is granted for another")
                && stderr(&out).contains("grant delay"),
            "{}",
            stderr(&out)
        );
        let out = pglease(
            &new,
            &["acquire", "victim", "--ttl", "10s", "--wait", "10s"],
        );
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    } else {
        // The delay was over before this acquisition (a slow machine).
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        eprintln!("the grant delay was over before the first acquire");
    }
    let out = pglease(&new, &["status"]);
    assert_eq!(code(&out), 0);
    assert!(
        stderr(&out).contains("changed from timeline 1 to 2")
            && stderr(&out).contains("tokens continue above"),
        "{}",
        stderr(&out)
    );
    let out = pglease(&new, &["history", "victim"]);
    assert!(stdout(&out).contains(" timeline "), "{}", stdout(&out));
    let out = pglease(&new, &["doctor"]);
    assert!(
        stdout(&out).contains("timeline 2 since"),
        "{}",
        stdout(&out)
    );
    Ok(())
}

pglease_formations::tests![a_forgotten_acquisition_stops_run_and_is_refused_with_its_reason(2),];
