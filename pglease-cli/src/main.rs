//! The `pglease` command-line tool: argument parsing and process handling
//! only; every lease operation lives in the library.

mod args;
mod commands;
mod elect;
mod history;
mod run;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use clap::Parser;
use pglease::{AcquireOptions, Error, Fence, LeaseManager};
use sqlx::postgres::PgConnectOptions;

use args::{Cli, Command};
use commands::{acquire, demo, doctor, migrate, release, renew, status};
use run::{RunTiming, run};

/// Prints an informational line on stderr unless `--quiet` was given.
macro_rules! note {
    ($($arg:tt)*) => {
        if !$crate::quiet() {
            eprintln!($($arg)*);
        }
    };
}
pub(crate) use note;

/// Prints a line of the requested output on stdout. A reader that went
/// away (`| head`, a closed pipe) is not the command's failure: the line
/// is dropped and the command's own exit status stands.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}
pub(crate) use out;

static QUIET: AtomicBool = AtomicBool::new(false);
static CONFLICT_EXIT: AtomicU8 = AtomicU8::new(EXIT_NOT_ACQUIRED);

/// Whether `--quiet` was given.
pub(crate) fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// The exit status for "held by another" (`--conflict-exit-code`).
pub(crate) fn conflict_exit() -> ExitCode {
    ExitCode::from(CONFLICT_EXIT.load(Ordering::Relaxed))
}

/// Exit status of `doctor` when a check is not ok.
const EXIT_PROBLEMS: u8 = 1;
/// Exit status for bad usage or bad input (clap uses it too).
const EXIT_USAGE: u8 = 2;
/// Exit status for "not acquired".
const EXIT_NOT_ACQUIRED: u8 = 3;
/// Exit status for "lease lost" (renew, release, run).
const EXIT_LOST: u8 = 4;
/// Exit status for "database unreachable or failed".
const EXIT_DATABASE: u8 = 5;
/// Exit status when CMD cannot be started.
const EXIT_CANNOT_START: u8 = 127;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    QUIET.store(cli.quiet, Ordering::Relaxed);
    CONFLICT_EXIT.store(cli.conflict_exit_code, Ordering::Relaxed);
    match &cli.command {
        // Rendered in memory, then written like every output (`out!`): a
        // reader that stops early is not a failure.
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut command, "pglease", &mut script);
            out!("{}", String::from_utf8_lossy(&script).trim_end());
            return ExitCode::SUCCESS;
        }
        Command::Man { dir: Some(dir) } => {
            let command = <Cli as clap::CommandFactory>::command();
            if let Err(e) = clap_mangen::generate_to(command, dir) {
                eprintln!(
                    "pglease: cannot write the manual pages to {}: {e}",
                    dir.display()
                );
                return ExitCode::from(1);
            }
            note!(
                "pglease: wrote pglease.1 and a page per command to {}",
                dir.display()
            );
            return ExitCode::SUCCESS;
        }
        Command::Man { dir: None } => {
            let command = <Cli as clap::CommandFactory>::command();
            let mut page = Vec::new();
            if let Err(e) = clap_mangen::Man::new(command).render(&mut page) {
                eprintln!("pglease: cannot render the manual page: {e}");
                return ExitCode::from(1);
            }
            out!("{}", String::from_utf8_lossy(&page).trim_end());
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    // --database-url, else DATABASE_URL; empty means "not set".
    let cli = Cli {
        database_url: cli
            .database_url
            .or_else(|| std::env::var("DATABASE_URL").ok())
            .filter(|url| !url.is_empty()),
        ..cli
    };
    let options = match &cli.database_url {
        Some(url) => match pglease::connect::parse_url(url) {
            Ok(options) => options,
            Err(e) => {
                let why = match e {
                    pglease::Error::InvalidInput { reason, .. } => reason,
                    e => e.to_string(),
                };
                eprintln!("pglease: invalid database URL (--database-url or DATABASE_URL): {why}");
                return ExitCode::from(EXIT_USAGE);
            }
        },
        None if std::env::var("PGHOST").is_ok_and(|hosts| hosts.contains(',')) => {
            eprintln!(
                "pglease: PGHOST names several hosts; pglease connects to one: put the primary \
                 behind a stable endpoint that follows failovers (see docs/design.md)"
            );
            return ExitCode::from(EXIT_USAGE);
        }
        None => pglease::connect::libpq_defaults(),
    };
    if let Command::Demo = cli.command {
        // Without a URL, the demo finds a server as the tests do, down to
        // a throwaway cluster.
        let explicit = cli.database_url.is_some();
        return demo(&options, explicit, cli.connect_timeout).await;
    }
    // With --json, failures are answered in JSON on stdout too.
    let json = wants_json(&cli.command);
    let manager = match connect(&options, cli.connect_timeout).await {
        Ok(manager) => manager,
        Err(why) => {
            if json {
                json_failure(&why, EXIT_DATABASE);
            }
            return ExitCode::from(EXIT_DATABASE);
        }
    };
    let code = match cli.command {
        Command::Migrate { json } => migrate(&manager, json).await,
        Command::Doctor { json } => doctor(&manager, json).await,
        Command::Acquire {
            name,
            ttl,
            holder,
            wait,
            value,
            limit,
            json,
        } => {
            let options = commands::AcquireArgs {
                ttl,
                holder,
                wait,
                value,
                limit,
            };
            acquire(&manager, &name, options, json).await
        }
        Command::Renew {
            name,
            token,
            ttl,
            json,
        } => renew(&manager, &name, token, ttl, json).await,
        Command::Release { name, token, json } => match Fence::new(name, token) {
            Ok(fence) => release(&manager, &fence, json).await,
            Err(e) => Err((e, "release")),
        },
        Command::Status {
            name,
            json,
            held,
            expired,
            prefix,
            limit,
        } => {
            let mut filter = pglease::ListFilter::default();
            if held {
                filter = filter.held();
            }
            if expired {
                filter = filter.expired();
            }
            if let Some(prefix) = prefix {
                filter = filter.prefix(prefix);
            }
            if let Some(limit) = limit {
                filter = filter.limit(limit);
            }
            status(&manager, name.as_deref(), json, &filter).await
        }
        Command::Run {
            name,
            ttl,
            wait,
            holder,
            grace,
            limit,
            timeout,
            min_hold,
            cmd,
        } => {
            let holder = holder.unwrap_or_else(AcquireOptions::default_holder);
            let timing = RunTiming {
                ttl,
                wait,
                grace,
                timeout,
                min_hold,
                limit,
            };
            run(&manager, &cli.database_url, &name, &holder, timing, &cmd).await
        }
        Command::History { name, since, json } => {
            history::history(&manager, &name, since, json).await
        }
        Command::ForceRelease { name, reason, json } => {
            history::force_release(&manager, &name, &reason, json).await
        }
        Command::Leader { name, json } => elect::leader(&manager, &name, json).await,
        Command::Observe { name } => elect::observe(&manager, &name).await,
        Command::StepDown { name, by, json } => {
            let by = by.unwrap_or_else(AcquireOptions::default_holder);
            elect::step_down(&manager, &name, &by, json).await
        }
        Command::Elect {
            name,
            ttl,
            value,
            holder,
            grace,
            max_restarts,
            restart_delay,
            cmd,
        } => {
            let options = elect::ElectOptions {
                ttl,
                holder: holder.unwrap_or_else(AcquireOptions::default_holder),
                value,
                grace,
                max_restarts,
                restart_delay,
            };
            elect::elect(&manager, &cli.database_url, &name, options, &cmd).await
        }
        Command::Demo | Command::Completions { .. } | Command::Man { .. } => {
            unreachable!("handled above")
        }
    };
    match code {
        Ok(code) => code,
        Err((e, what)) => {
            let status = fail(&e, what);
            if json {
                json_failure(&format!("{what} failed: {e}"), status);
            }
            ExitCode::from(status)
        }
    }
}

/// Whether the command was asked for JSON output.
fn wants_json(command: &Command) -> bool {
    match command {
        Command::Doctor { json }
        | Command::Migrate { json }
        | Command::ForceRelease { json, .. }
        | Command::StepDown { json, .. }
        | Command::Acquire { json, .. }
        | Command::Renew { json, .. }
        | Command::Release { json, .. }
        | Command::Status { json, .. }
        | Command::History { json, .. }
        | Command::Leader { json, .. } => *json,
        _ => false,
    }
}

/// A failure as one JSON object on stdout: `{"error": ..., "status": N}`.
pub(crate) fn json_failure(error: &str, status: u8) {
    out!("{}", serde_json::json!({"error": error, "status": status}));
}

type Outcome = Result<ExitCode, (Error, &'static str)>;

/// Maps a library error to a message and an exit status.
fn fail(e: &Error, what: &str) -> u8 {
    match e {
        Error::InvalidInput { .. } => {
            eprintln!("pglease: {e}");
            EXIT_USAGE
        }
        Error::Database(db)
            if matches!(
                db.as_database_error().and_then(|d| d.code()).as_deref(),
                // undefined function, undefined table, invalid schema name
                Some("42883" | "42P01" | "3F000")
            ) =>
        {
            eprintln!(
                "pglease: {what} failed: the pglease schema is missing or out of date in this \
                 database ({e}); run `pglease migrate` first"
            );
            EXIT_DATABASE
        }
        _ => {
            eprintln!("pglease: {what} failed: {e}");
            EXIT_DATABASE
        }
    }
}

/// Connects through the library: a refused connection or a failed login is
/// reported at once with its cause; `timeout` applies only to a server
/// that does not answer. The pool's connections abandon a statement still
/// waiting in the server once this process is gone (see
/// `pglease::connect::pool_options`), so an interrupted acquisition acquires nothing.
/// Fails with the message's first line (server and cause), also for JSON.
async fn connect(options: &PgConnectOptions, timeout: Duration) -> Result<LeaseManager, String> {
    LeaseManager::connect_with(options.clone(), timeout)
        .await
        .map_err(|e| {
            // The server answered and refused (a role, a password or a
            // database that does not exist), or it could not be reached.
            let answered = matches!(&e, Error::Database(db) if db.as_database_error().is_some());
            let next = if answered {
                "Check the user, password and database name in --database-url or DATABASE_URL \
                 (or PGUSER, PGPASSWORD, PGDATABASE)."
            } else {
                "Set --database-url or DATABASE_URL (or PGHOST, PGPORT, PGUSER, PGDATABASE) \
                 to a reachable server."
            };
            let why = format!(
                "cannot connect to PostgreSQL at {}:{}: {e}",
                options.get_host(),
                options.get_port()
            );
            eprintln!("pglease: {why}\n{next}");
            why
        })
}
