//! A service exporting pglease's metrics to Prometheus: install the
//! exporter's recorder once, at start, before the first lease, and
//! describe the series; everything pglease records from then on is in
//! the exporter's rendering. Here with `metrics-exporter-prometheus` (in
//! your `Cargo.toml`: `metrics-exporter-prometheus = "0.18"`); any
//! exporter of the `metrics` facade works the same way. The list of
//! series, as data (name, kind, labels, meaning), is
//! `pglease::telemetry::METRICS`.
//!
//! Run it: `cargo run -p pglease --features testing --example prometheus`
//! (on the server `pglease::provision` finds): it holds a lease for a
//! second and prints what `/metrics` would serve. Its test (below, run by
//! `cargo test`) checks that the series arrive.

use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use pglease::{AcquireOptions, LeaseManager};

/// Installs the Prometheus recorder for the whole process and describes
/// pglease's series (their `# HELP` lines). Serve `handle.render()` at
/// `/metrics` with the service's HTTP server, or build the exporter with
/// its `http-listener` feature and call `PrometheusBuilder::install`
/// instead, which serves it on its own port.
pub fn install_metrics() -> Result<PrometheusHandle, Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new()
        // The histograms (acquisition waits, takeover delays, renewal
        // outages) in seconds, as buckets rather than summaries.
        .set_buckets(&[0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 30.0, 300.0])?
        .install_recorder()?;
    pglease::telemetry::describe();
    Ok(handle)
}

/// The service's work: hold lease `report` for `hold`, renewed in the
/// background, then release it.
pub async fn hold_for(leases: &LeaseManager, hold: Duration) -> Result<(), pglease::Error> {
    let held = leases
        .hold("report", AcquireOptions::ttl(Duration::from_secs(1)))
        .await?;
    tokio::time::sleep(hold).await;
    held.release().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let metrics = install_metrics()?;
    let db = pglease::testing::TestDatabase::new().await?;
    hold_for(&db.manager(), Duration::from_secs(1)).await?;
    print!("{}", metrics.render());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample `series` (name and labels as rendered).
    fn sample(rendered: &str, series: &str) -> Option<f64> {
        rendered.lines().find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
    }

    #[tokio::test]
    async fn pglease_series_reach_the_exporter() {
        let metrics = install_metrics().expect("the recorder");
        let db = pglease::testing::TestDatabase::new()
            .await
            .expect("a test database");
        // A 1 s TTL renews every third of a second: two renewals or more.
        hold_for(&db.manager(), Duration::from_millis(900))
            .await
            .expect("hold");
        let rendered = metrics.render();
        let acquired = "pglease_acquisitions_total{outcome=\"acquired\"}";
        assert_eq!(sample(&rendered, acquired), Some(1.0), "{rendered}");
        let renewals = sample(&rendered, "pglease_renewals_total").unwrap_or(0.0);
        assert!(renewals >= 2.0, "{rendered}");
        let released = "pglease_lease_ends_total{reason=\"released\"}";
        assert_eq!(sample(&rendered, released), Some(1.0), "{rendered}");
        assert_eq!(
            sample(&rendered, "pglease_leases_held"),
            Some(0.0),
            "{rendered}"
        );
        assert!(
            rendered.contains("# HELP pglease_acquire_seconds time from an acquire/hold call"),
            "{rendered}"
        );
        assert!(
            rendered.contains("pglease_acquire_seconds_bucket{le=\"0.1\"}"),
            "{rendered}"
        );
        // Every series rendered is one the list names.
        for line in rendered.lines().filter(|l| l.starts_with("pglease_")) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            assert!(
                pglease::telemetry::METRICS
                    .iter()
                    .any(|m| m.0 == name || m.0 == base),
                "{name} is not in pglease::telemetry::METRICS"
            );
        }
    }
}
