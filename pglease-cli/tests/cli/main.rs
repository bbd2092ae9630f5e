//! The `pglease` command line's tests, driving the binary as a user would
//! against a real PostgreSQL: one test binary, a module per concern,
//! `common` shared. Each module ends with `tests![...]`; tests run through
//! `pglease_formations::harness` (see the library's `tests/it/main.rs`).

/// `tests![a, b(4), c ignored]`: the module's tests, each named
/// `module::a` and run on a tokio runtime of its own: current-thread, or
/// with a number, multi-threaded with that many workers; `ignored` ones
/// only when asked.
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

mod auto_failover;
mod commands;
mod declared;
mod elect;
mod failover;
mod handover;
mod history;
mod holders;
mod patroni;
mod pooler;
mod sets;
mod shared;
mod terminal;
mod timeline;
mod tls;

fn main() -> std::process::ExitCode {
    // Started again as a migration tool by the tests of `run --declare`.
    if let Some(dir) = std::env::var_os(declared::MIGRATOR) {
        return declared::migrator(dir.into());
    }
    pglease_formations::harness::run(
        [
            auto_failover::tests(),
            commands::tests(),
            declared::tests(),
            elect::tests(),
            failover::tests(),
            handover::tests(),
            history::tests(),
            holders::tests(),
            patroni::tests(),
            pooler::tests(),
            sets::tests(),
            shared::tests(),
            terminal::tests(),
            timeline::tests(),
            tls::tests(),
        ]
        .into_iter()
        .flatten(),
    )
}
