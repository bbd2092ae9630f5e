//! The scenario engine's tests: its judgement without a database, and
//! every scenario played live against a real PostgreSQL. One test binary,
//! a module per concern, run through `pglease_formations::harness` (see
//! the library's `tests/it/main.rs`).

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

mod compare;
mod engine;
mod narrate;

fn main() -> std::process::ExitCode {
    pglease_formations::harness::run(
        [compare::tests(), engine::tests(), narrate::tests()]
            .into_iter()
            .flatten(),
    )
}
