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
        let stale = v.stale_write_applied;
        let took_over = v.took_over.is_some();
        let expected = match (scenario, v.peer) {
            // The check is held until commit, and the takeover ends the
            // stale transaction: B takes over after the TTL, A's commit
            // fails.
            (Scenario::PausedCommit, Peer::Pglease) => (false, true),
            // verify_lease_held holds nothing: B takes over after the TTL
            // and A's commit lands after B's write.
            (Scenario::PausedCommit, Peer::PgLease) => (true, true),
            // The lock lasts as long as A's (frozen) session: no takeover.
            (Scenario::PausedCommit, _) => (false, false),
            // A lease in a table survives a killed connection.
            (Scenario::KilledConnection, Peer::Pglease | Peer::PgLease) => (false, false),
            // The lock dies with the session: B takes over at once and A,
            // not told, writes after B.
            (Scenario::KilledConnection, _) => (true, true),
        };
        assert_eq!((stale, took_over), expected, "{scenario:?}: {v:?}");
    }
}
