//! Renew and release are keyed on the token of one acquisition: stale,
//! delayed or duplicated requests change nothing, also when the holder
//! name is reused.

use std::time::Duration;

use crate::common::TestDb;
use pglease::{AcquireOptions, Error, Lease, LeaseManager, LossReason};

const LONG: Duration = Duration::from_secs(600);

/// `holder` acquires "job", releases it and acquires it again: the first
/// acquisition and the second.
async fn reacquired(m: &LeaseManager, holder: &str) -> (Lease, Lease) {
    let first = m
        .acquire("job", AcquireOptions::ttl(LONG).holder(holder))
        .await
        .expect("first acquisition");
    assert!(m.release(&first).await.expect("release"));
    let second = m
        .acquire("job", AcquireOptions::ttl(LONG).holder(holder))
        .await
        .expect("second acquisition");
    assert!(second.token() > first.token());
    (first, second)
}

async fn same_holder_delayed_release_cannot_end_new_lease() {
    let db = TestDb::new().await;
    let m = db.manager();
    let (first, second) = reacquired(&m, "B").await;

    let before = db.state().await;
    // The delayed duplicate of the first release arrives now.
    assert!(
        !m.release(&crate::common::fence("job", first.token()))
            .await
            .expect("delayed release")
    );
    assert_eq!(
        db.state().await,
        before,
        "a stale release changed the lease"
    );
    let status = m.inspect("job").await.expect("inspect");
    assert!(status.held);
    assert_eq!(status.token, Some(second.token()));
    assert_eq!(status.holder.as_deref(), Some("B"));
}

async fn stale_renew_is_lost_and_changes_nothing() {
    let db = TestDb::new().await;
    let m = db.manager();
    let (first, second) = reacquired(&m, "A").await;

    let before = db.state().await;
    match m
        .renew(&crate::common::fence("job", first.token()), LONG)
        .await
    {
        Err(Error::Lost {
            name,
            token,
            reason,
        }) => {
            assert_eq!(name, "job");
            assert_eq!(token, first.token());
            assert_eq!(
                reason,
                LossReason::Stale {
                    current_token: Some(second.token()),
                    current_holder: Some("A".to_owned()),
                }
            );
        }
        other => panic!("a stale renewal must report the lease lost, got {other:?}"),
    }
    assert_eq!(
        db.state().await,
        before,
        "a stale renewal changed the lease"
    );
    m.renew(&crate::common::fence("job", second.token()), LONG)
        .await
        .expect("current token renews");
}

async fn duplicate_release_is_harmless() {
    let db = TestDb::new().await;
    let m = db.manager();
    let lease = m
        .acquire("job", AcquireOptions::ttl(LONG).holder("A"))
        .await
        .expect("acquire");
    assert!(
        m.release(&crate::common::fence("job", lease.token()))
            .await
            .expect("release")
    );
    let before = db.state().await;
    assert!(
        !m.release(&crate::common::fence("job", lease.token()))
            .await
            .expect("duplicate release")
    );
    assert_eq!(db.state().await, before);
    let status = m.inspect("job").await.expect("inspect");
    assert!(!status.held);
    assert_eq!(status.holder, None);
    assert_eq!(status.remaining, None);
    assert_eq!(status.token, Some(lease.token()));
}

async fn unexpired_lease_is_not_reentrant() {
    let db = TestDb::new().await;
    let m = db.manager();
    let lease = m
        .acquire("job", AcquireOptions::ttl(LONG).holder("A"))
        .await
        .expect("acquire");
    let before = db.state().await;
    for who in ["A", "B"] {
        match m
            .acquire("job", AcquireOptions::ttl(LONG).holder(who))
            .await
        {
            Err(Error::Held {
                holder, expires_at, ..
            }) => {
                assert_eq!(holder, "A");
                assert_eq!(expires_at, lease.expires_at());
            }
            other => panic!("{who} acquired a held lease: {other:?}"),
        }
    }
    // No token was drawn and nothing was written by the failed attempts.
    assert_eq!(db.state().await, before);
}

async fn release_and_renew_after_expiry_change_nothing() {
    let db = TestDb::new().await;
    let m = db.manager();
    let lease = m
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_millis(200)).holder("A"),
        )
        .await
        .expect("acquire");
    db.wait_until(lease.expires_at()).await;

    let before = db.state().await;
    assert!(
        !m.release(&crate::common::fence("job", lease.token()))
            .await
            .expect("release after expiry")
    );
    assert!(matches!(
        m.renew(&crate::common::fence("job", lease.token()), LONG)
            .await,
        Err(Error::Lost { .. })
    ));
    assert_eq!(db.state().await, before);
    let status = m.inspect("job").await.expect("inspect");
    assert!(!status.held);
    assert_eq!(status.holder.as_deref(), Some("A"), "expired, not released");
}

async fn takeover_after_expiry_issues_larger_token_and_fences_old_holder() {
    let db = TestDb::new().await;
    let m = db.manager();
    let old = m
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_millis(200)).holder("A"),
        )
        .await
        .expect("A acquires");
    db.wait_until(old.expires_at()).await;
    let new = m
        .acquire("job", AcquireOptions::ttl(LONG).holder("B"))
        .await
        .expect("B takes over");
    assert!(new.token() > old.token());
    assert!(
        !m.release(&crate::common::fence("job", old.token()))
            .await
            .expect("old release")
    );
    assert!(matches!(
        m.renew(&crate::common::fence("job", old.token()), LONG)
            .await,
        Err(Error::Lost { .. })
    ));
    assert!(m.inspect("job").await.expect("inspect").held);
}

async fn renew_moves_expiry_on_database_clock() {
    let db = TestDb::new().await;
    let m = db.manager();
    let lease = m
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_secs(5)).holder("A"),
        )
        .await
        .expect("acquire");
    let before = db.now().await;
    let expiry = m
        .renew(
            &crate::common::fence("job", lease.token()),
            Duration::from_secs(60),
        )
        .await
        .expect("renew");
    let after = db.now().await;
    assert!(expiry >= before + chrono::TimeDelta::seconds(60));
    assert!(expiry <= after + chrono::TimeDelta::seconds(60));
    let status = m.inspect("job").await.expect("inspect");
    assert_eq!(status.expires_at, Some(expiry));
    let remaining = status.remaining.expect("held lease has time left");
    assert!(remaining > Duration::from_secs(55) && remaining <= Duration::from_secs(60));
}

async fn never_acquired_lease_reports_no_holder() {
    let db = TestDb::new().await;
    let m = db.manager();
    let status = m.inspect("nothing").await.expect("inspect");
    assert_eq!(status.holder, None);
    assert_eq!(status.token, None);
    assert!(!status.held);
    // A token of a name never acquired was never issued for it: refused
    // as such, not as a lease that ended.
    assert!(matches!(
        m.release(&crate::common::fence("nothing", 1)).await,
        Err(Error::NotHeld {
            reason: pglease::NotHeldReason::NeverAcquired,
            ..
        })
    ));
    assert!(matches!(
        m.renew(&crate::common::fence("nothing", 1), LONG).await,
        Err(Error::NotHeld {
            reason: pglease::NotHeldReason::NeverAcquired,
            ..
        })
    ));
    assert!(
        m.list(&pglease::ListFilter::default())
            .await
            .expect("list")
            .is_empty()
    );
}

pglease_formations::tests![
    same_holder_delayed_release_cannot_end_new_lease,
    stale_renew_is_lost_and_changes_nothing,
    duplicate_release_is_harmless,
    unexpired_lease_is_not_reentrant,
    release_and_renew_after_expiry_change_nothing,
    takeover_after_expiry_issues_larger_token_and_fences_old_holder,
    renew_moves_expiry_on_database_clock,
    never_acquired_lease_reports_no_holder,
];
