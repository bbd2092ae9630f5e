#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod connect;
pub mod demo;
mod error;
mod fenced;
mod input;
mod lease;
mod migrate;
mod sql;

pub use connect::libpq_defaults;
pub use error::{Error, Result, SQLSTATE_INVALID_INPUT, SQLSTATE_NOT_DECLARED, SQLSTATE_NOT_HELD};
pub use fenced::{FencedTransaction, assert_held};
pub use input::{MAX_NAME_BYTES, MAX_TTL};
pub use lease::{Lease, LeaseManager, LeaseStatus};
pub use migrate::MIGRATIONS_TABLE;
