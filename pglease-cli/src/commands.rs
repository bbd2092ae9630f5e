//! The commands other than `run`: migrate, doctor, acquire, renew, release,
//! status, demo.

use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use pglease::doctor::Verdict;
use pglease::{AcquireOptions, Error, Fence, Lease, LeaseManager, LeaseStatus, ListFilter, Token};
use serde_json::json;
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};

use crate::{
    EXIT_DATABASE, EXIT_LOST, EXIT_NOT_ACQUIRED, EXIT_PROBLEMS, Outcome, connect, note, out,
};

/// Applies the schema, then says whether a takeover from a holder frozen
/// inside a fenced transaction can work here (see the README).
pub(crate) async fn migrate(manager: &LeaseManager, json: bool) -> Outcome {
    let migrated = manager.migrate().await.map_err(|e| (e, "migrate"))?;
    if json {
        out!(
            "{}",
            json!({"applied": migrated.applied, "latest": migrated.latest})
        );
    }
    let span = |v: &[i64]| match (v.first(), v.last()) {
        (Some(first), Some(last)) if first != last => format!("migrations {first} to {last}"),
        (Some(only), _) => format!("migration {only}"),
        _ => String::new(),
    };
    match migrated.applied.first() {
        None => note!(
            "pglease: the schema is up to date (migration {}); nothing applied",
            migrated.latest
        ),
        Some(1) => note!(
            "pglease: created the pglease schema ({})",
            span(&migrated.applied)
        ),
        Some(_) => note!(
            "pglease: upgraded the pglease schema ({} applied)",
            span(&migrated.applied)
        ),
    }
    let can_end = manager
        .can_end_stale_transactions()
        .await
        .map_err(|e| (e, "migrate"))?;
    if !can_end {
        let owner: String = simple_scalar(
            manager,
            "SELECT r.rolname::text FROM pg_proc AS p JOIN pg_roles AS r ON r.oid = p.proowner \
              WHERE p.oid = 'pglease.acquire(text, text, interval)'::regprocedure",
        )
        .await
        .map_err(|e| (e, "migrate"))?;
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

/// `pglease doctor`: every check, one line each (or one JSON object); exit
/// 0 only when all are ok, 1 otherwise.
pub(crate) async fn doctor(manager: &LeaseManager, json: bool) -> Outcome {
    let diagnosis = manager.doctor().await.map_err(|e| (e, "doctor"))?;
    if json {
        let checks: Vec<serde_json::Value> = diagnosis
            .checks
            .iter()
            .map(|c| json!({"name": c.name, "verdict": c.verdict.to_string(), "detail": c.detail}))
            .collect();
        out!(
            "{}",
            json!({"verdict": diagnosis.verdict().to_string(), "checks": checks})
        );
    } else {
        for check in &diagnosis.checks {
            out!("{:<8} {:<15} {}", check.verdict, check.name, check.detail);
        }
    }
    Ok(if diagnosis.verdict() == Verdict::Ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_PROBLEMS)
    })
}

/// `pglease release`: exit 0 if this ended the lease, 4 if it was not held.
pub(crate) async fn release(manager: &LeaseManager, fence: &Fence, json: bool) -> Outcome {
    let released = manager.release(fence).await.map_err(|e| (e, "release"))?;
    if json {
        out!(
            "{}",
            json!({"name": fence.name(), "token": fence.token().get(), "released": released})
        );
    }
    if released {
        note!(
            "pglease: released {:?} (token {})",
            fence.name(),
            fence.token()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "pglease: lease {:?} was not held under token {} (already released, \
             expired, or taken over): nothing to release",
            fence.name(),
            fence.token()
        );
        Ok(ExitCode::from(EXIT_LOST))
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
        out!(
            "{}",
            lease_json(
                lease.name(),
                Some(lease.holder()),
                Some(lease.token()),
                Some(lease.expires_at())
            )
        );
    } else {
        out!(
            "acquired {:?} for {:?}: token {} until {}",
            lease.name(),
            lease.holder(),
            lease.token(),
            lease.expires_at().to_rfc3339()
        );
    }
}

/// The default holder of `acquire`: this host, and what took the lease
/// (the process exits at once, so its id would name nobody).
fn acquire_holder() -> String {
    let holder = AcquireOptions::default_holder();
    let host = holder
        .rsplit_once(':')
        .map_or(holder.as_str(), |(host, _)| host);
    format!("{host} (pglease acquire)")
}

/// Tells the user, on stderr, who holds the lease and how long pglease waits.
fn announce_wait(name: &str, current: &str, expires_at: DateTime<Utc>, wait: Duration) {
    note!(
        "pglease: {name:?} is held by {current:?} until {}; waiting up to {}",
        expires_at.to_rfc3339(),
        humantime::format_duration(wait)
    );
}

/// `attempt(Duration::ZERO)` first, so that a wait can be announced; then,
/// if the lease is held and `wait` allows it, `attempt(wait)`.
pub(crate) async fn announced<T, F, Fut>(name: &str, wait: Duration, attempt: F) -> Result<T, Error>
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
            note!(
                "pglease: {e}; waiting up to {}",
                humantime::format_duration(wait)
            );
            attempt(wait).await
        }
        other => other,
    }
}

/// What `acquire` is told on the command line.
pub(crate) struct AcquireArgs {
    pub(crate) ttl: Duration,
    pub(crate) holder: Option<String>,
    pub(crate) wait: Duration,
    pub(crate) value: Option<String>,
    pub(crate) limit: Option<u32>,
}

pub(crate) async fn acquire(
    manager: &LeaseManager,
    name: &str,
    options: AcquireArgs,
    json: bool,
) -> Outcome {
    let AcquireArgs {
        ttl,
        holder,
        wait,
        value,
        limit,
    } = options;
    let holder = holder.unwrap_or_else(acquire_holder);
    // Without --wait one attempt; the library starts its release listener
    // only once an attempt with time to wait has failed.
    let attempt = |wait: Duration| {
        let mut how = AcquireOptions::ttl(ttl).holder(holder.as_str()).wait(wait);
        if let Some(value) = &value {
            how = how.value(value.as_str());
        }
        if let Some(limit) = limit {
            how = how.limit(limit);
        }
        manager.acquire(name, how)
    };
    match announced(name, wait, attempt).await {
        Ok(lease) => {
            print_lease(&lease, json);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            // The lease as found, in JSON, when it was held or pinned.
            // The error names the lease it describes: NAME, or the slot
            // of a counted lease that expires first.
            let found = match &e {
                Error::Held {
                    name,
                    holder,
                    expires_at,
                } => Some(lease_json(name, Some(holder), None, Some(*expires_at))),
                Error::Pinned {
                    name,
                    holder,
                    ended_at,
                    ..
                } => Some(lease_json(name, holder.as_deref(), None, Some(*ended_at))),
                _ => None,
            };
            if let (true, Some(found)) = (json, found) {
                out!("{found}");
            }
            not_acquired(e, "acquire")
        }
    }
}

pub(crate) async fn renew(
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
                out!(
                    "{}",
                    lease_json(
                        name,
                        status.holder.as_deref(),
                        Some(token),
                        Some(expires_at)
                    )
                );
            } else {
                out!(
                    "renewed {name:?} under token {token} until {}",
                    expires_at.to_rfc3339()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ Error::Lost { .. }) => {
            if json {
                // As `acquire --json` when not acquired: the lease as
                // found, with no token of this caller's.
                let status = manager.inspect(name).await.map_err(|e| (e, "renew"))?;
                let mut found = lease_json(name, status.holder.as_deref(), None, None);
                found["lost"] = json!(true);
                found["current_token"] = json!(status.token.map(Token::get));
                out!("{found}");
            }
            eprintln!("pglease: {e}; acquire it again for a new token");
            Ok(ExitCode::from(EXIT_LOST))
        }
        Err(e) => Err((e, "renew")),
    }
}

pub(crate) fn status_json(s: &LeaseStatus) -> serde_json::Value {
    let mut value = lease_json(&s.name, s.holder.as_deref(), s.token, s.expires_at);
    value["held"] = json!(s.held);
    value["remaining_ms"] = json!(s.remaining.map(|r| r.as_millis() as u64));
    value["value"] = json!(s.value);
    value["step_down_requested_by"] = json!(s.step_down_requested_by);
    value["step_down_requested_at"] = json!(s.step_down_requested_at.map(|t| t.to_rfc3339()));
    value
}

/// `pglease status [NAME]`: one lease (exit 3 if it is not held), or the
/// leases the filters keep, with a summary line on stderr.
pub(crate) async fn status(
    manager: &LeaseManager,
    name: Option<&str>,
    json: bool,
    filter: &ListFilter,
) -> Outcome {
    let leases = match name {
        Some(name) => vec![manager.inspect(name).await.map_err(|e| (e, "status"))?],
        // Filtered and limited in the database.
        None => manager
            .list_matching(filter)
            .await
            .map_err(|e| (e, "status"))?,
    };
    let code = match name {
        Some(_) if !leases[0].held => ExitCode::from(EXIT_NOT_ACQUIRED),
        _ => ExitCode::SUCCESS,
    };
    if json {
        let value = match name {
            Some(_) => status_json(&leases[0]),
            None => serde_json::Value::Array(leases.iter().map(status_json).collect()),
        };
        out!("{value}");
        return Ok(code);
    }
    let now: DateTime<Utc> = simple_scalar(manager, "SELECT clock_timestamp()")
        .await
        .map_err(|e| (e, "status"))?;
    let names: Vec<String> = leases.iter().map(|s| printable(&s.name)).collect();
    let width = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(4, 48);
    out!(
        "{:<width$} {:<28} {:>10}  EXPIRES",
        "NAME",
        "HOLDER",
        "TOKEN"
    );
    for (s, shown) in leases.iter().zip(&names) {
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
        out!(
            "{shown:<width$} {:<28} {:>10}  {expires}",
            s.holder
                .as_deref()
                .map_or_else(|| "-".to_owned(), printable),
            s.token.map_or("-".to_owned(), |t| t.to_string()),
        );
    }
    if name.is_none() && !crate::quiet() {
        let total: i64 = simple_scalar(manager, "SELECT count(*) FROM pglease.status")
            .await
            .map_err(|e| (e, "status"))?;
        let held = leases.iter().filter(|s| s.held).count();
        let released = leases.iter().filter(|s| s.holder.is_none()).count();
        let expired = leases.len() - held - released;
        note!(
            "pglease: {} of {total} leases shown: {held} held, {expired} expired, {released} released",
            leases.len()
        );
    }
    Ok(code)
}

/// Text a terminal shows on one line: control characters (tabs, line
/// breaks, escapes) written as Rust escapes.
pub(crate) fn printable(text: &str) -> String {
    if text.chars().any(char::is_control) {
        text.escape_debug().to_string()
    } else {
        text.to_owned()
    }
}

/// The one value `statement` answers, sent as a simple query like the
/// library's own statements, so that it also works through a transaction
/// pooler without prepared-statement support.
async fn simple_scalar<T>(manager: &LeaseManager, statement: &'static str) -> Result<T, Error>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    let row = sqlx::raw_sql(statement).fetch_one(manager.pool()).await?;
    Ok(sqlx::Row::try_get(&row, 0)?)
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

/// Exit 3 with the reason for an acquisition refused (held, pinned, or
/// lost before it could be confirmed); any other error is `what` failing.
pub(crate) fn not_acquired(e: Error, what: &'static str) -> Outcome {
    match e {
        Error::Held {
            name,
            holder,
            expires_at,
        } => note!(
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
    Ok(crate::conflict_exit())
}

/// Runs the demo in a scratch database created for it and dropped after.
pub(crate) async fn demo(
    options: &PgConnectOptions,
    explicit: bool,
    timeout: Duration,
) -> ExitCode {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let scratch = format!("pglease_demo_{}_{nanos}", std::process::id());
    // The URL given, else the first of: the libpq defaults if a server
    // answers, a throwaway cluster, a container (pglease::provision).
    let found;
    let options = if explicit {
        options
    } else {
        note!(
            "pglease: looking for PostgreSQL (libpq defaults, else a throwaway cluster, else a container)"
        );
        match pglease::provision::find(None).await {
            Ok(server) => {
                found = server;
                out!("pglease demo on {found}");
                &found.options
            }
            Err(e) => {
                eprintln!("pglease: {e}");
                return ExitCode::from(EXIT_DATABASE);
            }
        }
    };
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
    out!("pglease demo in scratch database {scratch} (dropped at the end)\n");
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
        Err(_) => return ExitCode::from(EXIT_DATABASE),
    };
    let outcome = async {
        manager.migrate().await?;
        out!("1. The article's failure: a paused holder's late write\n");
        pglease_cli::demo::paused_holder(&manager, "report", Duration::from_millis(300), |line| {
            out!("  {line}")
        })
        .await?;
        out!(
            "\n2. The same failures against a lease, a session advisory lock and a transaction \
             advisory lock, measured now:\n"
        );
        let outcomes = pglease_cli::compare::run(&manager, Duration::from_millis(200), |o| {
            out!(
                "  {} / {}: {} - {}",
                o.scenario.label(),
                o.variant.label(),
                if o.safe { "safe" } else { "UNSAFE" },
                o.detail
            );
        })
        .await?;
        out!("\n{}", pglease_cli::compare::table(&outcomes));
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
