//! The comparison's safety part, bounded in time: each verdict is read
//! from the database and must be what these versions do.

use std::time::Duration;

use pglease_peers::{Peer, killed_connection_all};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_lets_advisory_locks_go_and_leases_stay() {
    let verdicts = tokio::time::timeout(Duration::from_secs(120), killed_connection_all())
        .await
        .expect("the scenario ends within 2 minutes")
        .expect("the scenario runs");
    println!("{}", pglease_peers::table(&verdicts));
    for v in &verdicts {
        match v.peer {
            // The lease is in a table: killing a connection loses nothing,
            // nobody else takes over, the holder's checked write is its own.
            Peer::Pglease | Peer::PgLease => {
                assert!(!v.stale_write_applied, "{v:?}");
                assert!(v.took_over.is_none(), "{v:?}");
            }
            // The lock dies with the session: B takes over at once and A,
            // not told, writes after B.
            Peer::DistributedLock | Peer::SqlxAdvisoryLock => {
                assert!(v.stale_write_applied, "{v:?}");
                assert!(v.took_over.is_some(), "{v:?}");
            }
        }
    }
    assert_eq!(verdicts.len(), Peer::ALL.len());
}
