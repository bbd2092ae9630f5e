//! The operations several measures time, each as an [`Op`]: here those
//! through the library on the client's own lease or name, in [`picked`]
//! those of the pair tables that spread over names.

pub(crate) mod picked;

use std::sync::Arc;
use std::time::Duration;

use pglease::{AcquireOptions, Lease, LeaseManager};

use super::timing::{Op, op};

/// The TTL of every lease that must not expire during a measure.
pub(crate) const LONG: Duration = Duration::from_secs(3600);

/// The fenced transactions' write: one row of the 16 in `data`, $1 the
/// client's number.
pub(crate) const RAW_UPDATE: &str = "UPDATE data SET value = value + 1 WHERE id = $1";

/// Acquire and release a lease through the library.
pub(crate) fn lib_cycle(m: &LeaseManager) -> Op {
    let m = m.clone();
    op(move |c| {
        let m = m.clone();
        async move {
            let name = format!("cycle-{c}");
            let lease = m
                .acquire(&name, AcquireOptions::ttl(LONG).holder("bench"))
                .await?;
            m.release(&lease).await?;
            Ok(())
        }
    })
}

/// A fenced transaction as `begin_fenced` opens it, writing one row with
/// a prepared statement (`persistent`) or an unnamed one.
pub(crate) fn lib_fenced(m: &LeaseManager, leases: &Arc<Vec<Lease>>, persistent: bool) -> Op {
    let m = m.clone();
    let leases = leases.clone();
    op(move |c| {
        let m = m.clone();
        let leases = leases.clone();
        async move {
            let mut tx = m.begin_fenced(&leases[c]).await?;
            sqlx::query(RAW_UPDATE)
                .persistent(persistent)
                .bind(c as i32)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        }
    })
}

/// Renew, through the library, the lease `leases[client]`.
pub(crate) fn lib_renew(m: &LeaseManager, leases: &Arc<Vec<Lease>>) -> Op {
    let (m, leases) = (m.clone(), leases.clone());
    op(move |c| {
        let (m, leases) = (m.clone(), leases.clone());
        async move {
            m.renew(&leases[c], LONG).await?;
            Ok(())
        }
    })
}
