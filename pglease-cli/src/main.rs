//! The `pglease` command-line tool: argument parsing and process handling
//! only; every lease operation lives in the library.

use std::process::{ExitCode, Stdio};
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use pglease::{
    Acquire, Error, Fence, HeldLease, Lease, LeaseManager, LeaseStatus, Token, default_holder,
};
use serde_json::json;
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};
use tokio::signal::unix::{SignalKind, signal};

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

#[derive(Parser, Debug)]
#[command(
    name = "pglease",
    version,
    about = "Leases with fencing tokens enforced by PostgreSQL"
)]
struct Cli {
    /// PostgreSQL URL; without it (and without DATABASE_URL) the libpq
    /// defaults apply: PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD, then
    /// localhost:5432.
    #[arg(long, global = true, env = "DATABASE_URL")]
    database_url: Option<String>,

    /// Give up connecting after this long (exit status 5).
    #[arg(long, global = true, default_value = "10s", value_parser = parse_connect_timeout)]
    connect_timeout: Duration,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create or upgrade the `pglease` schema.
    Migrate,
    /// Acquire a lease (exit 3 if it is held).
    Acquire {
        /// The lease name.
        name: String,
        /// How long the lease lasts unless renewed (e.g. 30s, 5m).
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// Who holds it (default: host name and process id).
        #[arg(long)]
        holder: Option<String>,
        /// Wait this long for the current holder to release it.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        wait: Duration,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Extend a lease held under TOKEN (exit 4 if it is lost).
    Renew {
        /// The lease name.
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
        name: String,
        /// The token from `acquire`.
        #[arg(long, allow_negative_numbers = true)]
        token: Token,
    },
    /// Show one lease, or all of them.
    Status {
        /// The lease name (all leases without it).
        name: Option<String>,
        /// Print JSON (an object for one name, an array for all).
        #[arg(long)]
        json: bool,
    },
    /// Hold a lease while CMD runs: renew it, stop CMD if it is lost.
    Run {
        /// The lease name.
        name: String,
        /// Time to live; renewed every third of it while CMD runs.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// Wait this long for the current holder (default: do not wait).
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        wait: Duration,
        /// Who holds it (default: host name and process id).
        #[arg(long)]
        holder: Option<String>,
        /// Time between SIGTERM and SIGKILL when CMD must stop.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        grace: Duration,
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
    /// The article's failures, live: leases vs advisory locks (under 30 s),
    /// in a scratch database that is created and dropped.
    Demo,
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
    if hold < Duration::from_micros(1) || hold > pglease::MAX_TTL {
        return Err("must be at least 1 microsecond and at most 7 days".to_owned());
    }
    Ok(hold)
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // An empty DATABASE_URL means "not set".
    let cli = Cli {
        database_url: cli.database_url.filter(|url| !url.is_empty()),
        ..cli
    };
    let options = match &cli.database_url {
        Some(url) => match url.parse::<PgConnectOptions>() {
            Ok(options) => options,
            Err(e) => {
                eprintln!("pglease: invalid database URL (--database-url or DATABASE_URL): {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        },
        None => pglease::libpq_defaults(),
    };
    if let Command::Demo = cli.command {
        return demo(&options, cli.connect_timeout).await;
    }
    let manager = match connect(&options, cli.connect_timeout).await {
        Ok(manager) => manager,
        Err(code) => return code,
    };
    let code = match cli.command {
        Command::Migrate => migrate(&manager).await,
        Command::Acquire {
            name,
            ttl,
            holder,
            wait,
            json,
        } => acquire(&manager, &name, ttl, holder, wait, json).await,
        Command::Renew {
            name,
            token,
            ttl,
            json,
        } => renew(&manager, &name, token, ttl, json).await,
        Command::Release { name, token } => match Fence::new(name, token) {
            Ok(fence) => release(&manager, &fence).await,
            Err(e) => Err((e, "release")),
        },
        Command::Status { name, json } => status(&manager, name.as_deref(), json).await,
        Command::Run {
            name,
            ttl,
            wait,
            holder,
            grace,
            min_hold,
            cmd,
        } => {
            let holder = holder.unwrap_or_else(default_holder);
            let timing = RunTiming {
                ttl,
                wait,
                grace,
                min_hold,
            };
            run(&manager, &cli.database_url, &name, &holder, timing, &cmd).await
        }
        Command::Demo => unreachable!("handled above"),
    };
    match code {
        Ok(code) => code,
        Err((e, what)) => fail(&e, what),
    }
}

type Outcome = Result<ExitCode, (Error, &'static str)>;

/// Maps a library error to a message and an exit status.
fn fail(e: &Error, what: &str) -> ExitCode {
    match e {
        Error::InvalidInput { .. } => {
            eprintln!("pglease: {e}");
            ExitCode::from(EXIT_USAGE)
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
            ExitCode::from(EXIT_DATABASE)
        }
        _ => {
            eprintln!("pglease: {what} failed: {e}");
            ExitCode::from(EXIT_DATABASE)
        }
    }
}

/// Connects through the library: a refused connection or a failed login is
/// reported at once with its cause; `timeout` applies only to a server
/// that does not answer. The pool's connections abandon a statement still
/// waiting in the server once this process is gone (see
/// `pglease::pool_options`), so an interrupted acquisition acquires nothing.
async fn connect(options: &PgConnectOptions, timeout: Duration) -> Result<LeaseManager, ExitCode> {
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
            eprintln!(
                "pglease: cannot connect to PostgreSQL at {}:{}: {e}\n{next}",
                options.get_host(),
                options.get_port()
            );
            ExitCode::from(EXIT_DATABASE)
        })
}

/// Applies the schema, then says whether a takeover from a holder frozen
/// inside a fenced transaction can work here (see the README).
async fn migrate(manager: &LeaseManager) -> Outcome {
    manager.migrate().await.map_err(|e| (e, "migrate"))?;
    eprintln!("pglease: schema is up to date");
    let can_end = manager
        .can_end_stale_transactions()
        .await
        .map_err(|e| (e, "migrate"))?;
    if !can_end {
        let owner: String = sqlx::query_scalar(
            "SELECT r.rolname::text FROM pg_proc AS p JOIN pg_roles AS r ON r.oid = p.proowner \
              WHERE p.oid = 'pglease.acquire(text, text, interval)'::regprocedure",
        )
        .fetch_one(manager.pool())
        .await
        .map_err(|e| (Error::from(e), "migrate"))?;
        eprintln!(
            "pglease: note: role {owner:?}, which owns the pglease functions, is neither a \
             superuser nor a member of pg_signal_backend. An expired lease whose holder froze \
             inside a fenced transaction then stays pinned until that transaction ends (and \
             acquire reports it as pinned) unless the holders connect as {owner:?} itself. \
             To allow the takeover, a superuser runs: GRANT pg_signal_backend TO {owner};"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `pglease release`: exit 0 if this ended the lease, 4 if it was not held.
async fn release(manager: &LeaseManager, fence: &Fence) -> Outcome {
    match manager.release(fence).await {
        Ok(true) => Ok(ExitCode::SUCCESS),
        Ok(false) => {
            eprintln!(
                "pglease: lease {:?} was not held under token {} (already released, \
                     expired, or taken over): nothing to release",
                fence.name(),
                fence.token()
            );
            Ok(ExitCode::from(EXIT_LOST))
        }
        Err(e) => Err((e, "release")),
    }
}

fn lease_json(
    name: &str,
    holder: Option<&str>,
    token: Option<Token>,
    expires_at: Option<DateTime<Utc>>,
) -> serde_json::Value {
    json!({
        "name": name,
        "holder": holder,
        "token": token.map(Token::get),
        "expires_at": expires_at.map(|t| t.to_rfc3339()),
    })
}

fn print_lease(lease: &Lease, json: bool) {
    if json {
        println!(
            "{}",
            lease_json(
                lease.name(),
                Some(lease.holder()),
                Some(lease.token()),
                Some(lease.expires_at())
            )
        );
    } else {
        println!(
            "acquired {:?} for {:?}: token {} until {}",
            lease.name(),
            lease.holder(),
            lease.token(),
            lease.expires_at().to_rfc3339()
        );
    }
}

/// Tells the user, on stderr, who holds the lease and how long pglease waits.
fn announce_wait(name: &str, current: &str, expires_at: DateTime<Utc>, wait: Duration) {
    eprintln!(
        "pglease: {name:?} is held by {current:?} until {}; waiting up to {}",
        expires_at.to_rfc3339(),
        humantime::format_duration(wait)
    );
}

/// `attempt(Duration::ZERO)` first, so that a wait can be announced; then,
/// if the lease is held and `wait` allows it, `attempt(wait)`.
async fn announced<T, F, Fut>(name: &str, wait: Duration, attempt: F) -> Result<T, Error>
where
    F: Fn(Duration) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    match attempt(Duration::ZERO).await {
        Err(Error::Held {
            holder: current,
            expires_at,
            ..
        }) if !wait.is_zero() => {
            announce_wait(name, &current, expires_at, wait);
            attempt(wait).await
        }
        Err(e @ Error::Pinned { .. }) if !wait.is_zero() => {
            eprintln!(
                "pglease: {e}; waiting up to {}",
                humantime::format_duration(wait)
            );
            attempt(wait).await
        }
        other => other,
    }
}

async fn acquire(
    manager: &LeaseManager,
    name: &str,
    ttl: Duration,
    holder: Option<String>,
    wait: Duration,
    json: bool,
) -> Outcome {
    let holder = holder.unwrap_or_else(default_holder);
    // Without --wait one attempt; the library starts its release listener
    // only once an attempt with time to wait has failed.
    let attempt = |wait: Duration| {
        let how = Acquire::ttl(ttl).holder(holder.as_str()).wait(wait);
        manager.acquire(name, how)
    };
    match announced(name, wait, attempt).await {
        Ok(lease) => {
            print_lease(&lease, json);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            // The lease as found, in JSON, when it was held or pinned.
            let found = match &e {
                Error::Held {
                    holder, expires_at, ..
                } => Some(lease_json(name, Some(holder), None, Some(*expires_at))),
                Error::Pinned {
                    holder, ended_at, ..
                } => Some(lease_json(name, holder.as_deref(), None, Some(*ended_at))),
                _ => None,
            };
            if let (true, Some(found)) = (json, found) {
                println!("{found}");
            }
            not_acquired(e, "acquire")
        }
    }
}

async fn renew(
    manager: &LeaseManager,
    name: &str,
    token: Token,
    ttl: Duration,
    json: bool,
) -> Outcome {
    let fence = Fence::new(name, token).map_err(|e| (e, "renew"))?;
    match manager.renew(&fence, ttl).await {
        Ok(expires_at) => {
            if json {
                let status = manager.inspect(name).await.map_err(|e| (e, "renew"))?;
                println!(
                    "{}",
                    lease_json(
                        name,
                        status.holder.as_deref(),
                        Some(token),
                        Some(expires_at)
                    )
                );
            } else {
                println!(
                    "renewed {name:?} under token {token} until {}",
                    expires_at.to_rfc3339()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ Error::Lost { .. }) => {
            eprintln!("pglease: {e}; acquire it again for a new token");
            Ok(ExitCode::from(EXIT_LOST))
        }
        Err(e) => Err((e, "renew")),
    }
}

fn status_json(s: &LeaseStatus) -> serde_json::Value {
    let mut value = lease_json(&s.name, s.holder.as_deref(), s.token, s.expires_at);
    value["held"] = json!(s.held);
    value["remaining_ms"] = json!(s.remaining.map(|r| r.as_millis() as u64));
    value
}

async fn status(manager: &LeaseManager, name: Option<&str>, json: bool) -> Outcome {
    let leases = match name {
        Some(name) => vec![manager.inspect(name).await.map_err(|e| (e, "status"))?],
        None => manager.list().await.map_err(|e| (e, "status"))?,
    };
    if json {
        let value = match name {
            Some(_) => status_json(&leases[0]),
            None => serde_json::Value::Array(leases.iter().map(status_json).collect()),
        };
        println!("{value}");
        return Ok(ExitCode::SUCCESS);
    }
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(manager.pool())
        .await
        .map_err(|e| (Error::from(e), "status"))?;
    println!("{:<32} {:<28} {:>10}  EXPIRES", "NAME", "HOLDER", "TOKEN");
    for s in &leases {
        let expires = match (s.expires_at, s.held) {
            (None, _) => "never acquired".to_owned(),
            (Some(at), true) => format!("in {}", short((at - now).to_std().unwrap_or_default())),
            (Some(at), false) if s.holder.is_none() => {
                format!(
                    "released {} ago",
                    short((now - at).to_std().unwrap_or_default())
                )
            }
            (Some(at), false) => format!(
                "expired {} ago",
                short((now - at).to_std().unwrap_or_default())
            ),
        };
        println!(
            "{:<32} {:<28} {:>10}  {expires}",
            s.name,
            s.holder.as_deref().unwrap_or("-"),
            s.token.map_or("-".to_owned(), |t| t.to_string()),
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A duration rounded to what a person reads: 1h 2m, 3m 4s, 5.6s.
fn short(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 3600 {
        format!("{}h {}m", secs / 3600, secs % 3600 / 60)
    } else if secs >= 60 {
        format!("{}m {}s", secs / 60, secs % 60)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// The exit status that reports `status` of CMD: its code, or 128+N for
/// signal N.
fn child_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        (None, Some(signal)) => ExitCode::from(u8::try_from(128 + signal).unwrap_or(255)),
        (None, None) => ExitCode::from(1),
    }
}

fn signal_group(pgid: Pid, signal: Signal) {
    // The group may already be gone; nothing else to do then.
    let _ = killpg(pgid, signal);
}

/// The durations of `run`, each with its own role.
struct RunTiming {
    ttl: Duration,
    wait: Duration,
    grace: Duration,
    min_hold: Option<Duration>,
}

async fn run(
    manager: &LeaseManager,
    database_url: &Option<String>,
    name: &str,
    holder: &str,
    timing: RunTiming,
    cmd: &[String],
) -> Outcome {
    let RunTiming {
        ttl,
        wait,
        grace,
        min_hold,
    } = timing;
    // Signals are watched from the start, so that none is lost while
    // waiting for the lease.
    let (Ok(mut sigterm), Ok(mut sigint), Ok(mut sighup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        eprintln!("pglease: cannot watch for signals");
        return Ok(ExitCode::from(EXIT_DATABASE));
    };
    // The first attempt, and the wait if one is allowed. A signal ends
    // either at once (also while an attempt is stuck in the database) and
    // CMD never starts; the server abandons an attempt still waiting in it
    // once this process has exited (see `ABANDON_WHEN_GONE`).
    let acquisition = announced(name, wait, |wait| {
        manager.hold(name, Acquire::ttl(ttl).holder(holder).wait(wait))
    });
    let held: HeldLease = tokio::select! {
        held = acquisition => match held {
            Ok(held) => held,
            Err(e) => return not_acquired(e, "run"),
        },
        _ = sigterm.recv() => return interrupted(name, 15),
        _ = sigint.recv() => return interrupted(name, 2),
        _ = sighup.recv() => return interrupted(name, 1),
    };
    // After the database's decision: a minimum hold counted from here ends
    // no earlier than acquisition + min_hold on the database clock.
    let acquired = tokio::time::Instant::now();

    let mut command = tokio::process::Command::new(&cmd[0]);
    command
        .args(&cmd[1..])
        .process_group(0)
        .stdin(Stdio::inherit())
        .env("PGLEASE_NAME", name)
        .env("PGLEASE_TOKEN", held.token().to_string())
        .env("PGLEASE_HOLDER", holder);
    if let Some(url) = database_url {
        command.env("PGLEASE_DATABASE_URL", url);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("pglease: cannot start {:?}: {e}", cmd[0]);
            let _ = held.release().await;
            return Ok(ExitCode::from(EXIT_CANNOT_START));
        }
    };
    let Some(pgid) = child.id().map(|id| Pid::from_raw(id as i32)) else {
        let _ = held.release().await;
        return Ok(ExitCode::from(EXIT_CANNOT_START));
    };

    // Wait for CMD, whatever else happens meanwhile: a lost lease stops it
    // (SIGTERM, SIGKILL after the grace period); a signal to pglease is
    // forwarded, and a second one kills the group.
    let mut lost: Option<pglease::LossReason> = None;
    let mut forwarded = false;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let status = loop {
        let deadline =
            kill_at.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86400));
        tokio::select! {
            biased;
            status = child.wait() => break status,
            reason = held.lost(), if lost.is_none() => {
                eprintln!(
                    "pglease: lease {name:?} (token {}) lost: {reason}; stopping the command \
                     (SIGTERM, then SIGKILL after {})",
                    held.token(),
                    humantime::format_duration(grace)
                );
                lost = Some(reason);
                signal_group(pgid, Signal::SIGTERM);
                kill_at = Some(tokio::time::Instant::now() + grace);
            }
            () = tokio::time::sleep_until(deadline), if kill_at.is_some() => {
                signal_group(pgid, Signal::SIGKILL);
                kill_at = None;
            }
            _ = sigterm.recv() => forward(pgid, Signal::SIGTERM, &mut forwarded),
            _ = sigint.recv() => forward(pgid, Signal::SIGINT, &mut forwarded),
            _ = sighup.recv() => forward(pgid, Signal::SIGHUP, &mut forwarded),
        }
    };
    if lost.is_some() {
        // Members of the group that outlived its leader go too.
        signal_group(pgid, Signal::SIGKILL);
    }
    let keep = min_hold
        .filter(|_| lost.is_none())
        .and_then(|hold| hold.checked_sub(acquired.elapsed()))
        .filter(|left| *left >= Duration::from_micros(1));
    match keep {
        Some(left) => expire_after(held, left).await,
        None => release_after(held).await,
    }
    if lost.is_some() {
        return Ok(ExitCode::from(EXIT_LOST));
    }
    match status {
        Ok(status) => Ok(child_code(status)),
        Err(e) => {
            eprintln!("pglease: lost track of the command: {e}; killed its process group");
            signal_group(pgid, Signal::SIGKILL);
            Ok(ExitCode::from(1))
        }
    }
}

/// A signal before CMD started: exit 128 + the signal's number.
fn interrupted(name: &str, signal: u8) -> Outcome {
    eprintln!("pglease: interrupted before {name:?} was acquired; the command did not run");
    Ok(ExitCode::from(128 + signal))
}

/// Forwards `signal` to CMD's group; a second signal kills the group.
fn forward(pgid: Pid, signal: Signal, forwarded: &mut bool) {
    if *forwarded {
        signal_group(pgid, Signal::SIGKILL);
    } else {
        signal_group(pgid, signal);
        *forwarded = true;
    }
}

/// Exit 3 with the reason for an acquisition refused (held, pinned, or
/// lost before it could be confirmed); any other error is `what` failing.
fn not_acquired(e: Error, what: &'static str) -> Outcome {
    match e {
        Error::Held {
            name,
            holder,
            expires_at,
        } => eprintln!(
            "pglease: not acquired: {name:?} is held by {holder:?} until {}",
            expires_at.to_rfc3339()
        ),
        Error::Pinned { .. } => eprintln!("pglease: not acquired: {e}"),
        Error::Lost { .. } => eprintln!(
            "pglease: not acquired: the answer came later than a third of the TTL, and the \
             lease had expired before a renewal could confirm it ({e}); use a --ttl well above \
             the time a round trip to the database takes"
        ),
        e => return Err((e, what)),
    }
    Ok(ExitCode::from(EXIT_NOT_ACQUIRED))
}

/// The minimum hold: the lease is left to expire `left` from now instead of
/// being released.
async fn expire_after(held: HeldLease, left: Duration) {
    let name = held.name().to_owned();
    match tokio::time::timeout(Duration::from_secs(10), held.expire_in(left)).await {
        Ok(Ok(expires_at)) => eprintln!(
            "pglease: keeping {name:?} until {} (--min-hold)",
            expires_at.to_rfc3339()
        ),
        Ok(Err(e)) => eprintln!("pglease: could not keep {name:?} for --min-hold ({e})"),
        Err(_) => eprintln!(
            "pglease: no answer when keeping {name:?} for --min-hold; it ends at its expiry"
        ),
    }
}

async fn release_after(held: HeldLease) {
    let name = held.name().to_owned();
    match tokio::time::timeout(Duration::from_secs(10), held.release()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => eprintln!("pglease: could not release {name:?} ({e}); it ends at its expiry"),
        Err(_) => eprintln!("pglease: no answer to the release of {name:?}; it ends at its expiry"),
    }
}

/// Runs the demo in a scratch database created for it and dropped after.
async fn demo(options: &PgConnectOptions, timeout: Duration) -> ExitCode {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let scratch = format!("pglease_demo_{}_{nanos}", std::process::id());
    let admin = tokio::time::timeout(timeout, options.connect()).await;
    let mut admin = match admin {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            eprintln!(
                "pglease: cannot connect to PostgreSQL: {e}\n\
                 Set --database-url or DATABASE_URL (or PGHOST, PGPORT, PGUSER, PGDATABASE) \
                 to a reachable server."
            );
            return ExitCode::from(EXIT_DATABASE);
        }
        Err(_) => {
            eprintln!(
                "pglease: connecting to PostgreSQL timed out after {}",
                humantime::format_duration(timeout)
            );
            return ExitCode::from(EXIT_DATABASE);
        }
    };
    if let Err(e) = sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {scratch}")))
        .execute(&mut admin)
        .await
    {
        eprintln!(
            "pglease: the demo needs a scratch database and could not create one: {e}\n\
             Connect as a role with CREATEDB."
        );
        return ExitCode::from(EXIT_DATABASE);
    }
    println!("pglease demo in scratch database {scratch} (dropped at the end)\n");
    let code = demo_in(&options.clone().database(&scratch), timeout).await;
    let dropped = sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {scratch} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await;
    let _ = admin.close().await;
    if let Err(e) = dropped {
        eprintln!("pglease: could not drop the scratch database {scratch}: {e}");
    }
    code
}

async fn demo_in(options: &PgConnectOptions, timeout: Duration) -> ExitCode {
    let manager = match connect(options, timeout).await {
        Ok(manager) => manager,
        Err(code) => return code,
    };
    let outcome = async {
        manager.migrate().await?;
        println!("1. The article's failure: a paused holder's late write\n");
        pglease_cli::demo::paused_holder(&manager, "report", Duration::from_millis(300), |line| {
            println!("  {line}")
        })
        .await?;
        println!(
            "\n2. The same failures against a lease, a session advisory lock and a transaction \
             advisory lock, measured now:\n"
        );
        let outcomes = pglease_cli::compare::run(&manager, Duration::from_millis(200), |o| {
            println!(
                "  {} / {}: {} - {}",
                o.scenario.label(),
                o.variant.label(),
                if o.safe { "safe" } else { "UNSAFE" },
                o.detail
            );
        })
        .await?;
        println!("\n{}", pglease_cli::compare::table(&outcomes));
        Ok::<_, Error>(())
    }
    .await;
    manager.pool().close().await;
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pglease: demo failed: {e}");
            ExitCode::from(EXIT_DATABASE)
        }
    }
}
