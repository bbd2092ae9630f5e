#![doc = include_str!("../../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod advisory;
mod connect;
mod error;
mod fence;
mod fenced;
mod holding;
mod input;
mod lease;
mod migrate;
mod options;
#[cfg(feature = "signal")]
mod signal;
mod sql;
mod waiting;

pub use advisory::{SessionLock, XactLock, advisory_key};
pub use connect::{DEFAULT_CONNECT_TIMEOUT, libpq_defaults, pool_options};
pub use error::{
    Error, LossReason, Result, SQLSTATE_INVALID_INPUT, SQLSTATE_NOT_DECLARED, SQLSTATE_NOT_HELD,
};
pub use fence::HighWaterMark;
pub use fenced::{FencedTransaction, assert_held};
pub use holding::{HeldLease, ManagerStats};
pub use input::{MAX_NAME_BYTES, MAX_TTL};
pub use lease::{Lease, LeaseManager, LeaseStatus};
pub use migrate::MIGRATIONS_TABLE;
pub use options::ManagerOptions;
#[cfg(feature = "signal")]
pub use signal::shutdown_signal;
pub use waiting::RELEASE_CHANNEL;
