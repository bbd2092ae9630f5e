//! The command line under pg_auto_failover (`pglease_formations::AutoFailover`),
//! with the formation's multi-host URL in `DATABASE_URL`, as its users
//! have it: `migrate`, `status`, `acquire`, `doctor` work with it; `run`
//! keeps its command running across an automatic failover that fits the
//! TTL, and stops it (exit 4) before the database's expiry when the
//! failover does not fit.

use std::process::Stdio;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use pglease::LeaseManager;

use crate::common::{pglease_on, stop_recorder, stopped_at};
use pglease_formations::{AutoFailover, SetupError};

const BIN: &str = env!("CARGO_BIN_EXE_pglease");

fn spawn(url: &str, args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start pglease")
}

/// (token, expires_at) of `name` as the current primary has it, through
/// the multi-host URL.
async fn lease(url: &str, name: &str) -> Option<(i64, DateTime<Utc>)> {
    let m = LeaseManager::connect(url).await.ok()?;
    let status = m.inspect(name).await.ok()?;
    m.shutdown().await.ok()?;
    Some((status.token?.get(), status.expires_at?))
}

async fn until_held(url: &str, name: &str) -> (i64, DateTime<Utc>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(held) = lease(url, name).await {
            return held;
        }
        assert!(Instant::now() < deadline, "{name} not acquired within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn stderr_of(child: tokio::process::Child) -> (Option<i32>, String) {
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("pglease exits within 60 s")
        .expect("wait for pglease");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn run_rides_out_a_failover_that_fits_and_stops_before_the_expiry_when_not()
-> Result<(), SetupError> {
    let formation = AutoFailover::start().await?;
    let url = formation.url();
    for args in [
        &["migrate"][..],
        &["acquire", "once", "--ttl", "1m"],
        &["status"],
        &["status", "once"],
    ] {
        let out = pglease_on(&url, args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Doctor answers for every host (its verdict is its own test's).
    let doctor = pglease_on(&url, &["doctor"]);
    let said = String::from_utf8_lossy(&doctor.stdout);
    for index in 0..2 {
        let host = format!("127.0.0.1:{}", formation.node(index).port());
        assert!(said.contains(&host), "doctor names {host}: {said}");
    }
    // Told the monitor, it checks a failover against the TTL given.
    let monitor = format!(
        "postgres://postgres@127.0.0.1:{}/pg_auto_failover",
        formation.monitor_options().get_port()
    );
    for (ttl, verdict, said) in [("30s", "ok", "fits"), ("4s", "warning", "does not fit")] {
        let out = pglease_on(&url, &["doctor", "--monitor", &monitor, "--ttl", ttl]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("failover"))
            .unwrap_or_else(|| panic!("no failover line: {stdout}"));
        assert!(
            line.starts_with(verdict) && line.contains(said),
            "{ttl}: {line}"
        );
        eprintln!("doctor --monitor --ttl {ttl}:\n{stdout}");
    }
    let bad = pglease_on(&url, &["doctor", "--monitor", "redis://127.0.0.1:1"]);
    assert_eq!(bad.status.code(), Some(2));

    // A failover that fits the TTL: the command goes on, under the same
    // token, and its own exit status is pglease's. A TTL of 15 s renews
    // every 5 s, so that a renewal falls within the failover (5 s or more
    // here) and pglease says so, and that the failover (under 10 s here)
    // fits before the local deadline wherever it falls.
    let go_on = std::env::temp_dir().join(format!("pglease-af-{}", std::process::id()));
    let _ = std::fs::remove_file(&go_on);
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; exit 7",
        go_on.display()
    );
    let run = spawn(
        &url,
        &["run", "job", "--ttl", "15s", "--", "sh", "-c", &script],
    );
    let (token, first_expiry) = until_held(&url, "job").await;
    // Crash a second before a renewal is due (TTL 15 s: renewed every 5 s),
    // so that the failover (about 5 s) spans it and `run` must say so: a
    // crash just after a renewal can be over, the new primary found, before
    // the next one is sent, and then nothing fails.
    let deadline = Instant::now() + Duration::from_secs(20);
    let expires_before = loop {
        if let Some((_, expires)) = lease(&url, "job").await
            && expires > first_expiry
        {
            break expires;
        }
        assert!(Instant::now() < deadline, "job not renewed within 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_secs(4)).await;
    let old = formation.primary().await?;
    formation.crash(old)?;
    let crashed = Instant::now();
    let new = formation.wait_for_failover(old).await?;
    let promoted = crashed.elapsed();
    // Renewed on the new primary (same token, later expiry).
    let deadline = Instant::now() + Duration::from_secs(25);
    let renewed = loop {
        if let Some((now_token, expires)) = lease(&url, "job").await {
            assert_eq!(now_token, token, "the token changed across the failover");
            if expires > expires_before {
                break crashed.elapsed();
            }
        }
        assert!(Instant::now() < deadline, "no renewal on the new primary");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    std::fs::write(&go_on, b"").expect("tell the command to finish");
    let (code, stderr) = stderr_of(run).await;
    let _ = std::fs::remove_file(&go_on);
    assert_eq!(code, Some(7), "the command's own status; stderr: {stderr}");
    assert!(!stderr.contains("lost"), "{stderr}");
    // It said when renewals started failing, and when they succeeded again.
    let failing = stderr.find("are failing").expect("said: failing");
    let recovered = stderr.find("succeed again").expect("said: recovered");
    assert!(recovered > failing, "{stderr}");
    eprintln!(
        "fits: promoted {promoted:?} after the crash, renewed there {renewed:?} after it; \
         stderr: {stderr:?}"
    );

    // A failover that does not fit a 4 s TTL: the command is stopped
    // before the database's expiry, pglease exits 4, and says why.
    formation.rejoin(old).await?;
    let stopped = std::env::temp_dir().join(format!("pglease-af-stop-{}", std::process::id()));
    let script = stop_recorder(&stopped);
    let run = spawn(
        &url,
        &["run", "short", "--ttl", "4s", "--", "sh", "-c", &script],
    );
    let (short_token, _) = until_held(&url, "short").await;
    formation.crash(new)?;
    let crashed = Instant::now();
    let (code, stderr) = stderr_of(run).await;
    let exited = crashed.elapsed();
    assert_eq!(code, Some(4), "lost: exit 4; stderr: {stderr}");
    assert!(stderr.contains("are failing"), "{stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
    formation.wait_for_failover(new).await?;
    let (last_token, expires_at) = lease(&url, "short")
        .await
        .expect("the lease on the new primary");
    assert_eq!(last_token, short_token);
    let stop_at = stopped_at(&stopped);
    assert!(
        stop_at < expires_at,
        "stopped at {stop_at}, after the database's expiry {expires_at}"
    );
    // Once expired, someone else gets it on the new primary.
    let other = LeaseManager::connect(&url).await.expect("connect");
    let taken = other
        .acquire(
            "short",
            pglease::AcquireOptions::ttl(Duration::from_secs(60))
                .holder("B")
                .wait(Duration::from_secs(10)),
        )
        .await
        .expect("B gets it after the expiry");
    assert!(taken.token().get() > short_token);
    assert!(taken.acquired_at() >= expires_at);
    eprintln!(
        "does not fit: pglease exited {exited:?} after the crash; the command was stopped {} ms \
         before the database's expiry",
        (expires_at - stop_at).num_milliseconds()
    );
    other.shutdown().await.expect("shutdown");
    Ok(())
}

pglease_formations::tests![run_rides_out_a_failover_that_fits_and_stops_before_the_expiry_when_not(2),];
