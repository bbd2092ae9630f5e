//! The `pglease` command line's library part: the live comparison of a
//! lease with PostgreSQL advisory locks, and the demo built on it. Not a
//! stable API; the `pglease` crate is the library for services.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod compare;
pub mod demo;
