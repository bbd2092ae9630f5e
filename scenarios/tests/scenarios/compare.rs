//! The comparison of lease + fencing with advisory locks, run live: every
//! stale write is rejected under leases, and the advisory locks' weaknesses
//! show up where docs/design.md ("Advisory locks, compared") says they do
//! (and their strengths too).

use std::time::Duration;

use pglease_scenarios::{Judgement, Scenario, Variant, Violation, Written};

async fn every_scenario_against_every_variant() {
    let db = crate::common::new_db().await;
    let m = db.manager();
    let outcomes = pglease_scenarios::run(&m, Duration::from_millis(150), |o| {
        eprintln!(
            "{} / {}: safe={} {}",
            o.scenario.label(),
            o.contender.label(),
            o.safe(),
            o.detail
        );
    })
    .await
    .expect("run the comparison");
    assert_eq!(outcomes.len(), 15);
    let outcome = |s: Scenario, v: Variant| {
        outcomes
            .iter()
            .find(|o| o.scenario == s && o.contender == v)
            .expect("every pair ran")
    };

    // Leases: every scenario safe; takeover needs no cooperation but waits
    // for the expiry.
    for s in Scenario::ALL {
        assert!(
            outcome(s, Variant::Lease).safe(),
            "{:?}",
            outcome(s, Variant::Lease)
        );
    }
    for s in [
        Scenario::PausedHolder,
        Scenario::KilledConnection,
        Scenario::DeadHolder,
    ] {
        let took = outcome(s, Variant::Lease).took_over.expect("took over");
        assert!(
            took >= Duration::from_millis(150),
            "{s:?}: before the TTL ({took:?})"
        );
    }

    // The stale writes were refused by the database, not merely late.
    for s in [Scenario::PausedHolder, Scenario::KilledConnection] {
        assert!(
            matches!(
                outcome(s, Variant::Lease).a_wrote,
                Some(Written::Refused(_))
            ),
            "{:?}",
            outcome(s, Variant::Lease)
        );
    }
    // Unanswered renewals: A is told before B takes over (by ending the
    // stalled fenced transaction), and A's new fenced work is refused.
    let silent = outcome(Scenario::SilentRenewal, Variant::Lease);
    match (silent.told, silent.took_over) {
        (Some(told), Some(took)) => assert!(told <= took, "{silent:?}"),
        _ => panic!("told and taken over: {silent:?}"),
    }
    assert!(
        matches!(silent.a_wrote, Some(Written::Refused(_))),
        "{silent:?}"
    );

    // Session advisory lock: a killed connection lets a stale write land, a
    // duplicate unlock frees a newer hold, and nothing stops a holder whose
    // check hangs; a paused holder blocks everyone.
    for s in [
        Scenario::KilledConnection,
        Scenario::LateRelease,
        Scenario::SilentRenewal,
    ] {
        assert!(
            !outcome(s, Variant::SessionLock).safe(),
            "{:?}",
            outcome(s, Variant::SessionLock)
        );
    }
    assert_eq!(
        outcome(Scenario::KilledConnection, Variant::SessionLock).judgement,
        Judgement::Violated(Violation::StaleWrite)
    );
    for s in [Scenario::LateRelease, Scenario::SilentRenewal] {
        assert_eq!(
            outcome(s, Variant::SessionLock).judgement,
            Judgement::Violated(Violation::TwoHolders)
        );
    }
    assert_eq!(
        outcome(Scenario::PausedHolder, Variant::SessionLock).took_over,
        None
    );
    assert!(
        outcome(Scenario::DeadHolder, Variant::SessionLock)
            .took_over
            .is_some()
    );

    // Transaction advisory lock guarding writes in its own transaction:
    // safe in every scenario here, at the price of no expiry.
    for s in Scenario::ALL {
        assert!(
            outcome(s, Variant::XactLock).safe(),
            "{:?}",
            outcome(s, Variant::XactLock)
        );
    }
    assert_eq!(
        outcome(Scenario::PausedHolder, Variant::XactLock).took_over,
        None
    );
    // A paused lock holder blocks everyone, and its write after the pause
    // is the legitimate holder's.
    for v in [Variant::SessionLock, Variant::XactLock] {
        assert_eq!(
            outcome(Scenario::PausedHolder, v).a_wrote,
            Some(Written::Committed),
            "{v:?}"
        );
    }

    // Nothing is left behind.
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'pglease_compare_%'",
    )
    .fetch_one(db.pool())
    .await
    .expect("count tables");
    assert_eq!(tables, 0);
}

pglease_formations::tests![every_scenario_against_every_variant,];
