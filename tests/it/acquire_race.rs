//! Many tasks racing for one name: exactly one winner per round, and tokens
//! strictly increasing across rounds, whether the lease was released,
//! expired, or never acquired before.

use std::sync::Arc;
use std::time::Duration;

use crate::common::TestDb;
use pglease::{AcquireOptions, Error, Lease, LeaseManager};
use tokio::sync::Barrier;

const RACERS: usize = 8;
const ROUNDS: usize = 12;

/// `RACERS` tasks released at once by a barrier, each trying to acquire
/// `name`; returns the winners (failing on anything but `Held`).
async fn race(m: &LeaseManager, name: &str, ttl: Duration, what: &str) -> Vec<Lease> {
    let barrier = Arc::new(Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let (m, barrier, name) = (m.clone(), barrier.clone(), name.to_owned());
            tokio::spawn(async move {
                barrier.wait().await;
                m.acquire(
                    &name,
                    AcquireOptions::ttl(ttl).holder(format!("worker-{i}")),
                )
                .await
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.expect("racer task") {
            Ok(lease) => winners.push(lease),
            Err(Error::Held { .. }) => {}
            Err(e) => panic!("{what}: unexpected error {e}"),
        }
    }
    winners
}

async fn racing_acquirers_have_one_winner_per_round_and_increasing_tokens() {
    let db = TestDb::new().await;
    let m = db.manager();
    let mut last_token = 0;
    let mut last_expiry = None;
    for round in 0..ROUNDS {
        // Odd rounds hand over by expiry, the others by release (and round
        // 0 races to create the row).
        if let Some(expiry) = last_expiry.take() {
            db.wait_until(expiry).await;
        }
        let ttl = if round % 2 == 1 {
            Duration::from_millis(150)
        } else {
            Duration::from_secs(600)
        };
        let mut winners = race(&m, "hot", ttl, &format!("round {round}")).await;
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let winner = winners.remove(0);
        assert!(
            winner.token() > last_token,
            "round {round}: token {} after {last_token}",
            winner.token()
        );
        last_token = winner.token().get();
        let status = m.inspect("hot").await.expect("inspect");
        assert_eq!(status.token, Some(winner.token()));
        assert_eq!(status.holder.as_deref(), Some(winner.holder()));
        if round % 2 == 1 {
            last_expiry = Some(winner.expires_at());
        } else {
            assert!(
                m.release(&crate::common::fence("hot", winner.token()))
                    .await
                    .expect("release")
            );
        }
    }
}

/// Losers of a race for a held lease draw no token: the sequence advances
/// once per successful acquisition only.
async fn failed_attempts_on_a_held_lease_issue_no_token() {
    let db = TestDb::new().await;
    let m = db.manager();
    let lease = m
        .acquire(
            "hot",
            AcquireOptions::ttl(Duration::from_secs(600)).holder("owner"),
        )
        .await
        .expect("acquire");
    let barrier = Arc::new(Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let m = m.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                for _ in 0..20 {
                    let attempt = m
                        .acquire(
                            "hot",
                            AcquireOptions::ttl(Duration::from_secs(1)).holder(format!("w{i}")),
                        )
                        .await;
                    assert!(matches!(attempt, Err(Error::Held { .. })), "{attempt:?}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("attempts");
    }
    let next = m.admit("probe", crate::common::token(1)).await;
    assert!(next.is_ok());
    let last_value: i64 = sqlx::query_scalar("SELECT last_value FROM pglease.fence_seq")
        .fetch_one(db.pool())
        .await
        .expect("sequence");
    assert_eq!(last_value, lease.token(), "a failed attempt drew a token");
}

/// Racers creating brand-new names at once: before creators took turns,
/// two speculative inserts and the winner's key update could deadlock
/// (about one attempt in 400 under this load).
async fn racing_first_acquisitions_of_new_names_never_deadlock() {
    const NAMES: usize = 60;
    let db = TestDb::new().await;
    let m = db.manager();
    for n in 0..NAMES {
        let winners = race(&m, &format!("new-{n}"), LONG_TTL, &format!("name {n}")).await;
        assert_eq!(winners.len(), 1, "name {n}");
    }
}

/// Contenders that acquire and release one name as fast as they can: an
/// attempt that loses to another's acquisition is told the lease is held,
/// never that it has ended but is pinned (the winner may have released it
/// again by the time the loser's answer is written); every token is issued
/// once; the lease ends free.
async fn contenders_cycling_on_one_name_are_told_held_never_pinned() {
    const ATTEMPTS: usize = 250;
    let db = TestDb::new().await;
    let m = db.manager();
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let m = m.clone();
            tokio::spawn(async move {
                let mut tokens = Vec::new();
                for _ in 0..ATTEMPTS {
                    match m
                        .acquire(
                            "cycled",
                            AcquireOptions::ttl(LONG_TTL).holder(format!("worker-{i}")),
                        )
                        .await
                    {
                        Ok(lease) => {
                            tokens.push(lease.token().get());
                            assert!(m.release(&lease).await.expect("release"), "released");
                        }
                        Err(Error::Held { .. }) => {}
                        Err(e) => panic!("worker {i}: unexpected error {e}"),
                    }
                }
                tokens
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for task in tasks {
        tokens.extend(task.await.expect("contender task"));
    }
    let issued = tokens.len();
    assert!(issued > 0, "nobody acquired");
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), issued, "a token was issued twice");
    let status = m.inspect("cycled").await.expect("inspect");
    assert_eq!(status.holder, None, "the lease ends free");
}

const LONG_TTL: Duration = Duration::from_secs(600);

pglease_formations::tests![
    racing_acquirers_have_one_winner_per_round_and_increasing_tokens(4),
    failed_attempts_on_a_held_lease_issue_no_token(4),
    racing_first_acquisitions_of_new_names_never_deadlock(4),
    contenders_cycling_on_one_name_are_told_held_never_pinned(4),
];
