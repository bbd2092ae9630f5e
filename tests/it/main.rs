//! The library's integration tests, against a real PostgreSQL: one test
//! binary (one link of the crate), a module per concern, `common` shared.
//!
//! Each module ends with `pglease_formations::tests![...]`, the list of
//! its tests; a test function left out of it is dead code, which the
//! lints refuse. The modules are listed once, in `suite!` below, in the
//! order their tests start. Tests run through `pglease_formations::harness`,
//! so that one that cannot run here (no PgBouncer, no server binaries, no
//! restart command) is reported as ignored with why, or fails with
//! `PGLEASE_TEST_REQUIRE_ALL` set.

mod common;

pglease_formations::suite![
    acquire_all,
    fair,
    acquire_race,
    advisory,
    answers,
    article_scenario,
    bench_scripts,
    auto_failover,
    bad_input,
    connect,
    counted,
    doctor,
    elect,
    failover,
    fenced_begin,
    fenced_grace,
    fenced_lock,
    guarded_write,
    handover,
    history,
    holding,
    metrics,
    migrate,
    mixed,
    model,
    multi_host,
    observe,
    patroni,
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
