//! The failures a lease must survive, played live
//! against PostgreSQL: (a) a holder pauses past its TTL, (b) its
//! connection is killed, (c) it dies without releasing, (d) its release
//! arrives late, (e) its renewals get no answer. Each is a script of the
//! [`engine`], written once over a [`engine::Contender`] (a way of
//! guarding a resource), with one ledger the writers append to and one
//! judgement of what the ledger and the clocks show.
//!
//! [`run`] plays every scenario against the three [`Variant`]s of
//! `pglease demo` (a pglease lease with fenced writes, a session and a
//! transaction advisory lock) and [`table`] sums the verdicts up; [`play`]
//! plays one, telling an [`Observer`] each [`Step`] as it happens (the
//! demo tells scenario (a) for the lease that way, through a
//! [`Narrator`]). The project's peers comparison plays the same scripts
//! with other crates as contenders.
//!
//! Published because the published `pglease` command line plays these
//! scenarios in `pglease demo`. It is the demo's and the peers
//! comparison's engine, not a library for services (that is `pglease`):
//! its API follows what those two need.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod compare;
pub mod engine;
mod narrate;

pub use compare::{Outcome, Variant, play, run, table};
pub use engine::{BoxError, Judgement, Observer, Scenario, Step, Verdict, Violation, Written};
pub use narrate::Narrator;
