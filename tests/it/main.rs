//! The library's integration tests, against a real PostgreSQL: one test
//! binary (one link of the crate), a module per concern, `common` shared.
//!
//! Each module ends with `pglease_formations::tests![...]`, the list of
//! its tests; a test function left out of it is dead code, which the
//! lints refuse. The modules are listed once, in `suite!` below, in the
//! order their tests start, the slowest first. Tests run through
//! `pglease_formations::harness`, so that one that cannot run here (no
//! PgBouncer, no server binaries, no restart command) is reported as
//! ignored with why, or fails with `PGLEASE_TEST_REQUIRE_ALL` set.

mod common;

pglease_formations::suite![
    // The slowest first (a minute, half a minute, ...), so that none is
    // left to finish alone at the end of the run.
    mixed,
    group_churn,
    auto_failover,
    model,
    patroni,
    holding,
    failover,
    multi_host,
    acquire_all,
    fair,
    acquire_race,
    advisory,
    answers,
    paused_holder,
    other_languages,
    bench_scripts,
    bad_input,
    connect,
    counted,
    doctor,
    elect,
    fenced_begin,
    fenced_grace,
    fenced_lock,
    groups,
    guarded_write,
    handover,
    history,
    metrics,
    migrate,
    observe,
    pooler,
    prepared,
    protect,
    roles,
    security,
    session_bound,
    shared,
    shutdown,
    stale_tokens,
    status,
    takeover,
    testing_kit,
    timeline,
    tls,
    values,
    waiting,
    watch,
];

fn main() -> std::process::ExitCode {
    pglease_formations::harness::run(suite())
}
