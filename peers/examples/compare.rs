//! `cargo run --release -p pglease-peers --example compare`: the comparison with the crates
//! users would pick instead, on the server `pglease::provision` finds,
//! printed as tables: the failures a lease must survive (verdicts read from the
//! database), then speed and load. `PEERS_HOLD_SECS` (default 60) is how
//! long 1,000 leases are held, `PEERS_CYCLE_SECS` (default 3) how long
//! acquire+release cycles run; `PEERS_ONLY=safety` or `speed` runs one
//! part. pg_lease prints its own progress to stdout meanwhile: the tables
//! come last.

use std::time::Duration;

fn secs(variable: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(variable)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

#[tokio::main]
async fn main() -> Result<(), pglease_peers::BoxError> {
    let only = std::env::var("PEERS_ONLY").unwrap_or_default();
    let server = pglease::provision::server().await?;
    let mut report = format!(
        "pglease and its peers on {server}, {}\n",
        chrono::Utc::now().format("%Y-%m-%d")
    );
    if only.is_empty() || only == "safety" {
        let verdicts = pglease_peers::safety().await?;
        report.push_str(&pglease_peers::tables(&verdicts));
    }
    if only.is_empty() || only == "speed" {
        let figures =
            pglease_peers::speed(secs("PEERS_CYCLE_SECS", 3), secs("PEERS_HOLD_SECS", 60)).await?;
        report.push_str("\nSpeed and load (ratios to pglease in parentheses)\n\n");
        report.push_str(&pglease_peers::speed_table(&figures));
    }
    println!("\n{report}");
    Ok(())
}
