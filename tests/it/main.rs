//! The library's integration tests, against a real PostgreSQL: one test
//! binary (one link of the crate), a module per concern, `common` shared.
//!
//! Each module ends with `tests![...]`, the list of its tests; a test
//! function left out of it is dead code, which the lints refuse. Tests run
//! through `pglease_formations::harness`, so that one that cannot run here
//! (no PgBouncer, no server binaries, no restart command) is reported as
//! ignored with why, or fails with `PGLEASE_TEST_REQUIRE_ALL` set.

/// `tests![a, b(4), c ignored]`: the module's tests, each named
/// `module::a` and run on a tokio runtime of its own: current-thread, or
/// with a number, multi-threaded with that many workers; `ignored` ones
/// only when asked (processes that another test starts).
macro_rules! tests {
    ($($name:ident $(($workers:expr))? $($ignored:ident)?),* $(,)?) => {
        pub(crate) fn tests() -> Vec<pglease_formations::harness::Test> {
            use pglease_formations::harness::Test;
            vec![$(
                Test::in_module(module_path!(), stringify!($name), $name)
                    $(.threads($workers))?
                    $(.$ignored())?
            ),*]
        }
    };
}

mod common;

mod acquire_all;
mod acquire_race;
mod advisory;
mod answers;
mod article_scenario;
mod auto_failover;
mod bad_input;
mod bench_scripts;
mod connect;
mod counted;
mod doctor;
mod elect;
mod failover;
mod fair;
mod fenced_begin;
mod fenced_grace;
mod fenced_lock;
mod guarded_write;
mod handover;
mod history;
mod holding;
mod metrics;
mod migrate;
mod mixed;
mod model;
mod multi_host;
mod observe;
mod patroni;
mod pooler;
mod prepared;
mod protect;
mod roles;
mod security;
mod session_bound;
mod shared;
mod shutdown;
mod stale_tokens;
mod status;
mod takeover;
mod testing_kit;
mod timeline;
mod tls;
mod values;
mod waiting;
mod watch;

fn main() -> std::process::ExitCode {
    pglease_formations::harness::run(
        [
            acquire_all::tests(),
            fair::tests(),
            acquire_race::tests(),
            advisory::tests(),
            answers::tests(),
            article_scenario::tests(),
            bench_scripts::tests(),
            auto_failover::tests(),
            bad_input::tests(),
            connect::tests(),
            counted::tests(),
            doctor::tests(),
            elect::tests(),
            failover::tests(),
            fenced_begin::tests(),
            fenced_grace::tests(),
            fenced_lock::tests(),
            guarded_write::tests(),
            handover::tests(),
            history::tests(),
            holding::tests(),
            metrics::tests(),
            migrate::tests(),
            mixed::tests(),
            model::tests(),
            multi_host::tests(),
            observe::tests(),
            patroni::tests(),
            pooler::tests(),
            prepared::tests(),
            protect::tests(),
            roles::tests(),
            security::tests(),
            session_bound::tests(),
            shared::tests(),
            shutdown::tests(),
            stale_tokens::tests(),
            status::tests(),
            takeover::tests(),
            testing_kit::tests(),
            timeline::tests(),
            tls::tests(),
            values::tests(),
            waiting::tests(),
            watch::tests(),
        ]
        .into_iter()
        .flatten(),
    )
}
