#![doc = include_str!("lib.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

// The modules, in layers: each uses only those above it (and, within a
// layer, those before it).
//
// Values, no I/O. Leaves, which use no other module (`token`'s checked
// constructors fail with its own `InvalidToken`, which `error` takes in):
mod backoff;
mod human;
pub mod schema;
pub mod sqlstate;
mod sync;
mod token;
// The error type:
mod error;
// The checks on inputs:
pub mod limits;
// What is checked, and said:
mod lease;
mod options;
mod sql;
pub mod telemetry;
// The runtime a manager shares with its tasks: its context (with the test
// kit's fault flags), connections, the one LISTEN connection, statements:
pub mod connect;
mod context;
mod db;
mod notify;
// The parts: fencing, holding leases over time, waiting for them:
mod fencing;
mod group;
mod hold;
mod wait;
// The facade:
mod manager;
// On top of the manager's surface:
pub mod advisory;
pub mod doctor;
pub mod elect;
pub mod history;
mod migrate;
pub mod observe;
// Kits, which use everything above and which nothing above uses:
#[cfg(feature = "provision")]
pub mod provision;
#[cfg(feature = "signal")]
mod signal;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::{Error, ErrorKind, LossReason, NotHeldReason, Result};
pub use fencing::{FencedTransaction, HighWaterMark, assert_held};
pub use group::{
    GroupEvent, GroupMember, GroupOptions, GroupStatus, GroupSummary, MemberStatus,
    PartitionStatus, Revoke, member_name, partition_name,
};
pub use hold::{HeldLease, RenewalHealth};
pub use lease::{Fence, Lease, LeaseKind, LeaseStatus, ListFilter, SharedHolder};
pub use manager::{Admin, LeaseManager, ManagerStats};
pub use options::{AcquireOptions, ManagerOptions, WithoutSuccessor};
#[cfg(feature = "signal")]
pub use signal::shutdown_signal;
pub use token::{InvalidToken, Token};
pub use wait::LinePlace;

/// The `sqlx` this crate is built with: use its `PgPool`, `PgConnection`
/// and `Transaction` with pglease (a different major version of sqlx in
/// the same build has types of the same name that do not mix).
pub use sqlx;

/// The README's and the library guide's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
// docs/library.md's examples include `shutdown_signal` (feature `signal`,
// which the crate's dev-dependency on itself enables for `cargo test`).
#[cfg_attr(feature = "signal", doc = include_str!("../docs/library.md"))]
pub struct ReadmeDoctests;
