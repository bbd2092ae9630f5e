//! The metrics recorded through the `metrics` facade, read back with a
//! debugging recorder: acquisitions by outcome, renewals, the held-leases
//! and waiters gauges, a lease's end by reason, and the takeover delay.
//! The recorder is this test's own (a thread-local default recorder: the
//! test's runtime, and so every task of the managers it builds, runs on
//! one thread), so other tests of the binary running meanwhile do not
//! count.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::{TestDb, poll_until};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use pglease::{AcquireOptions, ManagerOptions, RenewalHealth};

const BOUND: Duration = Duration::from_secs(10);

/// Adds what was recorded since the last call to `totals`:
/// name{label=value,...} → counter or gauge value, or histogram count. The
/// debugging recorder hands out each value once (a snapshot resets it,
/// gauges too), so the sums are the totals.
fn take(snapshotter: &Snapshotter, totals: &mut HashMap<String, f64>) {
    for (name, value) in snapshot(snapshotter) {
        *totals.entry(name).or_default() += value;
    }
}

fn snapshot(snapshotter: &Snapshotter) -> Vec<(String, f64)> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let name = if labels.is_empty() {
                key.key().name().to_owned()
            } else {
                format!("{}{{{}}}", key.key().name(), labels.join(","))
            };
            let value = match value {
                DebugValue::Counter(c) => c as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(h) => h.len() as f64,
            };
            (name, value)
        })
        .collect()
}

async fn operations_are_counted_through_the_metrics_facade() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    // Every name recorded is documented.
    let documented: Vec<&str> = pglease::telemetry::METRICS.iter().map(|m| m.0).collect();

    let db = TestDb::new().await;
    let holder = db.manager_with("holder", ManagerOptions::default()).await;
    let held = holder
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_millis(600)).holder("a"),
        )
        .await
        .expect("hold");
    let waiter = db.manager_with("waiter", ManagerOptions::default()).await;
    assert!(
        waiter
            .acquire("job", AcquireOptions::ttl(Duration::from_secs(5)))
            .await
            .is_err()
    );
    let mut seen = HashMap::new();
    poll_until("a renewal", BOUND, || {
        take(&snapshotter, &mut seen);
        let renewed = seen.get("pglease_renewals_total").copied().unwrap_or(0.0);
        async move { renewed >= 1.0 }
    })
    .await;
    assert_eq!(seen["pglease_leases_held"], 1.0, "{seen:?}");
    assert!(seen["pglease_acquire_attempts_total{outcome=held}"] >= 1.0);
    assert!(seen["pglease_renewal_statements_total"] >= 1.0);

    // A waiter; then an administrator forces the lease: the holder's next
    // renewal finds its token stale, and the waiter acquires.
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .acquire(
                    "job",
                    AcquireOptions::ttl(Duration::from_secs(5)).wait(BOUND),
                )
                .await
        })
    };
    poll_until("the waiter waits", BOUND, || async {
        waiter.stats().waiting == 1
    })
    .await;
    take(&snapshotter, &mut seen);
    assert_eq!(seen["pglease_acquirers_waiting"], 1.0);
    db.manager()
        .admin()
        .force_release("job", "metrics test")
        .await
        .expect("force");
    let reason = tokio::time::timeout(BOUND, held.lost())
        .await
        .expect("lost");
    assert!(
        matches!(reason, pglease::LossReason::Stale { .. }),
        "{reason:?}"
    );
    let got = waiting.await.expect("task").expect("the waiter acquires");
    // Counted by the renewal task, which may still be on its way when the
    // holder's `lost()` returns.
    poll_until("the stale end counted", BOUND, || {
        take(&snapshotter, &mut seen);
        let ends = seen
            .get("pglease_lease_ends_total{reason=stale}")
            .copied()
            .unwrap_or(0.0);
        async move { ends >= 1.0 }
    })
    .await;
    assert_eq!(seen["pglease_lease_ends_total{reason=stale}"], 1.0);
    assert!(seen["pglease_acquisitions_total{outcome=acquired}"] >= 2.0);
    assert!(seen["pglease_acquire_seconds"] >= 2.0);
    assert_eq!(seen["pglease_acquirers_waiting"], 0.0);
    drop(held);
    poll_until("the held gauge back to zero", BOUND, || {
        take(&snapshotter, &mut seen);
        let held = seen.get("pglease_leases_held").copied().unwrap_or(0.0);
        async move { held == 0.0 }
    })
    .await;

    // The takeover delay: a waiter that saw the holder's expiry.
    let short = holder
        .acquire(
            "short",
            AcquireOptions::ttl(Duration::from_millis(300)).holder("a"),
        )
        .await
        .expect("acquire short");
    drop(short); // a plain lease, never renewed nor released: it expires
    waiter
        .acquire(
            "short",
            AcquireOptions::ttl(Duration::from_secs(5)).wait(BOUND),
        )
        .await
        .expect("taken over");
    take(&snapshotter, &mut seen);
    assert!(seen["pglease_takeover_delay_seconds"] >= 1.0, "{seen:?}");
    // A set that waited out a holder counts its takeover as one lease does.
    let short = holder
        .acquire(
            "short-set",
            AcquireOptions::ttl(Duration::from_millis(300)).holder("a"),
        )
        .await
        .expect("acquire short-set");
    drop(short);
    let set = waiter
        .acquire_all(
            &["short-set", "beside"],
            AcquireOptions::ttl(Duration::from_secs(5)).wait(BOUND),
        )
        .await
        .expect("the set taken over");
    take(&snapshotter, &mut seen);
    assert!(seen["pglease_takeover_delay_seconds"] >= 2.0, "{seen:?}");
    for lease in &set {
        waiter.release(lease).await.expect("release the set");
    }
    for name in seen.keys() {
        let bare = name.split('{').next().unwrap_or(name);
        assert!(
            documented.contains(&bare),
            "{bare} is not in pglease::telemetry::METRICS"
        );
    }
    waiter.release(&got).await.expect("release");
}

/// Renewals that fail (as during a failover) and then succeed again are
/// said by the held lease (`renewal_health`, and its change for a
/// `select!`) and counted once each way, with the outage's length; the
/// lease is kept.
async fn failing_and_recovered_renewals_are_said_and_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let db = TestDb::new().await;
    let manager = db.manager_with("holder", ManagerOptions::default()).await;
    let held = manager
        .hold("job", AcquireOptions::ttl(Duration::from_secs(30)))
        .await
        .expect("hold");
    assert!(matches!(held.renewal_health(), RenewalHealth::Confirmed));
    let faults = manager.faults();
    let changed = {
        let held = held.clone();
        tokio::spawn(async move { held.renewal_health_changed(&RenewalHealth::Confirmed).await })
    };
    faults.fail_renewals();
    faults.renew_now();
    let health = tokio::time::timeout(BOUND, changed)
        .await
        .expect("said within the bound")
        .expect("task");
    match &health {
        RenewalHealth::Failing {
            since,
            deadline,
            error,
        } => {
            assert!(error.to_string().contains("refused"), "{error}");
            assert_eq!(*deadline, held.deadline());
            assert!(since < deadline);
        }
        other => panic!("{other:?}"),
    }
    let changed = {
        let (held, last) = (held.clone(), health.clone());
        tokio::spawn(async move { held.renewal_health_changed(&last).await })
    };
    faults.restore_renewals();
    faults.renew_now();
    let health = tokio::time::timeout(BOUND, changed)
        .await
        .expect("said within the bound")
        .expect("task");
    assert!(matches!(health, RenewalHealth::Confirmed), "{health:?}");
    assert!(!held.is_lost());
    let mut seen = HashMap::new();
    poll_until("the recovery counted", BOUND, || {
        take(&snapshotter, &mut seen);
        let recovered = seen
            .get("pglease_renewal_outages_total{event=recovered}")
            .copied()
            .unwrap_or(0.0);
        async move { recovered >= 1.0 }
    })
    .await;
    assert_eq!(
        seen["pglease_renewal_outages_total{event=failing}"], 1.0,
        "{seen:?}"
    );
    assert_eq!(seen["pglease_renewal_outages_total{event=recovered}"], 1.0);
    assert_eq!(seen["pglease_renewal_outage_seconds"], 1.0);
    held.release().await.expect("release");
}

pglease_formations::tests![
    operations_are_counted_through_the_metrics_facade,
    failing_and_recovered_renewals_are_said_and_counted,
];
