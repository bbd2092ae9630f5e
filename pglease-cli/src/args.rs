//! The command line's arguments (clap).

use std::time::Duration;

use clap::{Parser, Subcommand};
use pglease::Token;

/// The exit statuses, for `--help`.
const EXIT_STATUSES: &str = "\
Exit status:
  0    done (acquired, renewed, released, held, forced, ...)
  1    doctor: a check is not ok; elect, run: the command's own status
  2    bad usage or input (nothing was changed)
  3    not acquired: held by another (acquire, run: --conflict-exit-code
       sets it); nobody holds it (status NAME, leader, step-down,
       force-release)
  4    lease lost (renew, release, run)
  5    database unreachable or failing, the schema missing (run migrate),
       or a privilege missing
  124  run --timeout: the command ran out of time
  127  run, elect: the command cannot be started
  128+N  run, elect: signal N";

#[derive(Parser, Debug)]
#[command(
    name = "pglease",
    version,
    about = "Leases with fencing tokens enforced by PostgreSQL",
    after_help = EXIT_STATUSES
)]
pub(crate) struct Cli {
    /// PostgreSQL URL (default: the environment's DATABASE_URL); without
    /// either, the libpq defaults apply: PGHOST, PGPORT, PGUSER,
    /// PGDATABASE, PGPASSWORD, then localhost:5432.
    // DATABASE_URL is read in main, not by clap: clap's `env` shows the
    // value in --help (a password) and the option in usage lines as if it
    // had been given.
    #[arg(long, global = true)]
    pub(crate) database_url: Option<String>,

    /// Give up connecting after this long (exit status 5).
    #[arg(long, global = true, default_value = "10s", value_parser = parse_connect_timeout)]
    pub(crate) connect_timeout: Duration,

    /// Print nothing but errors and the requested output (no progress
    /// or confirmation on stderr).
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,

    /// The exit status for "held by another" (acquire, run), instead of 3
    /// (like `flock -E`: a skipped cron run need not look like a failure).
    #[arg(long, global = true, default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=255))]
    pub(crate) conflict_exit_code: u8,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Create or upgrade the `pglease` schema.
    Migrate {
        /// Print one JSON object: `applied` (the migrations applied now)
        /// and `latest`.
        #[arg(long)]
        json: bool,
    },
    /// Check the server for what leases rely on (exit 1 if something is
    /// wrong).
    Doctor {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Acquire a lease (exit 3 if it is held).
    Acquire {
        /// The lease name.
        #[arg(value_parser = parse_text)]
        name: String,
        /// How long the lease lasts unless renewed (e.g. 30s, 5m).
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// Who holds it (default: "HOST (pglease acquire)": this process
        /// exits at once, so its id would name nobody).
        #[arg(long, value_parser = parse_text)]
        holder: Option<String>,
        /// Wait this long for the current holder to release it.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        wait: Duration,
        /// Publish this value with the lease (at most 8 KiB), for anyone to
        /// read in `status`.
        #[arg(long, value_parser = parse_value)]
        value: Option<String>,
        /// A counted lease: one of N slots NAME#k (the output names it).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: Option<u32>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Extend a lease held under TOKEN (exit 4 if it is lost).
    Renew {
        /// The lease name.
        #[arg(value_parser = parse_text)]
        name: String,
        /// The token from `acquire`.
        #[arg(long, allow_negative_numbers = true)]
        token: Token,
        /// The new time to live from now.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// End a lease held under TOKEN (exit 4 if it was not held).
    Release {
        /// The lease name.
        #[arg(value_parser = parse_text)]
        name: String,
        /// The token from `acquire`.
        #[arg(long, allow_negative_numbers = true)]
        token: Token,
        /// Print one JSON object (`released`: true or false).
        #[arg(long)]
        json: bool,
    },
    /// Show one lease (exit 3 if it is not held), or all of them.
    Status {
        /// The lease name (all leases without it).
        #[arg(value_parser = parse_text)]
        name: Option<String>,
        /// Print JSON (an object for one name, an array for all).
        #[arg(long)]
        json: bool,
        /// Only leases held now.
        #[arg(long, conflicts_with_all = ["expired", "name"])]
        held: bool,
        /// Only leases that expired (ended without a release).
        #[arg(long, conflicts_with = "name")]
        expired: bool,
        /// Only names that start with this.
        #[arg(long, conflicts_with = "name")]
        prefix: Option<String>,
        /// At most this many leases (by name).
        #[arg(long, conflicts_with = "name")]
        limit: Option<usize>,
    },
    /// Hold a lease while CMD runs: renew it, stop CMD if it is lost.
    Run {
        /// The lease name.
        #[arg(value_parser = parse_text)]
        name: String,
        /// Time to live; renewed every third of it while CMD runs.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// Wait this long for the current holder (default: do not wait).
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        wait: Duration,
        /// Who holds it (default: host name and process id).
        #[arg(long, value_parser = parse_text)]
        holder: Option<String>,
        /// Time between SIGTERM and SIGKILL when CMD must stop.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        grace: Duration,
        /// A counted lease: up to N runs of NAME at once, each holding a
        /// slot NAME#k of its own (PGLEASE_NAME is the slot).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: Option<u32>,
        /// Stop CMD after this long (SIGTERM, SIGKILL after --grace) and
        /// exit 124, like timeout(1).
        #[arg(long, value_parser = humantime::parse_duration)]
        timeout: Option<Duration>,
        /// Keep the lease at least this long after acquiring it: if CMD
        /// finishes sooner, the lease expires then instead of being
        /// released, so that the same job started elsewhere meanwhile
        /// exits 3 (at most 7 days).
        #[arg(long, value_parser = parse_min_hold)]
        min_hold: Option<Duration>,
        /// The command and its arguments.
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
    /// NAME's recorded transitions, oldest first: acquired, released,
    /// expired, evicted, force_released, value, step_down_requested.
    History {
        /// The lease name.
        #[arg(value_parser = parse_text)]
        name: String,
        /// Only those of the last D (e.g. 1h, 7days).
        #[arg(long, value_parser = humantime::parse_duration)]
        since: Option<Duration>,
        /// Print one JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Break-glass: end NAME at once and move its fence, so its holder's
    /// token is stale (exit 3 if nobody holds it). Administrators only.
    ForceRelease {
        /// The lease name.
        #[arg(value_parser = parse_text)]
        name: String,
        /// Why (recorded in the history; 1 to 1000 bytes).
        #[arg(long, value_parser = parse_reason)]
        reason: String,
        /// Print one JSON object: `name` and `token` (the token ended, or
        /// null if nobody held the lease).
        #[arg(long)]
        json: bool,
    },
    /// Who leads NAME: holder, token and value (exit 3 if nobody).
    Leader {
        /// The lease name.
        #[arg(value_parser = parse_text)]
        name: String,
        /// Print one JSON object (as `status --json`).
        #[arg(long)]
        json: bool,
    },
    /// Print NAME's state, then every change (acquired, value, step-down
    /// requested, released, expired), one JSON object per line, until
    /// interrupted.
    Observe {
        /// The lease name.
        #[arg(value_parser = parse_text)]
        name: String,
    },
    /// Ask the holder of NAME to step down (exit 3 if nobody holds it).
    StepDown {
        /// The lease name.
        #[arg(value_parser = parse_text)]
        name: String,
        /// Who asks (default: host name and process id).
        #[arg(long, value_parser = parse_text)]
        by: Option<String>,
        /// Print one JSON object: `name` and `token` (the term asked, or
        /// null if nobody holds the lease).
        #[arg(long)]
        json: bool,
    },
    /// Campaign for NAME and run CMD while leading: stop it when
    /// leadership is lost or the leader is asked to step down, and
    /// campaign again.
    Elect {
        /// The lease name.
        #[arg(value_parser = parse_text)]
        name: String,
        /// Time to live of each term; renewed every third of it.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// Publish this value with each term (an address, say); CMD gets
        /// it as PGLEASE_VALUE.
        #[arg(long, value_parser = parse_value)]
        value: Option<String>,
        /// Who campaigns (default: host name and process id).
        #[arg(long, value_parser = parse_text)]
        holder: Option<String>,
        /// Time between SIGTERM and SIGKILL when CMD must stop.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        grace: Duration,
        /// How many times a failed CMD is started again (over all terms)
        /// before elect resigns and exits with its status.
        #[arg(long, default_value_t = 3)]
        max_restarts: u32,
        /// The pause before a failed CMD is started again.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        restart_delay: Duration,
        /// The command and its arguments.
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
    /// Print a completion script for SHELL (bash, zsh, fish, elvish,
    /// powershell) to stdout.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to stdout: `pglease man > pglease.1`;
    /// with --dir, write it and one page per command (pglease-COMMAND.1).
    Man {
        /// Write pglease.1 and pglease-COMMAND.1 into this directory.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// The article's failures, live: leases vs advisory locks (about 6 s),
    /// in a scratch database that is created and dropped.
    Demo,
}

/// A lease name, holder or requester, checked before anything connects:
/// 1 to 255 bytes (NUL cannot be passed in an argument).
fn parse_text(text: &str) -> Result<String, String> {
    parse_within(text, pglease::limits::MAX_NAME_BYTES)
}

/// A force release's reason: 1 to 1000 bytes.
fn parse_reason(text: &str) -> Result<String, String> {
    parse_within(text, pglease::limits::MAX_REASON_BYTES)
}

/// A published value: at most 8 KiB (it may be empty).
fn parse_value(text: &str) -> Result<String, String> {
    if text.len() > pglease::limits::MAX_VALUE_BYTES {
        return Err(format!(
            "is {} bytes long; the limit is {} bytes",
            text.len(),
            pglease::limits::MAX_VALUE_BYTES
        ));
    }
    Ok(text.to_owned())
}

fn parse_within(text: &str, limit: usize) -> Result<String, String> {
    if text.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if text.len() > limit {
        return Err(format!(
            "is {} bytes long; the limit is {limit} bytes of UTF-8",
            text.len()
        ));
    }
    Ok(text.to_owned())
}

/// A connection timeout: a `humantime` duration of at most a day.
fn parse_connect_timeout(text: &str) -> Result<Duration, String> {
    let timeout = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if timeout.is_zero() || timeout > Duration::from_secs(86400) {
        return Err("must be greater than zero and at most 1 day".to_owned());
    }
    Ok(timeout)
}

/// A minimum hold: a `humantime` duration from 1 µs to 7 days, like a TTL.
fn parse_min_hold(text: &str) -> Result<Duration, String> {
    let hold = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if hold < Duration::from_micros(1) || hold > pglease::limits::MAX_TTL {
        return Err("must be at least 1 microsecond and at most 7 days".to_owned());
    }
    Ok(hold)
}
