//! The `pglease` command-line tool: argument parsing and process handling
//! only; every lease operation lives in the library.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use pglease::LeaseManager;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Exit status for "database unreachable or failed".
const EXIT_DATABASE: u8 = 5;
/// Exit status for bad usage or bad input.
const EXIT_USAGE: u8 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "pglease",
    version,
    about = "Leases with fencing tokens enforced by PostgreSQL"
)]
struct Cli {
    /// PostgreSQL URL; without it (and without DATABASE_URL) the libpq
    /// defaults apply: PGHOST, PGPORT, PGUSER, PGDATABASE, ... then localhost:5432.
    #[arg(long, global = true, env = "DATABASE_URL")]
    database_url: Option<String>,

    /// Give up connecting after this long (exit status 5).
    #[arg(long, global = true, default_value = "10s", value_parser = humantime::parse_duration)]
    connect_timeout: Duration,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create or upgrade the `pglease` schema.
    Migrate,
    /// Show a paused holder's late write rejected by PostgreSQL (about 4 s).
    Demo,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let manager = match connect(&cli).await {
        Ok(manager) => manager,
        Err(code) => return code,
    };
    match cli.command {
        Command::Migrate => match manager.migrate().await {
            Ok(()) => {
                eprintln!("pglease: schema is up to date");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("pglease: migration failed: {e}");
                ExitCode::from(EXIT_DATABASE)
            }
        },
        Command::Demo => {
            if let Err(e) = manager.migrate().await {
                eprintln!("pglease: migration failed: {e}");
                return ExitCode::from(EXIT_DATABASE);
            }
            let name = format!("pglease-demo-{}", std::process::id());
            let unit = Duration::from_millis(300);
            let story =
                pglease::demo::paused_holder(&manager, &name, unit, |line| println!("{line}"))
                    .await;
            let compared = match story {
                Ok(()) => {
                    println!(
                        "\nThe same failures against a lease, a session advisory lock and a \
                         transaction advisory lock (measured now):"
                    );
                    pglease::compare::run(&manager, Duration::from_millis(200), |o| {
                        println!(
                            "  {} / {}: {} - {}",
                            o.scenario.label(),
                            o.variant.label(),
                            if o.safe { "safe" } else { "UNSAFE" },
                            o.detail
                        );
                    })
                    .await
                }
                Err(e) => Err(e),
            };
            match compared {
                Ok(outcomes) => {
                    println!("\n{}", pglease::compare::table(&outcomes));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("pglease: demo failed: {e}");
                    ExitCode::from(EXIT_DATABASE)
                }
            }
        }
    }
}

async fn connect(cli: &Cli) -> Result<LeaseManager, ExitCode> {
    let options = match &cli.database_url {
        Some(url) => url.parse::<PgConnectOptions>().map_err(|e| {
            eprintln!("pglease: invalid --database-url: {e}");
            ExitCode::from(EXIT_USAGE)
        })?,
        None => pglease::libpq_defaults(),
    };
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(cli.connect_timeout)
        .connect_with(options)
        .await
        .map_err(|e| {
            eprintln!(
                "pglease: cannot connect to PostgreSQL: {e}\n\
                 Set --database-url or DATABASE_URL (or PGHOST, PGPORT, PGUSER) \
                 to a reachable server."
            );
            ExitCode::from(EXIT_DATABASE)
        })?;
    Ok(LeaseManager::new(pool))
}
