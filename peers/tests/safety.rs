//! The comparison's safety part, bounded in time: each verdict is read
//! from the database and must be what these versions do.

use std::time::Duration;

use pglease_peers::{Judgement, Peer, SCENARIOS, Scenario, Violation, Written, safety};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failures_against_each_peer() {
    let verdicts = tokio::time::timeout(Duration::from_secs(180), safety())
        .await
        .expect("the scenarios end within 3 minutes")
        .expect("the scenarios run");
    println!("{}", pglease_peers::tables(&verdicts));
    assert_eq!(verdicts.len(), SCENARIOS.len() * Peer::ALL.len());
    use Judgement::{NotApplicable, Safe, Violated};
    for v in &verdicts {
        let took_over = v.took_over.is_some();
        // Every peer named in every arm: a new peer does not compile here
        // until its expected verdicts are written down.
        let expected = match (v.scenario, v.contender) {
            // The check is held until commit, and the takeover ends the
            // stale transaction: B takes over after the TTL, A's commit
            // fails.
            (Scenario::PausedHolder, Peer::Pglease) => (Safe, true),
            // verify_lease_held holds nothing: B takes over after the TTL
            // and A's commit lands after B's write.
            (Scenario::PausedHolder, Peer::PgLease) => (Violated(Violation::StaleWrite), true),
            // The lock lasts as long as A's (frozen) session: no takeover.
            (Scenario::PausedHolder, Peer::DistributedLock | Peer::SqlxAdvisoryLock) => {
                (Safe, false)
            }
            // A lease in a table survives a killed connection.
            (Scenario::KilledConnection, Peer::Pglease | Peer::PgLease) => (Safe, false),
            // The lock dies with the session: B takes over at once and A,
            // not told, writes after B (its handle offers no connection to
            // write through).
            (Scenario::KilledConnection, Peer::DistributedLock) => {
                (Violated(Violation::StaleWrite), true)
            }
            // B takes over at once; a write through the guard's own
            // (dead) connection fails.
            (Scenario::KilledConnection, Peer::SqlxAdvisoryLock) => (Safe, true),
            // The late release names the first term's token: nothing.
            (Scenario::LateRelease, Peer::Pglease) => (Safe, false),
            // The late DELETE (by worker id) removes the second term's
            // row; B, trying every 100 ms, gets the lease before A's next
            // heartbeat (every 333 ms) stops A's second term.
            (Scenario::LateRelease, Peer::PgLease) => (Violated(Violation::TwoHolders), true),
            // Their release cannot arrive late through the API.
            (Scenario::LateRelease, Peer::DistributedLock | Peer::SqlxAdvisoryLock) => {
                (NotApplicable(""), false)
            }
            // The holder's renewals time out and it is told before the
            // lease expires in the database, where B then takes it.
            (Scenario::SilentRenewal, Peer::Pglease) => (Safe, true),
            // A heartbeat without an answer never fails: B takes over
            // after the lease duration while A's work goes on, untold.
            (Scenario::SilentRenewal, Peer::PgLease) => (Violated(Violation::TwoHolders), true),
            // The lock stays with the frozen session: no takeover.
            (Scenario::SilentRenewal, Peer::DistributedLock | Peer::SqlxAdvisoryLock) => {
                (Safe, false)
            }
            (
                Scenario::DeadHolder,
                Peer::Pglease | Peer::PgLease | Peer::DistributedLock | Peer::SqlxAdvisoryLock,
            ) => panic!("(c) is not run against the peers: {v:?}"),
        };
        // Not applicable carries its reason: compare the kind only.
        let judgement = match v.judgement {
            NotApplicable(_) => NotApplicable(""),
            j => j,
        };
        assert_eq!((judgement, took_over), expected, "{v:?}");
        // Where the verdict rests on A's write, what became of it.
        let a_committed = match (v.scenario, v.contender) {
            (Scenario::PausedHolder, Peer::Pglease) => Some(false),
            (Scenario::PausedHolder, Peer::PgLease) => Some(true),
            (Scenario::KilledConnection, Peer::DistributedLock) => Some(true),
            (Scenario::KilledConnection, Peer::SqlxAdvisoryLock) => Some(false),
            (Scenario::SilentRenewal, Peer::Pglease) => Some(false),
            _ => None,
        };
        if let Some(committed) = a_committed {
            assert_eq!(
                v.a_wrote.as_ref().map(|w| *w == Written::Committed),
                Some(committed),
                "{v:?}"
            );
        }
    }
}
