//! Several hosts in one URL, as libpq takes them, with a primary and a
//! standby (`pglease_formations::Replicated`) and no proxy in front: the
//! primary is chosen whatever the order, a standby is never written to,
//! and a manager follows a promotion by itself.

use std::time::{Duration, Instant};

use crate::common::{
    handed_over_on_release, held_write, migrate_with_data_table, renewed_without_loss,
    token_and_value,
};
use pglease::{AcquireOptions, Error, LeaseManager};
use pglease_formations::{Replicated, SetupError, Standby};

fn url(ports: &[u16], query: &str) -> String {
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!("postgres://postgres@{}/postgres{query}", hosts.join(","))
}

/// Listed first, the standby is passed over (several hosts mean
/// read-write); `primary` does the same. With `any`, as libpq does, the
/// standby is used, and an acquisition fails saying the server is
/// read-only and what to do, without writing anything. One standby alone
/// with read-write is refused at connect, named.
async fn the_primary_is_chosen_whatever_the_order() -> Result<(), SetupError> {
    let pair = Replicated::start(Standby::Synchronous).await?;
    let (primary, standby) = (pair.primary().port(), pair.standby().port());
    LeaseManager::new(pair.primary().pool().await?)
        .migrate()
        .await
        .expect("migrate");
    for query in [
        "",
        "?target_session_attrs=read-write",
        "?target_session_attrs=primary",
    ] {
        let m = LeaseManager::connect(&url(&[standby, primary], query))
            .await
            .expect("connect");
        assert_eq!(
            m.admin().current_host(),
            Some(format!("127.0.0.1:{primary}")),
            "{query}"
        );
        let lease = m
            .acquire("job", AcquireOptions::ttl(Duration::from_secs(5)))
            .await
            .expect("acquire on the primary");
        m.release(&lease).await.expect("release");
        m.shutdown().await.expect("shutdown");
    }
    let any = LeaseManager::connect(&url(&[standby, primary], "?target_session_attrs=any"))
        .await
        .expect("connect with any");
    assert_eq!(
        any.admin().current_host(),
        Some(format!("127.0.0.1:{standby}"))
    );
    let refused = any
        .acquire("job", AcquireOptions::ttl(Duration::from_secs(5)))
        .await
        .expect_err("a standby takes no acquisition");
    assert!(matches!(refused, Error::ReadOnly(_)), "{refused:?}");
    let said = refused.to_string();
    assert!(
        said.contains("25006") && said.contains("read-only"),
        "{said}"
    );
    assert!(said.contains("target_session_attrs=read-write"), "{said}");
    any.shutdown().await.expect("shutdown");
    let alone = LeaseManager::connect(&url(&[standby], "?target_session_attrs=read-write"))
        .await
        .expect_err("the standby alone is not read-write");
    let said = alone.to_string();
    assert!(
        said.contains(&format!("127.0.0.1:{standby}")) && said.contains("standby"),
        "{said}"
    );
    Ok(())
}

/// A held lease follows a promotion with nothing in front of the servers:
/// the primary is killed, the standby promoted by hand, and the manager
/// (URL primary,standby) finds it by itself; the lease is never reported
/// lost, keeps its token, and a fenced write commits on the new primary.
async fn a_held_lease_follows_a_promotion_with_no_proxy() -> Result<(), SetupError> {
    let pair = Replicated::start(Standby::Synchronous).await?;
    let admin = pair.primary().pool().await?;
    migrate_with_data_table(&admin).await;
    admin.close().await;
    let (primary, standby) = (pair.primary().port(), pair.standby().port());
    let leases = LeaseManager::connect(&url(&[primary, standby], ""))
        .await
        .expect("connect");
    let held = leases
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_secs(10)).holder("A"),
        )
        .await
        .expect("hold");
    held_write(&held, "before").await.expect("write before");
    let renewed_before = leases.stats().leases_renewed;
    pair.crash_primary()?;
    let crashed = Instant::now();
    pair.promote().await?;
    let promoted = crashed.elapsed();
    renewed_without_loss(&leases, &held, renewed_before, Duration::from_secs(9)).await;
    let renewed = crashed.elapsed();
    assert_eq!(
        leases.admin().current_host(),
        Some(format!("127.0.0.1:{standby}"))
    );
    held_write(&held, "after")
        .await
        .expect("write on the new primary");
    let (token, value) = token_and_value(&pair.standby().pool().await?, "job").await;
    assert_eq!(token, held.token().get());
    assert_eq!(value, "after");
    // Another client with the same URL cannot have it; released, it can.
    let other = LeaseManager::connect(&url(&[primary, standby], ""))
        .await
        .expect("connect");
    handed_over_on_release(&other, held).await;
    eprintln!(
        "primary killed; promoted after {promoted:?}; first renewal confirmed on the new \
         primary after {renewed:?}; lease never lost"
    );
    Ok(())
}

/// The same over TLS, as a production URL says it: both hosts by the
/// name their certificate carries, `sslmode=verify-full` with the CA's
/// file. The manager follows the promotion, every connection to the new
/// primary verified and encrypted; the lease is never reported lost and
/// keeps its token.
async fn a_held_lease_follows_a_promotion_over_verify_full() -> Result<(), SetupError> {
    let pair = Replicated::start(Standby::Synchronous).await?;
    let ca = pair.serve_tls().await?;
    let admin = pair.primary().pool().await?;
    migrate_with_data_table(&admin).await;
    admin.close().await;
    let (primary, standby) = (pair.primary().port(), pair.standby().port());
    let url = format!(
        "postgres://postgres@localhost:{primary},localhost:{standby}/postgres\
         ?sslmode=verify-full&sslrootcert={}",
        ca.display()
    );
    let leases = LeaseManager::connect(&url).await.expect("connect");
    let held = leases
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_secs(10)).holder("A"),
        )
        .await
        .expect("hold");
    held_write(&held, "before").await.expect("write before");
    let renewed_before = leases.stats().leases_renewed;
    pair.crash_primary()?;
    pair.promote().await?;
    renewed_without_loss(&leases, &held, renewed_before, Duration::from_secs(9)).await;
    assert_eq!(
        leases.admin().current_host(),
        Some(format!("localhost:{standby}"))
    );
    held_write(&held, "after")
        .await
        .expect("write on the new primary");
    let (ssl, port): (bool, i32) = sqlx::query_as(
        "SELECT ssl, current_setting('port')::int FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )
    .fetch_one(leases.pool())
    .await
    .expect("pg_stat_ssl on the new primary");
    assert!(ssl, "the new primary's connection is encrypted");
    assert_eq!(port, i32::from(standby));
    let (token, value) = token_and_value(&pair.standby().pool().await?, "job").await;
    assert_eq!(token, held.token().get());
    assert_eq!(value, "after");
    let other = LeaseManager::connect(&url).await.expect("connect");
    handed_over_on_release(&other, held).await;
    Ok(())
}

pglease_formations::tests![
    the_primary_is_chosen_whatever_the_order(2),
    a_held_lease_follows_a_promotion_with_no_proxy(2),
    a_held_lease_follows_a_promotion_over_verify_full(2),
];
