//! The command line's arguments (clap).

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use pglease::Token;

use crate::output::human;

/// The exit statuses of all commands, for `pglease --help` and
/// pglease(1); each command's own are in `manual.rs`.
pub(crate) const EXIT_STATUSES: &str = "\
Exit status:
  0    done (acquired, renewed, released, held, forced, ...); share:
       stopped by a signal, its commands stopped and the group left
  1    doctor: a check is not ok; elect, run: the command's own status
  2    bad usage or input (nothing was changed); step-down: held shared
       or counted
  3    not acquired: held by another (acquire, run); hand-over: the
       successor does not wait; share: the member name is in use
       (--conflict-exit-code sets it for these four); nobody holds it
       (status NAME, leader, step-down, force-release)
  4    lease lost (renew, release, hand-over, run)
  5    database unreachable or failing, the schema missing (run migrate),
       or a privilege missing
  124  run --timeout: the command ran out of time
  127  run, elect, share: the command cannot be started
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

    /// Give up connecting after this long (exit status 5) [default: the
    /// URL's connect_timeout, else PGCONNECT_TIMEOUT, else 10s].
    #[arg(long, global = true, value_parser = Checked(connect_timeout), allow_hyphen_values = true)]
    pub(crate) connect_timeout: Option<Duration>,

    /// Print nothing but errors and the requested output (no progress
    /// or confirmation on stderr).
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,

    /// The exit status for "held by another" (acquire, run, share: the
    /// member name in use), instead of 3
    /// (like `flock -E`: a skipped cron run need not look like a failure).
    #[arg(long, global = true, default_value_t = 3, value_parser = Checked(exit_code))]
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
    Doctor(DoctorArgs),
    /// Acquire a lease (exit 3 if it is held).
    Acquire(AcquireArgs),
    /// Extend a lease held under TOKEN (exit 4 if it is lost).
    Renew {
        /// The lease name.
        #[arg(value_parser = Checked(text))]
        name: String,
        /// The token from `acquire`.
        #[arg(long, allow_negative_numbers = true, value_parser = Checked(token))]
        token: Token,
        /// The new time to live from now.
        #[arg(long, value_parser = Checked(ttl), allow_hyphen_values = true)]
        ttl: Duration,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// End a lease held under TOKEN (exit 4 if it was not held).
    Release {
        /// The lease name.
        #[arg(value_parser = Checked(text))]
        name: String,
        /// The token from `acquire`.
        #[arg(long, allow_negative_numbers = true, value_parser = Checked(token))]
        token: Token,
        /// Print one JSON object (`released`: true or false).
        #[arg(long)]
        json: bool,
    },
    /// Move a lease held under TOKEN to SUCCESSOR, waiting in its line
    /// (`run --fair --holder SUCCESSOR`), with a new token; the old one is
    /// refused at once. Exit 3 if SUCCESSOR does not wait (the lease is
    /// then kept, or released with --or-release), 4 if it was not held.
    HandOver {
        /// The lease name.
        #[arg(value_parser = Checked(text))]
        name: String,
        /// The token from `acquire`.
        #[arg(long, allow_negative_numbers = true, value_parser = Checked(token))]
        token: Token,
        /// The successor, by its holder name.
        #[arg(long = "to", value_parser = Checked(text), value_name = "SUCCESSOR")]
        successor: String,
        /// The successor's time to live until it renews.
        #[arg(long, value_parser = Checked(ttl), allow_hyphen_values = true)]
        ttl: Duration,
        /// Release the lease when SUCCESSOR does not wait (by default it is
        /// kept, unchanged: a mistyped name costs nothing).
        #[arg(long)]
        or_release: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Make every waiter for NAME wait in line, first come, first served
    /// (`on`), or not (`off`). Administrators only (exit 5 otherwise).
    SetFair {
        /// The lease name.
        #[arg(value_parser = Checked(text))]
        name: String,
        /// `on` or `off`.
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(["on", "off"]))]
        setting: String,
    },
    /// Make TABLE, or a migration tool's version table (--tool), reject
    /// writes from transactions and sessions that do not hold lease NAME
    /// (declared with assert_held, or by `run --declare`); --ddl also
    /// turns the DDL fence on (a superuser's).
    Protect(ProtectArgs),
    /// Undo `protect`: TABLE (or the tool's table) is written freely
    /// again; --ddl turns the DDL fence off.
    Unprotect(UnprotectArgs),
    /// Show one lease (exit 3 if it is not held), all of them, or a lease
    /// group's members and partitions (--group).
    Status(StatusArgs),
    /// Hold a lease while CMD runs: renew it, stop CMD if it is lost.
    Run(RunArgs),
    /// NAME's recorded transitions, oldest first: acquired, released,
    /// expired, evicted, force_released, value, step_down_requested; or
    /// drawn as a timeline (--html, --svg), also from a saved --json
    /// (--from, no database).
    History {
        /// The lease name (with --from: only its rows; all without it).
        #[arg(value_parser = Checked(text), required_unless_present = "from")]
        name: Option<String>,
        /// Only those of the last D (e.g. 1h, 7days).
        #[arg(long, value_parser = Checked(since), allow_hyphen_values = true,
              conflicts_with = "from")]
        since: Option<Duration>,
        /// Print one JSON array.
        #[arg(long, conflicts_with_all = ["html", "svg"])]
        json: bool,
        /// Draw the timeline as an HTML page into FILE (- for stdout).
        #[arg(long, value_name = "FILE")]
        html: Option<std::path::PathBuf>,
        /// Draw the timeline as an SVG image into FILE (- for stdout).
        #[arg(long, value_name = "FILE")]
        svg: Option<std::path::PathBuf>,
        /// Draw from FILE, saved from `history NAME --json` (- for stdin),
        /// without a database; needs --html or --svg.
        #[arg(long, value_name = "FILE", conflicts_with = "json")]
        from: Option<std::path::PathBuf>,
    },
    /// Break-glass: end NAME at once and move its fence, so its holder's
    /// token is stale (exit 3 if nobody holds it). Administrators only.
    ForceRelease {
        /// The lease name.
        #[arg(value_parser = Checked(text))]
        name: String,
        /// Why (recorded in the history; 1 to 1000 bytes).
        #[arg(long, value_parser = Checked(reason))]
        reason: String,
        /// Print one JSON object: `name` and `token` (the token ended, or
        /// null if nobody held the lease).
        #[arg(long)]
        json: bool,
    },
    /// Who leads NAME: holder, token and value (exit 3 if nobody).
    Leader {
        /// The lease name.
        #[arg(value_parser = Checked(text))]
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
        #[arg(value_parser = Checked(text))]
        name: String,
    },
    /// Ask the holder of NAME to step down (exit 3 if nobody holds it).
    StepDown {
        /// The lease name.
        #[arg(value_parser = Checked(text))]
        name: String,
        /// Who asks (default: host name and process id).
        #[arg(long, value_parser = Checked(text))]
        by: Option<String>,
        /// Print one JSON object: `name` and `token` (the term asked, or
        /// null if nobody holds the lease).
        #[arg(long)]
        json: bool,
    },
    /// Campaign for NAME and run CMD while leading: stop it when
    /// leadership is lost or the leader is asked to step down, and
    /// campaign again.
    Elect(ElectArgs),
    /// Join lease group GROUP and run CMD once for each partition this
    /// member owns, sharing GROUP's partitions with the other members.
    ///
    /// Each member (a `share` of GROUP on any host) owns an even share of
    /// the partitions, 0 to M-1. For each partition it owns, CMD runs in a
    /// process group of its own with PGLEASE_GROUP, PGLEASE_MEMBER,
    /// PGLEASE_PARTITION (k), PGLEASE_NAME (the partition's lease name,
    /// GROUP/k) and PGLEASE_TOKEN (its fencing token) in its environment,
    /// and PGLEASE_DATABASE_URL when a URL was given. Standard input is
    /// closed. One line on stderr says each change: a partition assigned
    /// (with its token), revoked, lost, a CMD that exited, and the group
    /// left.
    ///
    /// When a partition must move to another member (a member joined or
    /// left), its CMD gets SIGTERM, SIGKILL after --grace, and the
    /// partition is handed over once CMD has exited; it moves at the end
    /// of --grace in any case, and its token is refused from then on. When
    /// a partition's lease is lost, its CMD is stopped the same way and
    /// share goes on with the others.
    ///
    /// A CMD that exits by itself while its partition is still owned,
    /// whatever its status, is started again after --restart-delay, under
    /// the same token, as a worker pool restarts its workers; the partition
    /// stays with this member. Each start after the first is said on
    /// stderr with its count for that partition.
    ///
    /// On SIGTERM, SIGINT or SIGHUP, share stops every CMD (SIGTERM,
    /// SIGKILL after --grace; a second signal kills them at once), then
    /// leaves the group, handing its partitions over to the other members
    /// at once, and exits 0.
    Share(ShareArgs),
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
    /// The failures a lease must survive, live: leases vs advisory locks (about 6 s),
    /// in a scratch database that is created and dropped.
    Demo,
}

// `pglease doctor`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct DoctorArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
    /// With several hosts: the shortest TTL your leases use, to check a
    /// failover against (default: the shortest among the leases held
    /// now).
    #[arg(long, value_parser = Checked(ttl), allow_hyphen_values = true)]
    pub(crate) ttl: Option<Duration>,
    /// With several hosts: how long a failover takes (detection and
    /// promotion), as measured.
    #[arg(long, value_parser = Checked(pause), allow_hyphen_values = true)]
    pub(crate) failover_time: Option<Duration>,
    /// With several hosts: pg_auto_failover's monitor URL (`pg_autoctl
    /// show uri --monitor`), whose settings give the failover time.
    #[arg(long, value_parser = Checked(monitor))]
    pub(crate) monitor: Option<String>,
    /// With several hosts: Patroni's REST API (`http://HOST:8008`, its
    /// `restapi.connect_address`), whose `GET /config` gives ttl and
    /// loop_wait, and so the failover time.
    #[arg(long, value_parser = Checked(patroni), conflicts_with = "monitor")]
    pub(crate) patroni: Option<String>,
}

// `pglease protect`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct ProtectArgs {
    /// The table, as SQL resolves it (`orders`, `billing.orders`).
    #[arg(value_parser = Checked(text), conflicts_with = "tool", requires = "lease",
          required_unless_present_any = ["tool", "ddl"])]
    pub(crate) table: Option<String>,
    /// The version table of this migration tool: sqlx, refinery, diesel,
    /// alembic, flyway, golang-migrate or liquibase.
    #[arg(long, value_parser = Checked(tool), requires = "lease")]
    pub(crate) tool: Option<String>,
    /// The lease whose holder alone may write the table (needed with a
    /// table).
    #[arg(long, value_parser = Checked(text), value_name = "NAME",
          required_unless_present = "ddl")]
    pub(crate) lease: Option<String>,
    /// Also turn the DDL fence on: each DDL command of a session that
    /// declares a lease is checked under its token.
    #[arg(long)]
    pub(crate) ddl: bool,
}

// `pglease unprotect`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct UnprotectArgs {
    /// The table, as SQL resolves it.
    #[arg(value_parser = Checked(text), conflicts_with = "tool", required_unless_present_any = ["tool", "ddl"])]
    pub(crate) table: Option<String>,
    /// The version table of this migration tool (as for `protect`).
    #[arg(long, value_parser = Checked(tool))]
    pub(crate) tool: Option<String>,
    /// Also turn the DDL fence off.
    #[arg(long)]
    pub(crate) ddl: bool,
}

impl ProtectArgs {
    /// What `protect` was asked to protect, if any table.
    pub(crate) fn table(&self) -> Option<&str> {
        table_or_tools(self.table.as_deref(), self.tool.as_deref())
    }
}

impl UnprotectArgs {
    /// What `unprotect` was asked to unprotect, if any table.
    pub(crate) fn table(&self) -> Option<&str> {
        table_or_tools(self.table.as_deref(), self.tool.as_deref())
    }
}

/// TABLE, or the version table of `--tool`.
fn table_or_tools<'a>(table: Option<&'a str>, tool: Option<&str>) -> Option<&'a str> {
    table.or_else(|| tool.and_then(pglease::schema::version_table))
}

// `pglease acquire`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct AcquireArgs {
    /// The lease name.
    #[arg(value_parser = Checked(text))]
    pub(crate) name: String,
    /// How long the lease lasts unless renewed (e.g. 30s, 5m).
    #[arg(long, value_parser = Checked(ttl), allow_hyphen_values = true)]
    pub(crate) ttl: Duration,
    /// Who holds it (default: "HOST (pglease acquire)": this process
    /// exits at once, so its id would name nobody).
    #[arg(long, value_parser = Checked(text))]
    pub(crate) holder: Option<String>,
    /// Wait this long for the current holder to release it.
    #[arg(long, default_value = "0s", value_parser = Checked(wait), allow_hyphen_values = true)]
    pub(crate) wait: Duration,
    /// Publish this value with the lease (at most 8 KiB), for anyone to
    /// read in `status`.
    #[arg(long, value_parser = Checked(value))]
    pub(crate) value: Option<String>,
    /// A counted lease: one of N slots NAME#k (the output names it; 1 to
    /// 1000).
    #[arg(long, value_parser = Checked(limit))]
    pub(crate) limit: Option<u32>,
    /// Shared: beside other shared holders, while no exclusive holder
    /// holds it (renew and release with the token as usual).
    #[arg(long, conflicts_with_all = ["limit", "value"])]
    pub(crate) shared: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

// `pglease status`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    /// The lease name (all leases without it).
    #[arg(value_parser = Checked(text))]
    pub(crate) name: Option<String>,
    /// A lease group instead: its members, the partitions each owns, and
    /// the free ones.
    #[arg(long, value_parser = Checked(text),
          conflicts_with_all = ["name", "held", "expired", "prefix", "limit"])]
    pub(crate) group: Option<String>,
    /// Print JSON (an object for one name, an array for all).
    #[arg(long)]
    pub(crate) json: bool,
    /// Only leases held now.
    #[arg(long, conflicts_with_all = ["expired", "name"])]
    pub(crate) held: bool,
    /// Only leases that expired (ended without a release).
    #[arg(long, conflicts_with = "name")]
    pub(crate) expired: bool,
    /// Only names that start with this.
    #[arg(long, conflicts_with = "name")]
    pub(crate) prefix: Option<String>,
    /// At most this many leases (by name).
    #[arg(long, conflicts_with = "name")]
    pub(crate) limit: Option<usize>,
}

// `pglease run`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// The lease name; several names take every lease or none (at most
    /// 100; CMD gets PGLEASE_NAME_k and PGLEASE_TOKEN_k, k = 1..N in
    /// the order given).
    #[arg(value_parser = Checked(text), required = true, num_args = 1.., value_name = "NAME")]
    pub(crate) names: Vec<String>,
    /// Time to live; renewed every third of it while CMD runs.
    #[arg(long, value_parser = Checked(ttl), allow_hyphen_values = true)]
    pub(crate) ttl: Duration,
    /// Wait this long for the current holder (default: do not wait).
    #[arg(long, default_value = "0s", value_parser = Checked(wait), allow_hyphen_values = true)]
    pub(crate) wait: Duration,
    /// Who holds it (default: host name and process id).
    #[arg(long, value_parser = Checked(text))]
    pub(crate) holder: Option<String>,
    /// Time between SIGTERM and SIGKILL when CMD must stop.
    #[arg(long, default_value = "10s", value_parser = Checked(grace), allow_hyphen_values = true)]
    pub(crate) grace: Duration,
    /// A counted lease: up to N runs of NAME at once, each holding a
    /// slot NAME#k of its own (PGLEASE_NAME is the slot; 1 to 1000).
    #[arg(long, value_parser = Checked(limit))]
    pub(crate) limit: Option<u32>,
    /// Stop CMD after this long (SIGTERM, SIGKILL after --grace) and
    /// exit 124, like timeout(1).
    #[arg(long, value_parser = Checked(run_timeout), allow_hyphen_values = true)]
    pub(crate) timeout: Option<Duration>,
    /// Keep the lease at least this long after acquiring it: if CMD
    /// finishes sooner, the lease expires then instead of being
    /// released, so that the same job started elsewhere meanwhile
    /// exits 3 (at most 7 days).
    #[arg(long, value_parser = Checked(min_hold), allow_hyphen_values = true)]
    pub(crate) min_hold: Option<Duration>,
    /// Bind the lease to this process's database session: when the
    /// process dies (even by SIGKILL) or its connection ends, the next
    /// acquirer takes the lease at once instead of after the TTL. A
    /// connection that drops also loses the lease (CMD is stopped,
    /// exit 4).
    #[arg(long, conflicts_with = "min_hold")]
    pub(crate) session_bound: bool,
    /// First come, first served: while waiting (--wait), take a place in
    /// the line for the lease and get it in turn; stderr reports the
    /// position. Without it, waiters race on each release.
    #[arg(long, conflicts_with = "limit")]
    pub(crate) fair: bool,
    /// With --fair: exit 3 instead of joining a line that N already wait
    /// in (1 to 1000).
    #[arg(long, requires = "fair", value_parser = Checked(max_waiting))]
    pub(crate) max_waiting: Option<u32>,
    /// Shared: run beside other shared runs of NAME, while no exclusive
    /// run holds it; CMD also gets PGLEASE_SHARED=1 and checks its token
    /// with pglease.assert_shared (it may read, not write, under it).
    #[arg(long, conflicts_with_all = ["limit", "session_bound", "fair"])]
    pub(crate) shared: bool,
    /// Every database session CMD opens declares the lease, with no
    /// change to CMD (PGOPTIONS and PGAPPNAME): its writes to protected
    /// tables, and its DDL where the DDL fence is on, are checked under
    /// the token, and a takeover after the lease expired ends those
    /// sessions.
    #[arg(long, conflicts_with_all = ["shared", "limit"])]
    pub(crate) declare: bool,
    /// Serve /healthz, /readyz, /lease and /metrics over HTTP on ADDR
    /// (HOST:PORT, or PORT alone for 127.0.0.1:PORT; port 0 picks a free
    /// one, said on stderr).
    #[arg(long, value_name = "ADDR", value_parser = Checked(http))]
    pub(crate) http: Option<std::net::SocketAddr>,
    /// The command and its arguments.
    #[arg(required = true, last = true)]
    pub(crate) cmd: Vec<String>,
}

// `pglease share`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct ShareArgs {
    /// The group's name: partition k's lease is GROUP/k.
    #[arg(value_parser = Checked(text))]
    pub(crate) group: String,
    /// How many partitions the group has (1 to 100000); every member gives
    /// the same.
    #[arg(long, value_parser = Checked(partitions))]
    pub(crate) partitions: u32,
    /// Time to live of the membership and of each partition's lease;
    /// renewed every third of it.
    #[arg(long, value_parser = Checked(ttl), allow_hyphen_values = true)]
    pub(crate) ttl: Duration,
    /// Time between SIGTERM and SIGKILL when a partition's CMD must stop;
    /// a revoked partition moves at its end in any case.
    #[arg(long, default_value = "5s", value_parser = Checked(group_grace), allow_hyphen_values = true)]
    pub(crate) grace: Duration,
    /// This member's name, unique in the group (default: HOST:PID#1, the
    /// host name and process id).
    #[arg(long, value_parser = Checked(text))]
    pub(crate) member: Option<String>,
    /// The pause before a CMD that exited by itself is started again.
    #[arg(long, default_value = "1s", value_parser = Checked(pause), allow_hyphen_values = true)]
    pub(crate) restart_delay: Duration,
    /// Serve /healthz, /readyz, /lease and /metrics over HTTP on ADDR
    /// (HOST:PORT, or PORT alone for 127.0.0.1:PORT; port 0 picks a free
    /// one, said on stderr).
    #[arg(long, value_name = "ADDR", value_parser = Checked(http))]
    pub(crate) http: Option<std::net::SocketAddr>,
    /// The command and its arguments, run once per partition owned.
    #[arg(required = true, last = true)]
    pub(crate) cmd: Vec<String>,
}

impl ShareArgs {
    /// What clap cannot check: the lease names the group makes fit the
    /// name limit.
    pub(crate) fn check(&self) -> Result<(), String> {
        let limit = pglease::limits::MAX_NAME_BYTES;
        let mut names = vec![pglease::partition_name(
            &self.group,
            self.partitions.saturating_sub(1),
        )];
        if let Some(member) = &self.member {
            names.push(pglease::member_name(&self.group, member));
        }
        for name in names {
            if name.len() > limit {
                return Err(format!(
                    "GROUP makes the lease name {}, {} bytes long; the limit is {limit} bytes",
                    quoted(&name),
                    name.len()
                ));
            }
        }
        Ok(())
    }
}

// `pglease elect`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct ElectArgs {
    /// The lease name.
    #[arg(value_parser = Checked(text))]
    pub(crate) name: String,
    /// Time to live of each term; renewed every third of it.
    #[arg(long, value_parser = Checked(ttl), allow_hyphen_values = true)]
    pub(crate) ttl: Duration,
    /// Publish this value with each term (an address, say); CMD gets
    /// it as PGLEASE_VALUE.
    #[arg(long, value_parser = Checked(value))]
    pub(crate) value: Option<String>,
    /// Who campaigns (default: host name and process id).
    #[arg(long, value_parser = Checked(text))]
    pub(crate) holder: Option<String>,
    /// Time between SIGTERM and SIGKILL when CMD must stop.
    #[arg(long, default_value = "10s", value_parser = Checked(grace), allow_hyphen_values = true)]
    pub(crate) grace: Duration,
    /// How many times a failed CMD is started again (over all terms)
    /// before elect resigns and exits with its status.
    #[arg(long, default_value_t = 3)]
    pub(crate) max_restarts: u32,
    /// The pause before a failed CMD is started again.
    #[arg(long, default_value = "1s", value_parser = Checked(pause), allow_hyphen_values = true)]
    pub(crate) restart_delay: Duration,
    /// Prefer the candidate whose --holder is this (give every candidate
    /// the same): it campaigns in line, and any other leader hands its
    /// term over to it within about a second of its campaigning (CMD
    /// stopped there, started here).
    #[arg(long, value_parser = Checked(text))]
    pub(crate) prefer: Option<String>,
    /// Every database session CMD opens declares the term's lease, as
    /// with `run --declare`.
    #[arg(long)]
    pub(crate) declare: bool,
    /// Serve /healthz, /readyz, /lease and /metrics over HTTP on ADDR
    /// (HOST:PORT, or PORT alone for 127.0.0.1:PORT; port 0 picks a free
    /// one, said on stderr).
    #[arg(long, value_name = "ADDR", value_parser = Checked(http))]
    pub(crate) http: Option<std::net::SocketAddr>,
    /// The command and its arguments.
    #[arg(required = true, last = true)]
    pub(crate) cmd: Vec<String>,
}

impl RunArgs {
    /// What the arguments cannot mean together, beyond what clap checks
    /// (before anything connects): a name given twice, more names than a
    /// set may have, several names with an option for one lease only.
    pub(crate) fn check(&self) -> Result<(), String> {
        let names = &self.names;
        if names.len() > pglease::limits::MAX_SET_NAMES {
            return Err(format!(
                "{} names given; at most {} leases are taken at once",
                names.len(),
                pglease::limits::MAX_SET_NAMES
            ));
        }
        if let Some((_, twice)) = names
            .iter()
            .enumerate()
            .find(|(i, name)| names[..*i].contains(name))
        {
            return Err(format!("NAME {twice:?} is given twice"));
        }
        if self.fair && self.wait.is_zero() {
            return Err(
                "--fair needs --wait: a place in line is kept only while waiting \
                        (without --wait, run makes one attempt)"
                    .to_owned(),
            );
        }
        if names.len() > 1 {
            for (given, option) in [
                (self.limit.is_some(), "--limit"),
                (self.session_bound, "--session-bound"),
                (self.shared, "--shared"),
                (self.declare, "--declare"),
            ] {
                if given {
                    return Err(format!("{option} takes one NAME, not several"));
                }
            }
        }
        Ok(())
    }

    /// The lease names as the messages quote them: `"a"`, or `"a", "b"`.
    pub(crate) fn quoted(&self) -> String {
        let quoted: Vec<String> = self.names.iter().map(|n| format!("{n:?}")).collect();
        quoted.join(", ")
    }
}

impl Command {
    /// What the arguments cannot mean together beyond what clap checks,
    /// said before anything connects: the subcommand and why.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        match self {
            Command::Run(args) => args.check().map_err(|why| ("run", why)),
            Command::Share(args) => args.check().map_err(|why| ("share", why)),
            _ => Ok(()),
        }
    }

    /// A long-running command's board (`run`, `elect`, `share`), and
    /// the address `--http` serves it on, if given.
    pub(crate) fn board(
        &self,
    ) -> Option<(crate::sidecar::board::Kind, Option<std::net::SocketAddr>)> {
        use crate::sidecar::board::Kind;
        match self {
            Command::Run(args) => Some((Kind::Run, args.http)),
            Command::Elect(args) => Some((Kind::Elect, args.http)),
            Command::Share(args) => Some((Kind::Share, args.http)),
            _ => None,
        }
    }

    /// Whether the command was asked for JSON output.
    pub(crate) fn wants_json(&self) -> bool {
        match self {
            Command::Doctor(DoctorArgs { json, .. })
            | Command::Acquire(AcquireArgs { json, .. })
            | Command::Status(StatusArgs { json, .. })
            | Command::Migrate { json }
            | Command::ForceRelease { json, .. }
            | Command::StepDown { json, .. }
            | Command::Renew { json, .. }
            | Command::Release { json, .. }
            | Command::HandOver { json, .. }
            | Command::History { json, .. }
            | Command::Leader { json, .. } => *json,
            _ => false,
        }
    }
}

/// A value parser that checks an argument before anything connects and,
/// when it is bad, says why without echoing it (a value may be kilobytes
/// long): `invalid --value: is 8193 bytes long; the limit is 8192 bytes`.
#[derive(Clone)]
struct Checked<T: Clone + Send + Sync + 'static>(fn(&str) -> Result<T, String>);

impl<T: Clone + Send + Sync + 'static> clap::builder::TypedValueParser for Checked<T> {
    type Value = T;

    fn parse_ref(
        &self,
        command: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        let what = arg.map_or_else(
            || "argument".to_owned(),
            |arg| match arg.get_long() {
                Some(long) => format!("--{long}"),
                None => arg.get_id().as_str().to_uppercase(),
            },
        );
        let checked = match value.to_str() {
            Some(text) => (self.0)(text),
            None => Err("is not valid UTF-8".to_owned()),
        };
        checked.map_err(|why| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid {what}: {why}\n"),
            )
            .with_cmd(command)
        })
    }
}

/// A migration tool pglease knows the version table of.
fn tool(tool: &str) -> Result<String, String> {
    match pglease::schema::version_table(tool) {
        Some(_) => Ok(tool.to_owned()),
        None => {
            let known: Vec<&str> = pglease::schema::MIGRATION_TOOLS
                .iter()
                .map(|(t, _)| *t)
                .collect();
            Err(format!(
                "{tool:?} is not a tool pglease knows; known: {} (give a tool's table \
                 as TABLE instead)",
                known.join(", ")
            ))
        }
    }
}

/// A lease name, holder or requester: 1 to 255 bytes (NUL cannot be
/// passed in an argument).
fn text(text: &str) -> Result<String, String> {
    within(text, pglease::limits::MAX_NAME_BYTES)
}

/// A force release's reason: 1 to 1000 bytes.
fn reason(text: &str) -> Result<String, String> {
    within(text, pglease::limits::MAX_REASON_BYTES)
}

/// A published value: at most 8 KiB (it may be empty).
fn value(text: &str) -> Result<String, String> {
    if text.len() > pglease::limits::MAX_VALUE_BYTES {
        return Err(format!(
            "is {} bytes long; the limit is {} bytes",
            text.len(),
            pglease::limits::MAX_VALUE_BYTES
        ));
    }
    Ok(text.to_owned())
}

fn within(text: &str, limit: usize) -> Result<String, String> {
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

/// A bad argument as an error names it: quoted when short, by its length
/// when long (it is not echoed).
fn quoted(text: &str) -> String {
    if text.len() <= 40 {
        format!("{text:?}")
    } else {
        format!("a {}-byte argument", text.len())
    }
}

/// A `humantime` duration from `min` to `max`.
fn duration(text: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    if text.trim_start().starts_with('-') {
        return Err("must not be negative".to_owned());
    }
    let d = humantime::parse_duration(text).map_err(|e| {
        format!(
            "{} is not a duration ({e}); say 500ms, 30s, 5m or 2h",
            quoted(text)
        )
    })?;
    if d < min {
        return Err(if min <= Duration::from_nanos(1) {
            "must be greater than zero".to_owned()
        } else {
            format!("must be at least {}, got {}", human(min), human(d))
        });
    }
    if d > max {
        return Err(format!("must be at most {}, got {}", bound(max), human(d)));
    }
    Ok(d)
}

/// An upper bound as docs/cli.md gives it: whole days as days (`365days`,
/// where humantime's 365.25-day years would say `11months 30days 3h 50m
/// 24s`).
fn bound(max: Duration) -> String {
    let secs = max.as_secs();
    if max.subsec_nanos() == 0 && secs >= 86_400 && secs.is_multiple_of(86_400) {
        match secs / 86_400 {
            1 => "1day".to_owned(),
            days => format!("{days}days"),
        }
    } else {
        human(max)
    }
}

/// A TTL ([`pglease::limits::MIN_TTL`] to `MAX_TTL`, the library's limits:
/// a shorter lease would expire about when its acquisition comes back).
fn ttl(text: &str) -> Result<Duration, String> {
    duration(text, pglease::limits::MIN_TTL, pglease::limits::MAX_TTL)
}

/// A token as `acquire` printed it: a whole number above zero.
fn token(text: &str) -> Result<Token, String> {
    text.parse::<Token>().map_err(|e| e.reason().to_owned())
}

/// A whole number from `min` to `max`, said in words when it is not one.
fn whole(text: &str, min: u32, max: u32) -> Result<u32, String> {
    let digits = text.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{} is not a whole number; give one from {min} to {max}",
            quoted(text)
        ));
    }
    match digits.parse::<u32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be from {min} to {max}, got {digits}")),
    }
}

/// `--limit`: 1 to [`pglease::limits::MAX_SLOTS`] slots.
fn limit(text: &str) -> Result<u32, String> {
    whole(text, 1, pglease::limits::MAX_SLOTS)
}

/// `share --partitions`: 1 to [`pglease::limits::MAX_PARTITIONS`].
fn partitions(text: &str) -> Result<u32, String> {
    whole(text, 1, pglease::limits::MAX_PARTITIONS)
}

/// `--max-waiting`: 1 to [`pglease::limits::MAX_WAITING`] waiters.
fn max_waiting(text: &str) -> Result<u32, String> {
    whole(text, 1, pglease::limits::MAX_WAITING)
}

/// `--conflict-exit-code`: an exit status, 0 to 255.
fn exit_code(text: &str) -> Result<u8, String> {
    whole(text, 0, u32::from(u8::MAX)).map(|n| u8::try_from(n).unwrap_or(u8::MAX))
}

/// A monitor's URL, checked as any connection string is.
fn monitor(text: &str) -> Result<String, String> {
    pglease::connect::Target::parse(text)
        .map(|_| text.to_owned())
        .map_err(crate::connect::unusable)
}

/// Patroni's REST API: a plain `http://HOST:PORT` address (pglease reads
/// it without TLS).
fn patroni(text: &str) -> Result<String, String> {
    let rest = text
        .strip_prefix("http://")
        .ok_or_else(|| match text.strip_prefix("https://") {
            Some(_) => "pglease reads Patroni's REST API over plain HTTP only; give an \
                        http:// address, or the failover time (--failover-time D)"
                .to_owned(),
            None => "give Patroni's REST API as http://HOST:PORT (its \
                     restapi.connect_address; 8008 by default)"
                .to_owned(),
        })?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || authority.contains(char::is_whitespace) {
        return Err(format!("no host in {text:?}: give http://HOST:PORT"));
    }
    Ok(text.trim_end_matches('/').to_owned())
}

/// How long to wait for a lease: zero (one attempt) to 7 days.
fn wait(text: &str) -> Result<Duration, String> {
    duration(text, Duration::ZERO, WEEK)
}

/// Time between SIGTERM and SIGKILL: zero to a day.
fn grace(text: &str) -> Result<Duration, String> {
    duration(text, Duration::ZERO, DAY)
}

/// `share --grace`: above zero (a revoked partition moves at its end),
/// at most a day.
fn group_grace(text: &str) -> Result<Duration, String> {
    duration(text, Duration::from_millis(1), DAY)
}

/// A pause before CMD starts again: zero to a day.
fn http(text: &str) -> Result<std::net::SocketAddr, String> {
    let text = text.trim();
    if let Ok(port) = text.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse().map_err(|_| {
        format!(
            "{text:?} is not an address to listen on: give HOST:PORT with an IP address \
             (127.0.0.1:9090, [::1]:9090, 0.0.0.0:9090) or a port alone (9090, for 127.0.0.1)"
        )
    })
}

fn pause(text: &str) -> Result<Duration, String> {
    duration(text, Duration::ZERO, DAY)
}

/// `run --timeout`: above zero, at most a year.
fn run_timeout(text: &str) -> Result<Duration, String> {
    duration(text, Duration::from_nanos(1), YEAR)
}

/// A connection timeout: above zero, at most a day.
fn connect_timeout(text: &str) -> Result<Duration, String> {
    duration(text, Duration::from_nanos(1), DAY)
}

/// A minimum hold: 1 µs to 7 days (it shortens or lengthens the last
/// expiry, so any length a TTL may have, and shorter).
fn min_hold(text: &str) -> Result<Duration, String> {
    duration(text, Duration::from_micros(1), pglease::limits::MAX_TTL)
}

/// `history --since`: above zero, at most ten years.
fn since(text: &str) -> Result<Duration, String> {
    duration(text, Duration::from_nanos(1), 10 * YEAR)
}

const DAY: Duration = Duration::from_secs(86_400);
const WEEK: Duration = Duration::from_secs(7 * 86_400);
const YEAR: Duration = Duration::from_secs(365 * 86_400);
