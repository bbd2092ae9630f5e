//! pglease's own test formations, for its suites, examples and benchmark
//! (not published): servers of their own from the installed packages,
//! each returning [`SetupError::Unavailable`] where the machine lacks what
//! it needs, and the harness that reports such a test as ignored.
//!
//! - [`PgBouncer`]: transaction mode in front of a server.
//! - [`Replicated`]: a primary and a streaming standby (`crash_primary`,
//!   `promote`, backups and restores).
//! - [`AutoFailover`]: pg_auto_failover's monitor and two nodes.
//! - [`Patroni`]: etcd and two Patroni nodes (`hold_stream` to make a
//!   failover lose commits).
//! - [`TlsServer`]: TLS only, `scram-sha-256`, a CA made at test time and
//!   a database owned by a role with no special rights, as managed
//!   services give.
//! - [`Forwarder`]: one TCP forwarder (to a port or a unix socket) that
//!   can be frozen, opened, cut and re-pointed: the stable endpoint in
//!   front of a replicated pair, Patroni's replication gates, the peers'
//!   frozen network.
//! - [`harness`]: async tests on runtimes of their own, with the standard
//!   harness's command line, and "ignored (why)" for a test that cannot
//!   run here.
//!
//! What a service's own tests need (a database per test, lease loss on
//! demand) is `pglease::testing`, published with the library.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod auto_failover;
mod forward;
pub mod harness;
mod patroni;
mod pgbouncer;
mod process;
mod replicated;
mod sync;
mod tls;

pub use auto_failover::{AutoFailover, AutoNode, FAST, Timeouts};
pub use forward::{Forwarder, Target};
pub use patroni::{FAST_PATRONI, Patroni, PatroniNode};
pub use pgbouncer::{PgBouncer, PgBouncerBuilder};
pub use pglease::testing::SetupError;
pub use replicated::{Backup, Node, Replicated, Restored, Standby};
pub use tls::TlsServer;
