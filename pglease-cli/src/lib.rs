//! The `pglease` command line's library part: the demo's first part (the
//! paused holder, step by step). Not a stable API; the `pglease` crate is
//! the library for services.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod demo;
