//! P2 (the full run only): renewing N held leases in one statement vs one
//! statement per lease.

use std::time::{Duration, Instant};

use pglease::{AcquireOptions, Error, Lease};

use crate::shared::Bench;
use crate::shared::ops::LONG;
use crate::shared::timing::median;

/// The statement the background renewal task sends once per tick.
const RENEW_MANY: &str = "SELECT name, token, expires_at, renewed, current_token, current_holder \
     FROM pglease.renew_many($1, $2, $3)";

pub(crate) async fn run(bench: &Bench) -> Result<(), Error> {
    let (m, secs) = (&bench.m, bench.secs);
    println!("\nRenewal of N held leases: one renew_many statement vs N renew statements");
    println!("| N | batched µs/lease | one by one µs/lease | batched / one by one |");
    println!("|---:|---:|---:|---:|");
    let mut held: Vec<Lease> = Vec::new();
    for n in [1usize, 100, 1000] {
        while held.len() < n {
            let name = format!("renew-{:04}", held.len());
            held.push(
                m.acquire(&name, AcquireOptions::ttl(LONG).holder("bench"))
                    .await?,
            );
        }
        let names: Vec<&str> = held.iter().map(Lease::name).collect();
        let tokens: Vec<i64> = held.iter().map(|h| h.token().get()).collect();
        let ttls = vec![LONG; n];
        let (mut batched, mut single) = (Vec::new(), Vec::new());
        // Alternate rounds until each side had its share of the time.
        let until = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < until || batched.len() < 3 {
            let start = Instant::now();
            let rows = sqlx::query(RENEW_MANY)
                .bind(&names)
                .bind(&tokens)
                .bind(&ttls)
                .fetch_all(m.pool())
                .await?;
            assert_eq!(rows.len(), n);
            batched.push(start.elapsed());
            let start = Instant::now();
            for lease in &held {
                m.renew(lease, LONG).await?;
            }
            single.push(start.elapsed());
        }
        let per_lease = |v: &[Duration]| median(v).as_secs_f64() * 1e6 / n as f64;
        let (b, o) = (per_lease(&batched), per_lease(&single));
        println!("| {n} | {b:.1} | {o:.1} | {:.3} |", b / o);
    }
    Ok(())
}
