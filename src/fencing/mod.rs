//! Fencing, the database as the enforcement point: a transaction that
//! declares the token it writes under and is checked by PostgreSQL until
//! it commits (`transaction.rs`: [`FencedTransaction`], [`assert_held`]),
//! and, for a resource outside the leases' database, the highest token it
//! has accepted (`high_water.rs`: [`HighWaterMark`]; in the database,
//! `pglease.admit` through [`LeaseManager::admit`](crate::LeaseManager::admit)).

mod high_water;
mod transaction;

pub use high_water::HighWaterMark;
pub(crate) use transaction::begin;
pub use transaction::{FencedTransaction, assert_held};
