//! The `pglease` command-line tool: argument parsing, output and process
//! handling only; every lease operation lives in the library. One file per
//! command in `cmd/`; CMD's supervision for `run` and `elect` in
//! `child.rs`.

mod args;
mod child;
mod cmd;
mod connect;
mod declare;
mod exit;
mod manual;
mod output;
mod sidecar;
mod sync;
mod timeline;

use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, FromArgMatches};
use pglease::{AcquireOptions, Fence, LeaseManager};

use args::{Cli, Command};
use output::{json_failure, note, out};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = manual::command()
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches))
        .unwrap_or_else(|e| usage_error(e));
    let checked = cli.command.check().and_then(|()| match &cli.command {
        Command::History {
            html, svg, from, ..
        } => {
            let draw = cmd::history::Draw {
                html: html.clone(),
                svg: svg.clone(),
            };
            cmd::history::check(&draw, from.as_deref()).map_err(|why| ("history", why))
        }
        _ => Ok(()),
    });
    if let Err((subcommand, why)) = checked {
        // Said as clap says its own, with the subcommand's usage.
        let mut command = manual::command();
        command.build();
        let usage = command.find_subcommand_mut(subcommand).map(|c| c.clone());
        usage_error(
            usage
                .unwrap_or(command)
                .error(clap::error::ErrorKind::ArgumentConflict, why),
        );
    }
    output::set_quiet(cli.quiet);
    exit::set_conflict(cli.conflict_exit_code);
    // Commands that need no database.
    match &cli.command {
        Command::Completions { shell } => return completions(*shell),
        Command::Man { dir } => return man(dir.as_deref()),
        Command::History {
            name,
            from: Some(from),
            html,
            svg,
            ..
        } => {
            let draw = cmd::history::Draw {
                html: html.clone(),
                svg: svg.clone(),
            };
            return cmd::history::draw_saved(name.as_deref(), from, &draw);
        }
        _ => {}
    }
    // --database-url, else DATABASE_URL; empty means "not set".
    let database_url = cli
        .database_url
        .clone()
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .filter(|url| !url.is_empty());
    let target = match connect::target(database_url.as_deref()) {
        Ok(target) => target,
        Err(why) => {
            eprintln!("pglease: {why}");
            return ExitCode::from(exit::USAGE);
        }
    };
    // --connect-timeout, else the URL's connect_timeout (or
    // PGCONNECT_TIMEOUT), else 10 s.
    let connect_timeout = cli
        .connect_timeout
        .or(target.connect_timeout())
        .unwrap_or(pglease::connect::DEFAULT_TIMEOUT);
    exit::set_place(&target);
    if let Command::Demo = cli.command {
        // Without a URL, the demo finds a server as the tests do, down to
        // a throwaway cluster.
        // Several hosts in PGHOST name a deployment too: not a search.
        let explicit = database_url.is_some() || target.len() > 1;
        return cmd::demo::demo(&target, explicit, connect_timeout).await;
    }
    // run, elect and share keep a board of where they stand; --http
    // serves it from before connecting.
    let (board, http) = match cli.command.board() {
        Some((kind, http)) => (Some(Arc::new(sidecar::board::Board::new(kind))), http),
        None => (None, None),
    };
    let sidecar = match (http, &board) {
        (Some(addr), Some(board)) => match sidecar::Sidecar::start(addr, Arc::clone(board)).await {
            Ok(sidecar) => Some(sidecar),
            Err(why) => {
                eprintln!("pglease: {why}");
                return ExitCode::from(exit::USAGE);
            }
        },
        _ => None,
    };
    // With --json, failures are answered in JSON on stdout too.
    let json = cli.command.wants_json();
    let manager = match connect::connect(&target, connect_timeout).await {
        Ok(manager) => manager,
        Err(why) => {
            if json {
                json_failure(&why, exit::DATABASE);
            }
            return ExitCode::from(exit::DATABASE);
        }
    };
    if let Some(sidecar) = &sidecar {
        sidecar.connected(&manager);
    }
    if let Some(board) = &board {
        board.connected();
    }
    match dispatch(cli.command, &manager, database_url.as_deref(), board).await {
        Ok(code) => code,
        Err((e, what)) => {
            let status = exit::fail(&e, what);
            if json {
                json_failure(&format!("{what} failed: {e}"), status);
            }
            ExitCode::from(status)
        }
    }
}

/// Runs a command that talks to the database.
async fn dispatch(
    command: Command,
    manager: &LeaseManager,
    database_url: Option<&str>,
    board: Option<Arc<sidecar::board::Board>>,
) -> exit::Outcome {
    // run, elect and share have one (made from the command itself).
    let board = || {
        board
            .clone()
            .unwrap_or_else(|| unreachable!("made for this command"))
    };
    match command {
        Command::Migrate { json } => cmd::migrate::migrate(manager, json).await,
        Command::Doctor(args) => cmd::doctor::doctor(manager, args).await,
        Command::Acquire(args) => cmd::acquire::acquire(manager, args).await,
        Command::Renew {
            name,
            token,
            ttl,
            json,
        } => cmd::renew::renew(manager, &name, token, ttl, json).await,
        Command::Release { name, token, json } => match Fence::new(name, token) {
            Ok(fence) => cmd::release::release(manager, &fence, json).await,
            Err(e) => Err((e, "release")),
        },
        Command::HandOver {
            name,
            token,
            successor,
            ttl,
            or_release,
            json,
        } => match Fence::new(name, token) {
            Ok(fence) => {
                let to = cmd::hand_over::To {
                    successor: &successor,
                    ttl,
                    or_release,
                };
                cmd::hand_over::hand_over(manager, &fence, to, json).await
            }
            Err(e) => Err((e, "hand-over")),
        },
        Command::SetFair { name, setting } => {
            let fair = setting == "on";
            match manager.admin().set_fair(&name, fair).await {
                Ok(()) => {
                    note!(
                        "pglease: {name:?}: {}",
                        if fair {
                            "every waiter waits in line (first come, first served)"
                        } else {
                            "waiters wait in line only when they ask (--fair)"
                        }
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => Err((e, "set-fair")),
            }
        }
        Command::Protect(args) => cmd::protect::protect(manager, &args).await,
        Command::Unprotect(args) => cmd::protect::unprotect(manager, &args).await,
        Command::Status(args) => cmd::status::status(manager, args).await,
        Command::Run(args) => cmd::run::run(manager, database_url, args, &board()).await,
        Command::History {
            name,
            since,
            json,
            html,
            svg,
            from: _,
        } => {
            // NAME is required without --from (clap checks).
            let name = name.unwrap_or_default();
            let draw = cmd::history::Draw { html, svg };
            cmd::history::history(manager, &name, since, json, &draw).await
        }
        Command::ForceRelease { name, reason, json } => {
            cmd::force_release::force_release(manager, &name, &reason, json).await
        }
        Command::Leader { name, json } => cmd::leader::leader(manager, &name, json).await,
        Command::Observe { name } => cmd::observe::observe(manager, &name).await,
        Command::StepDown { name, by, json } => {
            cmd::step_down::step_down(
                manager,
                &name,
                &by.unwrap_or_else(AcquireOptions::default_holder),
                json,
            )
            .await
        }
        Command::Elect(args) => cmd::elect::elect(manager, database_url, args, board()).await,
        Command::Share(args) => cmd::share::share(manager, database_url, args, board()).await,
        Command::Demo | Command::Completions { .. } | Command::Man { .. } => {
            unreachable!("answered before connecting")
        }
    }
}

/// `pglease completions SHELL`: rendered in memory, then written like every
/// output (`out!`): a reader that stops early is not a failure.
fn completions(shell: clap_complete::Shell) -> ExitCode {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "pglease", &mut script);
    out!("{}", String::from_utf8_lossy(&script).trim_end());
    ExitCode::SUCCESS
}

/// `pglease man [--dir DIR]`: the top page on stdout, or every page into
/// DIR (made if missing).
fn man(dir: Option<&std::path::Path>) -> ExitCode {
    if let Some(dir) = dir {
        return match manual::write_pages(dir) {
            Ok(written) => {
                note!(
                    "pglease: wrote {} manual pages (pglease.1 and one per command) to {}",
                    written.len(),
                    dir.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "pglease: cannot write the manual pages to {}: {e}",
                    dir.display()
                );
                ExitCode::from(1)
            }
        };
    }
    let mut page = Vec::new();
    if let Err(e) = manual::render_top(&mut page) {
        eprintln!("pglease: cannot render the manual page: {e}");
        return ExitCode::from(1);
    }
    out!("{}", String::from_utf8_lossy(&page).trim_end());
    ExitCode::SUCCESS
}

/// Exits on a command line clap refused: help and the version as clap
/// prints them; an error with the prefix every other error has
/// (`pglease: `, not clap's `error: `) and exit status 2, with a hint when
/// a `run` or `elect` has no CMD because its `--` was left out (the
/// command's words were taken as lease names).
fn usage_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit()
    }
    let rendered = e.render().to_string();
    eprint!(
        "pglease: {}",
        rendered.strip_prefix("error: ").unwrap_or(&rendered)
    );
    let no_separator = !std::env::args_os().any(|a| a == "--");
    if e.kind() == ErrorKind::MissingRequiredArgument && no_separator && rendered.contains("<CMD>")
    {
        eprintln!(
            "hint: put `--` before the command, as in `pglease run NAME --ttl 30s -- CMD ARGS...`: \
             without it, the command's words are taken as lease names"
        );
    }
    std::process::exit(i32::from(exit::USAGE))
}
