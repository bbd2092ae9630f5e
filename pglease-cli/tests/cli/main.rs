//! The `pglease` command line's tests, driving the binary as a user would
//! against a real PostgreSQL: one test binary, a module per concern,
//! `common` shared. Each module ends with `pglease_formations::tests![...]`
//! and is listed once, in `suite!` below; tests run through
//! `pglease_formations::harness` (see the library's `tests/it/main.rs`).

mod common;

pglease_formations::suite![
    auto_failover,
    arguments,
    acquire,
    connect,
    run,
    demo,
    migrate,
    doctor,
    output,
    declared,
    elect,
    failover,
    handover,
    history,
    holders,
    patroni,
    pooler,
    sets,
    share,
    shared,
    sidecar,
    terminal,
    timeline,
    tls,
];

fn main() -> std::process::ExitCode {
    // Started again as a migration tool by the tests of `run --declare`.
    if let Some(dir) = std::env::var_os(declared::MIGRATOR) {
        return declared::migrator(dir.into());
    }
    pglease_formations::harness::run(suite())
}
