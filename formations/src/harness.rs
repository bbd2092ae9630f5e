//! A test harness for integration-test binaries of async tests (the
//! binary sets `harness = false`), that reports a test which
//! could not run where it is as *ignored, with why*, never as passed.
//!
//! The standard harness knows only passed and failed at run time, so a
//! test that finds no PgBouncer, no server binaries or no restart command
//! on this machine can only pass without having run. Here a test returns
//! `Err(SetupError::Unavailable(..))` instead, and the run says
//! `test pooler::x ... ignored (PgBouncer is not installed ...)`. With
//! [`REQUIRE_ALL`] set (as a CI run would), such a test fails instead.
//!
//! Each test gets a tokio runtime of its own, as `#[tokio::test]` gives,
//! on a thread named after it. The command line is the standard harness's
//! (filters, `--exact`, `--ignored`, `--include-ignored`, `--test-threads`,
//! `--list`), through `libtest-mimic`. Output is not captured.
//!
//! ```no_run
//! use pglease::testing::SetupError;
//! use pglease_formations::harness::{Test, run};
//!
//! async fn leases_survive_a_pooler() -> Result<(), SetupError> {
//!     let bouncer = pglease_formations::PgBouncer::builder()
//!         .start(&pglease::provision::server().await?.options)?;
//!     // ...
//!     Ok(())
//! }
//!
//! async fn plain() {}
//!
//! fn main() -> std::process::ExitCode {
//!     run(vec![
//!         Test::new("pooler::leases_survive_a_pooler", leases_survive_a_pooler),
//!         Test::new("plain", plain).threads(2),
//!     ])
//! }
//! ```

use std::future::Future;
use std::process::ExitCode;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

use crate::SetupError;

/// The environment variable that makes every test mandatory: with it set
/// (to anything), a test that cannot run where it is fails.
pub const REQUIRE_ALL: &str = "PGLEASE_TEST_REQUIRE_ALL";

/// What a test returns: nothing (it passed, or it panicked), or a
/// [`SetupError`], of which [`SetupError::Unavailable`] means "could not
/// run here" and any other a failure.
pub trait Outcome {
    /// This outcome as a result.
    ///
    /// # Errors
    ///
    /// The test's [`SetupError`].
    fn into_result(self) -> Result<(), SetupError>;
}

impl Outcome for () {
    fn into_result(self) -> Result<(), SetupError> {
        Ok(())
    }
}

impl Outcome for Result<(), SetupError> {
    fn into_result(self) -> Result<(), SetupError> {
        self
    }
}

/// One test: a name and an async function.
#[must_use]
pub struct Test {
    name: String,
    threads: Option<usize>,
    ignored: bool,
    body: Box<dyn FnOnce(tokio::runtime::Runtime) -> Result<(), SetupError> + Send>,
}

impl std::fmt::Debug for Test {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Test")
            .field("name", &self.name)
            .field("threads", &self.threads)
            .field("ignored", &self.ignored)
            .finish_non_exhaustive()
    }
}

impl Test {
    /// The test `name` (such as `module::what_it_proves`), which runs
    /// `test` to completion on a current-thread runtime of its own.
    pub fn new<F, Fut>(name: impl Into<String>, test: F) -> Test
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future,
        Fut::Output: Outcome,
    {
        Test {
            name: name.into(),
            threads: None,
            ignored: false,
            body: Box::new(move |runtime: tokio::runtime::Runtime| {
                runtime.block_on(test()).into_result()
            }),
        }
    }

    /// [`Test::new`] for test function `function` of the module at
    /// `module_path` (`module_path!()`): named `module::function`, the
    /// crate's own name left out, as the standard harness names tests.
    pub fn in_module<F, Fut>(module_path: &str, function: &str, test: F) -> Test
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future,
        Fut::Output: Outcome,
    {
        let module = module_path.split_once("::").map_or("", |(_, m)| m);
        let name = if module.is_empty() {
            function.to_owned()
        } else {
            format!("{module}::{function}")
        };
        Test::new(name, test)
    }

    /// Runs it on a multi-threaded runtime with `workers` worker threads
    /// instead.
    pub fn threads(mut self, workers: usize) -> Test {
        self.threads = Some(workers.max(1));
        self
    }

    /// Runs it only when asked (`--ignored`, `--include-ignored`): a test
    /// that another test starts as a process of its own, say.
    pub fn ignored(mut self) -> Test {
        self.ignored = true;
        self
    }

    fn into_trial(self, required: bool) -> Trial {
        let Test {
            name,
            threads,
            ignored,
            body,
        } = self;
        let thread = name.clone();
        Trial::ignorable_test(name, move || {
            let run = move || {
                let runtime = match threads {
                    Some(workers) => tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(workers)
                        .enable_all()
                        .build(),
                    None => tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build(),
                };
                match runtime {
                    Ok(runtime) => body(runtime),
                    Err(e) => Err(SetupError::Server(format!("build a tokio runtime: {e}"))),
                }
            };
            let joined = std::thread::Builder::new()
                .name(thread)
                .spawn(run)
                .map_err(|e| Failed::from(format!("start the test's thread: {e}")))?
                .join();
            match joined {
                Ok(Ok(())) => Ok(Completion::Completed),
                Ok(Err(SetupError::Unavailable(why))) if !required => {
                    Ok(Completion::ignored_with(why))
                }
                Ok(Err(SetupError::Unavailable(why))) => Err(Failed::from(format!(
                    "cannot run here: {why} ({REQUIRE_ALL} is set: every test must run)"
                ))),
                Ok(Err(error)) => Err(Failed::from(error.to_string())),
                Err(panic) => Err(Failed::from(panic_message(&*panic))),
            }
        })
        .with_ignored_flag(ignored)
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .map_or_else(
            || "test panicked".to_owned(),
            |m| format!("test panicked: {m}"),
        )
}

/// Runs `tests` as the command line asks, prints the standard harness's
/// report, and returns the exit status for `main` (failure if any test
/// failed).
pub fn run(tests: impl IntoIterator<Item = Test>) -> ExitCode {
    let arguments = Arguments::from_args();
    let required = std::env::var_os(REQUIRE_ALL).is_some();
    let trials = tests
        .into_iter()
        .map(|test| test.into_trial(required))
        .collect();
    libtest_mimic::run(&arguments, trials).exit_code()
}
