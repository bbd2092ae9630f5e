//! The comparison's safety part, bounded in time: each verdict is read
//! from the database and must be what these versions do.

use std::time::Duration;

use pglease_peers::{Peer, Scenario, safety};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_articles_failures_against_each_peer() {
    let verdicts = tokio::time::timeout(Duration::from_secs(180), safety())
        .await
        .expect("the scenarios end within 3 minutes")
        .expect("the scenarios run");
    println!("{}", pglease_peers::tables(&verdicts));
    assert_eq!(verdicts.len(), Scenario::ALL.len() * Peer::ALL.len());
    for (scenario, v) in &verdicts {
        let stale = v.violated;
        let took_over = v.took_over.is_some();
        // Every peer named in every arm: a new peer does not compile here
        // until its expected verdicts are written down.
        let expected = match (scenario, v.peer) {
            // The check is held until commit, and the takeover ends the
            // stale transaction: B takes over after the TTL, A's commit
            // fails.
            (Scenario::PausedCommit, Peer::Pglease) => (false, true),
            // verify_lease_held holds nothing: B takes over after the TTL
            // and A's commit lands after B's write.
            (Scenario::PausedCommit, Peer::PgLease) => (true, true),
            // The lock lasts as long as A's (frozen) session: no takeover.
            (Scenario::PausedCommit, Peer::DistributedLock | Peer::SqlxAdvisoryLock) => {
                (false, false)
            }
            // A lease in a table survives a killed connection.
            (Scenario::KilledConnection, Peer::Pglease | Peer::PgLease) => (false, false),
            // The lock dies with the session: B takes over at once and A,
            // not told, writes after B (its handle offers no connection to
            // write through).
            (Scenario::KilledConnection, Peer::DistributedLock) => (true, true),
            // B takes over at once; a write through the guard's own
            // connection fails (a retry through the pool would land).
            (Scenario::KilledConnection, Peer::SqlxAdvisoryLock) => (false, true),
            // The late release names the first term's token: nothing.
            (Scenario::LateRelease, Peer::Pglease) => (false, false),
            // The late DELETE (by worker id) removes the second term's
            // row; B, trying every 100 ms, gets the lease before A's next
            // heartbeat (every 333 ms) stops A's second term.
            (Scenario::LateRelease, Peer::PgLease) => (true, true),
            // Their release cannot arrive late through the API.
            (Scenario::LateRelease, Peer::DistributedLock | Peer::SqlxAdvisoryLock) => {
                (false, false)
            }
            // The holder's renewals time out and it is told before the
            // lease expires in the database, where B then takes it.
            (Scenario::SilentRenewal, Peer::Pglease) => (false, true),
            // A heartbeat without an answer never fails: B takes over
            // after the lease duration while A's work goes on, untold.
            (Scenario::SilentRenewal, Peer::PgLease) => (true, true),
            // The lock stays with the frozen session: no takeover.
            (Scenario::SilentRenewal, Peer::DistributedLock | Peer::SqlxAdvisoryLock) => {
                (false, false)
            }
        };
        assert_eq!((stale, took_over), expected, "{scenario:?}: {v:?}");
    }
}
