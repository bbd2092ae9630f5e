//! A server that forgot commits: a failover to an asynchronous standby
//! that had fallen behind, a restore from a base backup to a point in
//! time, a crash with asynchronous commit. Each checks the three
//! properties: no token is handed out twice and no stale holder's write,
//! renewal or release succeeds (safety); the lease is granted on the new
//! server at once, or when the grant delay ends (liveness); a holder the
//! server forgot is told so with a reason of its own.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::common::{
    data_row, everything_refused, fenced_write, migrate_with_data_table, told_forgotten,
};
use pglease::history::Event;
use pglease::{AcquireOptions, Error, LeaseManager, sqlx};
use pglease_formations::{Replicated, SetupError, Standby};

fn ttl(secs: u64) -> AcquireOptions {
    AcquireOptions::ttl(Duration::from_secs(secs))
}

/// `count` acquire/release cycles of `name`; the tokens acknowledged.
async fn cycles(leases: &LeaseManager, name: &str, count: usize) -> Vec<i64> {
    let mut tokens = Vec::with_capacity(count);
    for _ in 0..count {
        let lease = leases
            .acquire(name, ttl(60).holder("burner"))
            .await
            .expect("a cycle's acquisition");
        tokens.push(lease.token().get());
        assert!(leases.release(&lease).await.expect("a cycle's release"));
    }
    tokens
}

/// The reproduction: an asynchronous standby is stopped, the
/// primary goes on alone (100 cycles of another lease, then holder A
/// acquires `victim` and writes under it), every process of the primary is
/// killed and the standby promoted. Busy service B then acquires and
/// releases `victim` 100 times on the new primary: none of its tokens is
/// one the old primary acknowledged, and A's prepared write, renewal,
/// value, release and high-water mark under its token are all refused,
/// with the new reason. A, holding `victim` through a multi-host URL, is
/// told by its first renewal on the new primary.
async fn a_failover_to_an_asynchronous_standby_never_hands_a_token_out_twice()
-> Result<(), SetupError> {
    let pair = Replicated::start(Standby::Asynchronous).await?;
    let admin = pair.primary().pool().await?;
    migrate_with_data_table(&admin).await;
    let old = LeaseManager::new(admin.clone());
    let mut acknowledged = cycles(&old, "burn", 3).await;
    pair.wait_for_replay().await?;
    pair.stop_standby(true)?;

    // A's manager knows both hosts and follows the primary.
    let url = format!(
        "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?connect_timeout=2",
        pair.primary().port(),
        pair.standby().port()
    );
    let a = LeaseManager::connect(&url).await.expect("A connects");
    acknowledged.extend(cycles(&old, "burn", 100).await);
    let held = a
        .hold("victim", ttl(20).holder("A"))
        .await
        .expect("A acquires victim");
    let stale = held.as_ref().clone();
    acknowledged.push(stale.token().get());
    fenced_write(&a, "victim", stale.token(), "A")
        .await
        .expect("A's write on the old primary");
    let highest = *acknowledged.iter().max().expect("tokens");

    pair.crash_primary()?;
    pair.stop_standby(false)?;
    let crashed = Instant::now();
    pair.promote().await?;
    let new_admin = pair.standby().pool().await?;
    // The price of asynchronous replication, counted rather than hidden:
    // the acknowledged acquisitions the new primary has no row of.
    let kept: i64 = sqlx::query_scalar("SELECT max(token) FROM pglease.leases")
        .fetch_one(&new_admin)
        .await
        .map_err(|e| SetupError::Server(e.to_string()))?;
    let lost = acknowledged.iter().filter(|t| **t > kept).count();
    let b = LeaseManager::new(new_admin.clone());
    let first = b
        .acquire("victim", ttl(60).holder("B"))
        .await
        .expect("B acquires victim on the new primary");
    let granted = crashed.elapsed();
    assert!(b.release(&first).await.expect("release"));
    let mut issued = vec![first.token().get()];
    issued.extend(cycles(&b, "victim", 99).await);
    let after: HashSet<i64> = issued.iter().copied().collect();
    assert_eq!(after.len(), issued.len(), "a token issued twice");
    assert!(
        issued.iter().all(|t| *t > highest),
        "the new primary issued again a token the old one acknowledged: {issued:?} (highest \
         acknowledged {highest})"
    );
    let changes = b
        .admin()
        .timeline_changes()
        .await
        .expect("timeline changes");
    let change = changes.last().expect("a change of timeline recorded");
    eprintln!(
        "{} acquisitions acknowledged by the old primary, {lost} of them lost (the new primary \
         kept tokens up to {kept}, its sequence was at {}); tokens continue above {}; B granted \
         {granted:?} after the crash",
        acknowledged.len(),
        change.seen,
        change.floor,
    );
    assert_eq!(lost, 101, "the standby was not behind as it should be");
    assert_eq!(change.timeline, change.previous.expect("previous") + 1);
    assert!(change.floor > highest && change.declared.is_none());

    let b_holds = b
        .acquire("victim", ttl(3600).holder("B"))
        .await
        .expect("B holds victim");
    fenced_write(&b, "victim", b_holds.token(), "B")
        .await
        .expect("B's write");
    assert!(
        b.admit("store", b_holds.token())
            .await
            .expect("B's high-water mark")
    );
    everything_refused(&b, &stale, change.timeline).await;
    assert_eq!(
        data_row(&new_admin).await,
        ("B".to_owned(), Some(b_holds.token().get()))
    );

    // A, following the primary, learns it from its next renewal there.
    told_forgotten(&a, &held, change.timeline).await;
    // The change is in every lease's history, and in doctor.
    let history = b.history("victim", None).await.expect("history");
    let event = history
        .iter()
        .find(|t| t.event == Event::TimelineChanged)
        .expect("the change in victim's history");
    assert_eq!(event.token.get(), change.floor);
    let diagnosis = b
        .admin()
        .doctor(&pglease::doctor::DoctorOptions::default())
        .await
        .expect("doctor");
    let timeline = diagnosis
        .checks
        .iter()
        .find(|c| c.name == "timeline")
        .expect("a timeline check");
    assert!(
        timeline
            .detail
            .contains(&format!("tokens continue above {}", change.floor)),
        "{}",
        timeline.detail
    );
    a.shutdown().await.expect("shutdown");
    Ok(())
}

/// With `synchronous_commit = off` on the server (and a WAL writer that
/// waits 10 s), a renewal that was acknowledged is on disk when the server
/// crashes right after it: the lease runs to the renewed expiry after the
/// restart, for one renewal and for the background renewal of a held
/// lease. The crash restart stays on the same timeline and moves no fence.
async fn an_acknowledged_renewal_survives_a_crash_with_asynchronous_commit()
-> Result<(), SetupError> {
    let pair = Replicated::start(Standby::Asynchronous).await?;
    let admin = pair.primary().pool().await?;
    migrate_with_data_table(&admin).await;
    for statement in [
        "ALTER SYSTEM SET synchronous_commit = off",
        "ALTER SYSTEM SET wal_writer_delay = '10s'",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::query(statement)
            .execute(&admin)
            .await
            .map_err(|e| SetupError::Server(format!("{statement}: {e}")))?;
    }
    admin.close().await;
    let leases = LeaseManager::new(pair.primary().pool().await?);
    let lease = leases.acquire("renewed", ttl(60)).await.expect("acquire");
    let held = leases.hold("held", ttl(60)).await.expect("hold");
    let before = leases.stats().leases_renewed;
    leases.faults().renew_now();
    while leases.stats().leases_renewed == before {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let held_until = held.expires_at();
    let renewed_until = leases
        .renew(&lease, Duration::from_secs(600))
        .await
        .expect("renew");
    // At once: nothing else commits in between.
    pair.crash_primary()?;
    drop(held);
    leases.pool().close().await;
    pair.restart_primary()?;

    let after = LeaseManager::new(pair.primary().pool().await?);
    let found = |name: &'static str| {
        let after = after.clone();
        async move {
            after
                .inspect(name)
                .await
                .expect("inspect")
                .expires_at
                .expect("an expiry")
        }
    };
    assert_eq!(
        found("renewed").await,
        renewed_until,
        "the renewal was lost"
    );
    assert!(
        found("held").await >= held_until,
        "the background renewal was lost"
    );
    // Same timeline: nothing changed but the check.
    let next = after.acquire("next", ttl(60)).await.expect("acquire after");
    assert!(
        after
            .admin()
            .timeline_changes()
            .await
            .expect("changes")
            .is_empty()
    );
    assert!(
        next.token().get() < 1_000,
        "the fence moved: {}",
        next.token()
    );
    Ok(())
}

/// An administrator's grant delay: after the failover, no lease is granted
/// until it ends, with the reason and the time; a lease the new server
/// knows is renewed meanwhile; a waiting acquisition gets its lease once
/// the delay is over, not before.
async fn the_grant_delay_holds_new_grants_and_lets_known_leases_renew() -> Result<(), SetupError> {
    let pair = Replicated::start(Standby::Asynchronous).await?;
    let admin = pair.primary().pool().await?;
    migrate_with_data_table(&admin).await;
    sqlx::query("SELECT pglease.set_grant_delay('3 s')")
        .execute(&admin)
        .await
        .map_err(|e| SetupError::Server(e.to_string()))?;
    let old = LeaseManager::new(admin.clone());
    let known = old
        .acquire("known", ttl(600).holder("K"))
        .await
        .expect("known");
    pair.wait_for_replay().await?;
    pair.crash_primary()?;
    pair.promote().await?;

    let new = LeaseManager::new(pair.standby().pool().await?);
    let until = match new.acquire("fresh", ttl(60)).await {
        Err(Error::GrantDelayed { until, reason, .. }) => {
            assert!(reason.contains("grant delay"), "{reason}");
            until
        }
        other => panic!("acquired during the grant delay: {other:?}"),
    };
    new.renew(&known, Duration::from_secs(600))
        .await
        .expect("the known lease renews during the delay");
    let waited = new
        .acquire("fresh", ttl(60).wait(Duration::from_secs(20)))
        .await
        .expect("granted once the delay is over");
    assert!(
        waited.acquired_at() >= until,
        "granted at {} before the delay's end {until}",
        waited.acquired_at()
    );
    let change = new.admin().timeline_changes().await.expect("changes");
    assert_eq!(change.last().and_then(|c| c.grant_after), Some(until));
    Ok(())
}

/// A base backup restored to a point in time ends on a new timeline:
/// holder A, which acquired after that point, is refused with the new
/// reason, and B's acquisition of the same lease gets a token above every
/// token the old server issued.
async fn a_restore_to_a_point_in_time_moves_the_fence() -> Result<(), SetupError> {
    let pair = Replicated::start_archiving(Standby::Asynchronous).await?;
    let admin = pair.primary().pool().await?;
    migrate_with_data_table(&admin).await;
    let old = LeaseManager::new(admin.clone());
    let backup = pair.base_backup()?;
    let mut acknowledged = cycles(&old, "burn", 20).await;
    pair.restore_point("before-victim").await?;
    acknowledged.extend(cycles(&old, "burn", 20).await);
    let a = old
        .acquire("victim", ttl(3600).holder("A"))
        .await
        .expect("A acquires");
    fenced_write(&old, "victim", a.token(), "A")
        .await
        .expect("A's write");
    acknowledged.push(a.token().get());
    pair.crash_primary()?;

    let restored = pair.restore(&backup, "before-victim").await?;
    let pool = restored.node().pool().await?;
    let b = LeaseManager::new(pool.clone());
    // Before anything has drawn a token here (so before the change is
    // checked and recorded), A is refused with the new reason already.
    let timeline: i64 = sqlx::query_scalar("SELECT pglease.server_timeline()")
        .fetch_one(&pool)
        .await
        .map_err(|e| SetupError::Server(e.to_string()))?;
    everything_refused(&b, a.fence(), timeline).await;
    let b_holds = b
        .acquire("victim", ttl(3600).holder("B"))
        .await
        .expect("B acquires on the restored server");
    let highest = *acknowledged.iter().max().expect("tokens");
    assert!(b_holds.token().get() > highest, "token issued again");
    let change = b.admin().timeline_changes().await.expect("changes");
    let change = change.last().expect("a change recorded");
    eprintln!(
        "restored to the point: timeline {:?} -> {}, the server knew tokens up to {}, {} \
         acknowledged above it; B's token {}",
        change.previous,
        change.timeline,
        change.seen,
        acknowledged.iter().filter(|t| **t > change.seen).count(),
        b_holds.token()
    );
    assert_eq!(change.timeline, timeline);
    everything_refused(&b, a.fence(), change.timeline).await;
    assert_eq!(data_row(&pool).await.0, "initial");
    Ok(())
}

/// A rollback the server cannot see (a file-system snapshot) is declared
/// by an administrator: the fence moves as for a change of timeline; a
/// lease the server knows stays valid and its holder may still use a
/// high-water mark; a stale token of before is refused there; an
/// application role may not declare one.
async fn a_declared_rollback_moves_the_fence() {
    let db = crate::common::TestDb::new().await;
    let leases = db.manager();
    let stale = leases.acquire("job", ttl(60)).await.expect("acquire");
    leases.release(&stale).await.expect("release");
    let current = leases.acquire("job", ttl(60)).await.expect("again");
    let floor: i64 = sqlx::query_scalar("SELECT pglease.restored('snapshot of this morning')")
        .fetch_one(db.pool())
        .await
        .expect("declare");
    assert!(floor > current.token().get());
    let fresh = leases.acquire("other", ttl(60)).await.expect("fresh");
    assert!(fresh.token().get() > floor);
    leases
        .renew(&current, Duration::from_secs(60))
        .await
        .expect("the known lease renews");
    assert!(leases.admit("store", current.token()).await.expect("admit"));
    assert!(
        !leases
            .admit("store-2", stale.token())
            .await
            .expect("admit stale")
    );
    let change = leases.admin().timeline_changes().await.expect("changes");
    assert_eq!(
        change.last().and_then(|c| c.declared.clone()).as_deref(),
        Some("snapshot of this morning")
    );
    // Granted EXECUTE or not, an application role may not.
    let roles = db.login_roles(&["app"], &[]).await;
    db.execute(&[format!(
        "GRANT EXECUTE ON FUNCTION pglease.restored(text) TO {}",
        roles[0]
    )])
    .await;
    let mut app = db.connect_as(&roles[0]).await;
    let refused = sqlx::query("SELECT pglease.restored('me too')")
        .execute(&mut app)
        .await
        .expect_err("an application role may not declare a rollback");
    assert_eq!(
        Error::from(refused).sqlstate(),
        Some(pglease::sqlstate::NOT_PERMITTED)
    );
}

pglease_formations::tests![
    a_failover_to_an_asynchronous_standby_never_hands_a_token_out_twice(2),
    an_acknowledged_renewal_survives_a_crash_with_asynchronous_commit(2),
    the_grant_delay_holds_new_grants_and_lets_known_leases_renew(2),
    a_restore_to_a_point_in_time_moves_the_fence(2),
    a_declared_rollback_moves_the_fence,
];
