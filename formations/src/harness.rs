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
//! `--list`), through `libtest-mimic`. Output is not captured. Tests
//! mostly wait (for a TTL, a server, a process), so more run at once than
//! the standard harness's one per core (see [`run`]). After the report,
//! the slowest tests are listed with their durations.
//!
//! A binary registers each test once: a module lists its tests with
//! [`tests!`](crate::tests) (a test function left out is dead code, which
//! the lints refuse), and `main.rs` lists the modules with
//! [`suite!`](crate::suite), which declares them and gathers their tests
//! in that order:
//!
//! ```no_run
//! // tests/it/pooler.rs (here inline)
//! mod pooler {
//!     use pglease::testing::SetupError;
//!
//!     async fn leases_survive_a_pooler() -> Result<(), SetupError> {
//!         let bouncer = pglease_formations::PgBouncer::builder()
//!             .start(&pglease::provision::server().await?.options)?;
//!         // ...
//!         Ok(())
//!     }
//!
//!     async fn plain() {}
//!
//!     pglease_formations::tests![leases_survive_a_pooler, plain(2)];
//! }
//!
//! // tests/it/main.rs: `pglease_formations::suite![pooler, ...];` declares
//! // `mod pooler;` and writes `suite()`, which this is for one module.
//! fn main() -> std::process::ExitCode {
//!     pglease_formations::harness::run(pooler::tests())
//! }
//! ```
//!
//! [`Test`] and [`run`] are what the macros use; a binary with one test
//! may call them directly.

use std::future::Future;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion, Failed, Trial};

use crate::SetupError;
use crate::sync::lock;

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

    fn into_trial(self, required: bool, durations: Arc<Mutex<Vec<(String, Duration)>>>) -> Trial {
        let Test {
            name,
            threads,
            ignored,
            body,
        } = self;
        let thread = name.clone();
        Trial::ignorable_test(name, move || {
            let started = Instant::now();
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
                .name(thread.clone())
                .spawn(run)
                .map_err(|e| Failed::from(format!("start the test's thread: {e}")))?
                .join();
            lock(&durations).push((thread, started.elapsed()));
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

/// How many tests run at once by default, per core: most of a test's
/// time is spent waiting (for a TTL to pass, a server to start, a process
/// to stop), not computing, so one per core (the standard harness's
/// default) left the cores mostly idle. At three per core on 2 cores the
/// library's tests took 101 s instead of 230 s, all passing.
const TESTS_PER_CORE: usize = 3;

/// At most this many at once by default, however many cores.
const MOST_AT_ONCE: usize = 16;

/// How many tests run at once when `--test-threads` does not say:
/// `RUST_TEST_THREADS` as the standard harness reads it, else
/// [`TESTS_PER_CORE`] per core, at most [`MOST_AT_ONCE`].
fn default_threads() -> Option<usize> {
    if let Some(n) = std::env::var("RUST_TEST_THREADS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| *n > 0)
    {
        return Some(n);
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    Some((cores * TESTS_PER_CORE).min(MOST_AT_ONCE))
}

/// How many of the slowest tests the report lists.
const SLOWEST: usize = 10;

/// Runs `tests` as the command line asks (by default three at a time per
/// core, at most 16, or `RUST_TEST_THREADS`), prints the standard
/// harness's report and the ten slowest tests with their durations, and
/// returns the exit status for `main` (failure if any test failed).
pub fn run(tests: impl IntoIterator<Item = Test>) -> ExitCode {
    let mut arguments = Arguments::from_args();
    arguments.test_threads = arguments.test_threads.or_else(default_threads);
    let required = std::env::var_os(REQUIRE_ALL).is_some();
    let durations = Arc::new(Mutex::new(Vec::new()));
    let trials = tests
        .into_iter()
        .map(|test| test.into_trial(required, Arc::clone(&durations)))
        .collect();
    let conclusion = libtest_mimic::run(&arguments, trials);
    let mut durations = std::mem::take(&mut *lock(&durations));
    if !durations.is_empty() {
        // Slowest first: what to make faster, or to start earlier.
        durations.sort_by_key(|(_, took)| std::cmp::Reverse(*took));
        println!("slowest tests:");
        for (name, took) in durations.iter().take(SLOWEST) {
            println!("  {:>7.2} s  {name}", took.as_secs_f64());
        }
        println!();
    }
    conclusion.exit_code()
}

/// `tests![a, b(4), c ignored]`, at the end of a test module: the
/// module's tests, as `pub(crate) fn tests() -> Vec<Test>`. Each is named
/// `module::a` (the module's path without the crate's name, as the
/// standard harness names tests) and runs on a tokio runtime of its own:
/// current-thread, or with a number, multi-threaded with that many
/// workers ([`Test::threads`]); `ignored` ones only when asked
/// ([`Test::ignored`]: processes that another test starts). A test
/// function left out of the list is never used, which the dead-code lint
/// reports.
#[macro_export]
macro_rules! tests {
    ($($name:ident $(($workers:expr))? $($ignored:ident)?),* $(,)?) => {
        pub(crate) fn tests() -> ::std::vec::Vec<$crate::harness::Test> {
            ::std::vec![$(
                $crate::harness::Test::in_module(
                    ::core::module_path!(),
                    ::core::stringify!($name),
                    $name,
                )
                $(.threads($workers))?
                $(.$ignored())?
            ),*]
        }
    };
}

/// `suite![a, b, c]`, in a test binary's `main.rs`: declares the test
/// modules `a`, `b` and `c` (`mod a;` ...: a module is listed here and
/// nowhere else), each ending with [`tests!`](crate::tests), and defines
/// `fn suite() -> Vec<Test>`, their tests in the order listed, for
/// [`run`]. Tests start in that order, as many at a time as
/// `--test-threads` says, so a suite lists its slowest modules first
/// rather than leave them to the end of the run.
#[macro_export]
macro_rules! suite {
    ($($module:ident),* $(,)?) => {
        $(mod $module;)*

        /// Every test of this binary, module by module in the order
        /// `suite!` lists them.
        fn suite() -> ::std::vec::Vec<$crate::harness::Test> {
            let mut tests = ::std::vec::Vec::new();
            $(tests.extend($module::tests());)*
            tests
        }
    };
}
