//! The demo scenario, (a) for the lease as the engine plays it and the
//! narrator tells it: the paused holder's late write is rejected by the
//! database and its delayed release is ignored.

use std::time::Duration;

use pglease_scenarios::{Narrator, Scenario, Variant};

async fn demo_shows_paused_holder_rejected_by_the_database() {
    let db = crate::common::new_db().await;
    let mut lines = Vec::new();
    let (scenario, variant) = (Scenario::PausedHolder, Variant::Lease);
    let unit = Duration::from_millis(100);
    let narrator = Narrator::new("demo", variant.ttl(scenario, unit), |l: &str| {
        lines.push(l.to_owned())
    });
    pglease_scenarios::play(&db.manager(), scenario, variant, "demo", unit, &narrator)
        .await
        .expect("demo runs");
    drop(narrator);
    let text = lines.join("\n");
    assert!(
        text.contains("worker-A writes under token 1: REJECTED by PostgreSQL (LE001)"),
        "{text}"
    );
    assert!(text.contains("ignored, worker-B still holds it"), "{text}");
    assert!(
        text.ends_with("committed writes: worker-A@1, worker-B@2"),
        "{text}"
    );
    assert!(!db.manager().inspect("demo").await.expect("inspect").held);
}

pglease_formations::tests![demo_shows_paused_holder_rejected_by_the_database,];
