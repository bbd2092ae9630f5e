//! The demo scenario: the paused holder's late write is rejected by the
//! database and its delayed release is ignored.

use std::time::Duration;

async fn demo_shows_paused_holder_rejected_by_the_database() {
    let db = crate::common::new_db().await;
    let mut lines = Vec::new();
    pglease_cli::demo::paused_holder(&db.manager(), "demo", Duration::from_millis(100), |l| {
        lines.push(l.to_owned())
    })
    .await
    .expect("demo runs");
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

tests![demo_shows_paused_holder_rejected_by_the_database,];
