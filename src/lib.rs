#![doc = include_str!("lib.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

// Layers, each using only those above it: values (`token`, `error`,
// `input`, `lease`, `options`, `backoff`, `sql`); the shared context and
// the statements (`context`, `db`, `fenced`); the components (`hold`,
// `wait`); the manager; and beside it `advisory`, `migrate`, `connect`,
// `doctor`, `observe`, `elect`, `history`.
mod advisory;
mod backoff;
mod connect;
mod context;
mod db;
mod doctor;
mod elect;
mod error;
mod fence;
mod fenced;
mod history;
mod hold;
mod input;
mod lease;
mod manager;
mod migrate;
mod observe;
mod options;
#[cfg(feature = "provision")]
pub mod provision;
#[cfg(feature = "signal")]
mod signal;
mod sql;
mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
mod token;
mod wait;

pub use advisory::{SessionLock, XactLock, advisory_key};
pub use connect::{DEFAULT_CONNECT_TIMEOUT, libpq_defaults, parse_url, pool_options};
pub use doctor::{Check, Diagnosis, Verdict};
pub use elect::{Elector, Leader, Leadership};
pub use error::{
    Error, LossReason, NotHeldReason, Result, SQLSTATE_INVALID_INPUT, SQLSTATE_NOT_DECLARED,
    SQLSTATE_NOT_HELD,
};
pub use fence::HighWaterMark;
pub use fenced::{FencedTransaction, assert_held};
pub use history::{Event, MAX_REASON_BYTES, Transition};
pub use hold::HeldLease;
pub use input::{MAX_NAME_BYTES, MAX_SLOTS, MAX_TTL, MAX_VALUE_BYTES};
pub use lease::{Acquire, Fence, Lease, LeaseStatus, ListFilter, default_holder};
pub use manager::{LeaseManager, ManagerStats};
pub use migrate::{MIGRATIONS_TABLE, Migrated};
pub use observe::{Change, Observer};
pub use options::ManagerOptions;
#[cfg(feature = "signal")]
pub use signal::shutdown_signal;
pub use telemetry::METRICS;
pub use token::Token;
pub use wait::RELEASE_CHANNEL;

/// The `sqlx` this crate is built with: use its `PgPool`, `PgConnection`
/// and `Transaction` with pglease (a different major version of sqlx in
/// the same build has types of the same name that do not mix).
pub use sqlx;

/// The README's and the library guide's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
// docs/library.md's examples include `shutdown_signal` (feature `signal`,
// which the workspace's CLI enables for a root `cargo test`).
#[cfg_attr(feature = "signal", doc = include_str!("../docs/library.md"))]
pub struct ReadmeDoctests;
