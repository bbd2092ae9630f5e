//! The scenario engine's tests: its judgement without a database, and
//! every scenario played live against a real PostgreSQL. One test binary,
//! a module per concern, listed once in `suite!` below, run through
//! `pglease_formations::harness` (see the library's `tests/it/main.rs`).

mod common;

pglease_formations::suite![compare, engine, narrate];

fn main() -> std::process::ExitCode {
    pglease_formations::harness::run(suite())
}
