//! The doctor's verdicts: pure functions from what [`facts`](super::facts)
//! read to [`Check`]s, each wording said once, unit-tested below without a
//! database.

use std::time::Duration;

use sqlx::postgres::PgSslMode;

use super::facts::{
    Applied, Connection, Failover, FailoverTime, Finding, Here, Host, Privileges, Timelines, Ttl,
};
use super::{Check, Verdict};
use crate::history::TimelineChange;
use crate::human::Human;

/// How long pglease may take to find a new primary and renew there once
/// it is writable: the watch task's search pause and the renewal's retry.
const FIND_PRIMARY: Duration = Duration::from_secs(1);

/// The checks of the server a manager uses, in their documented order;
/// `known` is the latest migration this version has.
pub(super) fn here(facts: &Here, known: i64) -> Vec<Check> {
    let server = &facts.server;
    let mut checks = vec![
        schema(facts.applied, known),
        primary(server.recovering),
        pooler(facts.sessions_shared, facts.notify),
        durability(&server.fsync, &server.full_page_writes),
    ];
    let delay = match &facts.timelines {
        Some(Ok(timelines)) => Some(timelines.delay),
        _ => None,
    };
    checks.push(replication_check(
        server.standbys,
        server.sync,
        server.hidden,
        &server.sync_names,
        delay,
    ));
    let role = facts.privileges.as_ref().map(|p| p.role.as_str());
    checks.extend(timelines(facts.timelines.as_ref(), role));
    checks.push(takeover(facts.can_end.as_ref()));
    if let Some(audit) = &facts.audit {
        checks.extend(security(audit));
    }
    if let Some(groups) = &facts.groups {
        checks.extend(groups_checks(groups));
    }
    checks.push(server_version(server.version));
    if let Some(privileges) = &facts.privileges {
        checks.extend(privileges_checks(privileges));
    }
    checks.push(connection(&facts.connection));
    checks
}

/// `role` as an SQL identifier, quoted.
fn quoted(role: &str) -> String {
    format!("\"{}\"", role.replace('"', "\"\""))
}

/// The `privileges` checks, once the schema exists: one per privilege the
/// connected role lacks, with the GRANT that gives it; one `ok` when it
/// lacks none.
fn privileges_checks(privileges: &Privileges) -> Vec<Check> {
    let role = quoted(&privileges.role);
    let mut checks = Vec::new();
    if !privileges.usage {
        checks.push(Check::new(
            "privileges",
            Verdict::Problem,
            format!(
                "role {role} may not use the pglease schema: every lease operation fails \
                 with \"permission denied for schema pglease\"; the schema's owner (or a \
                 superuser) grants it: GRANT USAGE ON SCHEMA pglease TO {role};"
            ),
        ));
    }
    if !privileges.unreadable.is_empty() {
        let views = privileges.unreadable.join(", ");
        checks.push(Check::new(
            "privileges",
            Verdict::Warning,
            format!(
                "role {role} may not read {views} (`pglease status`, `history` and \
                 LeaseManager::status read them); the schema's owner grants it: GRANT \
                 SELECT ON {views} TO {role};"
            ),
        ));
    }
    if checks.is_empty() {
        checks.push(Check::new(
            "privileges",
            Verdict::Ok,
            format!("role {role} may use the pglease schema and read its views"),
        ));
    }
    checks
}

/// The `connection` check: whether the connection is encrypted, with
/// which TLS version, and whether the server's identity was verified; a
/// warning when neither protects a connection that crosses a network.
fn connection(c: &Connection) -> Check {
    let mode = match c.mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    };
    let place = if c.local {
        format!(
            "{} is a loopback address or a socket: nothing crosses a network",
            c.host
        )
    } else {
        format!("{} is reached over a network", c.host)
    };
    let fix = "use sslmode=verify-full with sslrootcert set to the CA's certificate file (or \
               sslrootcert=system for a server whose certificate a public CA signed)";
    if !c.ssl {
        let detail = format!("not encrypted (sslmode={mode}); {place}");
        return if c.local {
            Check::new("connection", Verdict::Ok, detail)
        } else {
            Check::new(
                "connection",
                Verdict::Warning,
                format!(
                    "{detail}: the leases, their tokens and the guarded writes cross it in \
                     the clear, and anyone on the path can pose as the server; {fix}"
                ),
            )
        };
    }
    let tls = match (&c.version, &c.cipher) {
        (Some(version), Some(cipher)) => format!("encrypted ({version}, {cipher})"),
        (Some(version), None) => format!("encrypted ({version})"),
        _ => "encrypted".to_owned(),
    };
    match c.mode {
        PgSslMode::VerifyFull => Check::new(
            "connection",
            Verdict::Ok,
            format!("{tls}; the server's certificate and host name verified (sslmode={mode})"),
        ),
        PgSslMode::VerifyCa if c.local => Check::new(
            "connection",
            Verdict::Ok,
            format!(
                "{tls}; the server's certificate verified, not its host name \
                 (sslmode={mode}); {place}"
            ),
        ),
        PgSslMode::VerifyCa => Check::new(
            "connection",
            Verdict::Warning,
            format!(
                "{tls}; the server's certificate verified, not its host name \
                 (sslmode={mode}); {place}: any server with a certificate from that CA can \
                 pose as this one; {fix}"
            ),
        ),
        _ if c.local => Check::new(
            "connection",
            Verdict::Ok,
            format!("{tls}; the server's certificate not verified (sslmode={mode}); {place}"),
        ),
        _ => Check::new(
            "connection",
            Verdict::Warning,
            format!(
                "{tls}; the server's certificate not verified (sslmode={mode}); {place}: \
                 anyone on the path can pose as the server and see the leases and the \
                 password exchange; {fix}"
            ),
        ),
    }
}

/// The `schema` check: migrated (`applied` is `None` before the schema
/// exists), and by this version.
fn schema(applied: Option<Applied>, known: i64) -> Check {
    let applied = match applied {
        None => {
            return Check::new(
                "schema",
                Verdict::Problem,
                "no pglease schema in this database: run `pglease migrate` (or \
                 LeaseManager::migrate)",
            );
        }
        Some(Applied::Unreadable) => {
            return Check::new(
                "schema",
                Verdict::Warning,
                "the schema exists, but this role may not read which migrations are \
                 applied; run doctor as the schema's owner to check its version",
            );
        }
        Some(Applied::Version(applied)) => applied,
    };
    match applied {
        Some(applied) if applied == known => Check::new(
            "schema",
            Verdict::Ok,
            format!("migrated to version {applied}"),
        ),
        Some(applied) if applied > known => Check::new(
            "schema",
            Verdict::Problem,
            format!(
                "migrated to version {applied} by a newer pglease; this one knows up to \
                 {known}: upgrade it"
            ),
        ),
        applied => Check::new(
            "schema",
            Verdict::Problem,
            format!(
                "migrated to version {} only; this pglease needs {known}: run `pglease \
                 migrate`",
                applied.map_or_else(|| "none".to_owned(), |v| v.to_string())
            ),
        ),
    }
}

/// The `primary` check: the server accepts writes.
fn primary(recovering: bool) -> Check {
    if recovering {
        Check::new(
            "primary",
            Verdict::Problem,
            "the server is a standby (in recovery): it refuses every lease operation; \
             connect to the primary",
        )
    } else {
        Check::new("primary", Verdict::Ok, "the server accepts writes")
    }
}

/// The `pooler` check (informational): whether connections share server
/// sessions, and what waiting acquirers do then.
fn pooler(sessions_shared: bool, notify: bool) -> Check {
    if !sessions_shared {
        return Check::new(
            "pooler",
            Verdict::Ok,
            "connections keep their server session (no transaction pooler detected)",
        );
    }
    let waits = if notify {
        "this manager detects it and does not LISTEN there: waiting acquirers poll \
         (ManagerOptions::notify(false) skips the detection)"
    } else {
        "waiting acquirers poll, as configured"
    };
    Check::new(
        "pooler",
        Verdict::Ok,
        format!(
            "connections share server sessions between transactions (a transaction \
             pooler such as PgBouncer in transaction mode): lease operations, renewals, \
             fenced transactions and migrate work there; {waits}, so a release is \
             noticed up to max_poll_interval late; session advisory locks and LISTEN \
             do not work there"
        ),
    )
}

/// The `durability` check: `fsync` and `full_page_writes`.
fn durability(fsync: &str, full_page_writes: &str) -> Check {
    if fsync == "on" && full_page_writes == "on" {
        Check::new(
            "durability",
            Verdict::Ok,
            "fsync and full_page_writes are on",
        )
    } else {
        Check::new(
            "durability",
            Verdict::Problem,
            format!(
                "fsync is {fsync} and full_page_writes is {full_page_writes}: after an \
                 operating-system crash or power loss, acknowledged acquisitions can be lost and \
                 their tokens issued again; turn both on"
            ),
        )
    }
}

/// The `timeline` check, once the schema exists: where tokens continue,
/// or which grant this role lacks to tell. None on a standby.
fn timelines(read: Option<&Result<Timelines, String>>, role: Option<&str>) -> Option<Check> {
    match read? {
        Ok(Timelines {
            current: Some(current),
            recorded,
            latest,
            ..
        }) => Some(timeline_check(*current, *recorded, latest.as_ref())),
        Ok(_) => None,
        Err(why) => Some(Check::new(
            "timeline",
            Verdict::Warning,
            format!(
                "cannot read this server's timelines ({why}); the schema's owner grants it: \
                 GRANT SELECT ON pglease.timelines, pglease.grant_delay TO {};",
                role.map_or_else(|| "this role".to_owned(), quoted)
            ),
        )),
    }
}

/// The `takeover` check: whether the functions' owner may end stale
/// fenced sessions (`None` before the schema exists).
fn takeover(can_end: Option<&Result<bool, String>>) -> Check {
    match can_end {
        None => Check::new(
            "takeover",
            Verdict::Warning,
            "cannot tell before the schema exists (it depends on the functions' owner)",
        ),
        Some(Err(why)) => Check::new(
            "takeover",
            Verdict::Warning,
            format!("cannot tell: this role may not ask ({why})"),
        ),
        Some(Ok(true)) => Check::new(
            "takeover",
            Verdict::Ok,
            "the functions' owner may end stale fenced sessions: takeovers are bounded",
        ),
        Some(Ok(false)) => Check::new(
            "takeover",
            Verdict::Warning,
            "the role owning the pglease functions is neither a superuser nor a member of \
             pg_signal_backend: an expired lease whose holder froze inside a fenced \
             transaction stays pinned until that transaction ends; `pglease migrate` \
             prints the GRANT that fixes it",
        ),
    }
}

/// The `security` checks: one per finding of `pglease.audit()`, or one
/// saying this role may not run it.
fn security(audit: &Result<Vec<Finding>, String>) -> Vec<Check> {
    match audit {
        Ok(findings) => findings
            .iter()
            .map(|finding| {
                Check::new(
                    "security",
                    if finding.level == "warn" {
                        Verdict::Warning
                    } else {
                        Verdict::Ok
                    },
                    format!("{}: {}", finding.topic, finding.message),
                )
            })
            .collect(),
        Err(why) => vec![Check::new(
            "security",
            Verdict::Warning,
            format!(
                "this role may not run pglease.audit() ({why}); run doctor as the \
                 schema's owner or a pglease administrator to see the security posture"
            ),
        )],
    }
}

/// The `group` checks: one per lease group (none without groups, or for
/// a role that may not read them).
fn groups_checks(groups: &[crate::GroupSummary]) -> Vec<Check> {
    groups
        .iter()
        .map(|g| {
            let free = g.partitions.saturating_sub(g.owned);
            if g.members > 0 && free > 0 {
                Check::new(
                    "group",
                    Verdict::Warning,
                    format!(
                        "group {:?}: {free} of {} partitions have no owner while {} members \
                         are live: a rebalance under way (a member died less than a TTL \
                         ago: run doctor again), or members that cannot take them (see \
                         their logs, and `pglease status {}`)",
                        g.name, g.partitions, g.members, g.name
                    ),
                )
            } else {
                Check::new(
                    "group",
                    Verdict::Ok,
                    format!(
                        "group {:?}: {} partitions, {} live members, {} owned",
                        g.name, g.partitions, g.members, g.owned
                    ),
                )
            }
        })
        .collect()
}

/// The `server_version` check: 14 or later (`server_version_num`).
fn server_version(version: i32) -> Check {
    let (major, minor) = (version / 10_000, version % 10_000);
    if version >= 140_000 {
        Check::new(
            "server_version",
            Verdict::Ok,
            format!("PostgreSQL {major}.{minor}"),
        )
    } else {
        Check::new(
            "server_version",
            Verdict::Warning,
            format!(
                "PostgreSQL {major}.{minor} has no client_connection_check_interval: an \
                 acquisition whose client was killed while it waited in the server can still \
                 complete and hold the lease for nobody until it expires"
            ),
        )
    }
}

/// The grant delay as `doctor` states it.
fn delay_said(delay: Option<Duration>) -> String {
    match delay {
        Some(delay) if !delay.is_zero() => format!("it is {} now", Human(delay)),
        Some(_) => "none is set now".to_owned(),
        None => "unknown before the schema exists".to_owned(),
    }
}

/// What a failover to an asynchronous standby costs, and the grant delay.
fn asynchronous_said(delay: Option<Duration>) -> String {
    format!(
        "promoted after a failover, it may lack the latest acknowledged acquisitions and \
         renewals: their holders are told the database forgot them, and no token is ever issued \
         twice (the fence moves past the old timeline's), so guarded writes and high-water marks \
         stay safe. For side effects outside the database that no fence checks, set a grant \
         delay of at least the longest TTL in use (SELECT pglease.set_grant_delay('30s'); {}), \
         or make the standby synchronous",
        delay_said(delay)
    )
}

/// The `replication` check: the standbys streaming from the server.
fn replication_check(
    standbys: i64,
    sync: i64,
    hidden: i64,
    sync_names: &str,
    delay: Option<Duration>,
) -> Check {
    if standbys == 0 {
        return Check::new(
            "replication",
            Verdict::Ok,
            "no standby streams from this server",
        );
    }
    if hidden > 0 {
        return Check::new(
            "replication",
            Verdict::Warning,
            format!(
                "{standbys} standby(s) stream from this server, but this role may not see \
                 whether they are synchronous (it needs pg_read_all_stats); \
                 synchronous_standby_names is {sync_names:?}"
            ),
        );
    }
    if sync == standbys {
        return Check::new(
            "replication",
            Verdict::Ok,
            format!("{standbys} standby(s), all synchronous"),
        );
    }
    Check::new(
        "replication",
        Verdict::Warning,
        format!(
            "{} of {standbys} standby(s) are asynchronous (synchronous_standby_names is \
             {sync_names:?}): {}",
            standbys - sync,
            asynchronous_said(delay)
        ),
    )
}

/// The server's timeline against the latest one pglease recorded, and the
/// latest change of timeline, if any.
fn timeline_check(current: i64, recorded: i64, latest: Option<&TimelineChange>) -> Check {
    if current != recorded {
        return Check::new(
            "timeline",
            Verdict::Ok,
            format!(
                "the server is on timeline {current}, pglease last drew tokens on timeline \
                 {recorded}: it failed over or was restored since; the next acquisition moves \
                 every lease's fence past the old timeline's tokens before it draws one"
            ),
        );
    }
    match latest {
        Some(change) => {
            let from = match (&change.declared, change.previous) {
                (Some(reason), _) => format!("a rollback declared by an administrator ({reason})"),
                (None, Some(previous)) => {
                    format!("changed from timeline {previous}: a failover or a restore")
                }
                (None, None) => "a failover or a restore".to_owned(),
            };
            let delay = match change.grant_after {
                Some(after) => format!("; no lease granted before {}", after.to_rfc3339()),
                None => String::new(),
            };
            Check::new(
                "timeline",
                Verdict::Ok,
                format!(
                    "timeline {current} since {} ({from}): tokens continue above {}; \
                     acquisitions of the old timeline above token {} are unknown here and \
                     refused{delay}",
                    change.at.to_rfc3339(),
                    change.floor,
                    change.seen
                ),
            )
        }
        None => Check::new(
            "timeline",
            Verdict::Ok,
            format!("timeline {current}, the one the schema was made on"),
        ),
    }
}

/// The `host` checks (one per host, and one more if none is the
/// primary) and the `promotion` checks (one per standby) of hosts `names`,
/// from what each said (`facts`, in the same order); `described` names
/// them all.
pub(super) fn hosts(
    names: &[String],
    facts: &[Result<Host, String>],
    described: &str,
) -> Vec<Check> {
    let primaries: Vec<usize> = facts
        .iter()
        .enumerate()
        .filter(|(_, f)| f.as_ref().is_ok_and(|f| !f.recovering))
        .map(|(i, _)| i)
        .collect();
    // pg_auto_failover names its standbys so, and rewrites
    // synchronous_standby_names itself when it promotes one.
    let managed = facts.iter().flatten().any(|f| {
        f.standbys
            .iter()
            .any(|(name, _)| name.starts_with("pgautofailover_standby_"))
            || f.application_name.starts_with("pgautofailover_standby_")
    });
    let primary = match primaries.as_slice() {
        [one] => facts[*one].as_ref().ok(),
        _ => None,
    };
    let mut checks = Vec::new();
    for (index, (host, found)) in names.iter().zip(facts).enumerate() {
        checks.push(match found {
            Err(why) => Check::new(
                "host",
                Verdict::Warning,
                format!("{host}: unreachable ({why}): a failover cannot go there now"),
            ),
            Ok(f) if !f.recovering && primaries.len() > 1 => {
                let others: Vec<&str> = primaries
                    .iter()
                    .filter(|i| **i != index)
                    .map(|i| names[*i].as_str())
                    .collect();
                two_primaries(host, &others)
            }
            Ok(f) if !f.recovering => primary_check(host, f),
            Ok(f) => standby_check(host, f, primary),
        });
        if let Ok(f) = found
            && f.recovering
        {
            checks.push(promotion_check(host, &f.sync_names, managed));
        }
    }
    if primaries.is_empty() {
        checks.push(Check::new(
            "host",
            Verdict::Problem,
            format!(
                "none of {described} accepts writes: no lease operation succeeds until one is \
                 promoted"
            ),
        ));
    }
    checks
}

/// The `host` check of a host that accepts writes while `others` do too.
fn two_primaries(host: &str, others: &[&str]) -> Check {
    Check::new(
        "host",
        Verdict::Problem,
        format!(
            "{host}: accepts writes, and so does {}: two primaries (a split brain, or an old \
             primary not yet demoted); leases taken on one are unknown to the other",
            others.join(", ")
        ),
    )
}

/// The `host` check of the one primary.
fn primary_check(host: &str, f: &Host) -> Check {
    if f.read_only {
        return Check::new(
            "host",
            Verdict::Problem,
            format!(
                "{host}: the primary, but read-only (default_transaction_read_only is on): no \
                 lease operation succeeds"
            ),
        );
    }
    let sync = f
        .standbys
        .iter()
        .filter(|(_, s)| s == "sync" || s == "quorum")
        .count();
    Check::new(
        "host",
        Verdict::Ok,
        format!(
            "{host}: the primary; {} standby(s) stream from it, {sync} synchronous",
            f.standbys.len()
        ),
    )
}

/// The `host` check of a standby: whether the primary has it as
/// synchronous.
fn standby_check(host: &str, f: &Host, primary: Option<&Host>) -> Check {
    let state = primary.and_then(|p| {
        p.standbys
            .iter()
            .find(|(name, _)| *name == f.application_name)
            .map(|(_, state)| state.as_str())
    });
    match (f.streaming, state) {
        (true, Some("sync" | "quorum")) => Check::new(
            "host",
            Verdict::Ok,
            format!(
                "{host}: a synchronous standby of the primary ({:?}, {})",
                f.application_name,
                state.unwrap_or_default()
            ),
        ),
        (true, Some(state)) => Check::new(
            "host",
            Verdict::Warning,
            format!(
                "{host}: a standby the primary has as {state:?} ({:?}), not synchronous: \
                 promoted after a failover, it may lack the latest acknowledged acquisitions \
                 (their holders are told; no token is issued twice; see the replication \
                 check for the grant delay)",
                f.application_name
            ),
        ),
        (true, None) => Check::new(
            "host",
            Verdict::Warning,
            format!(
                "{host}: a standby streaming as {:?}, which the primary does not list (another \
                 primary, or this role may not read pg_stat_replication): cannot tell whether \
                 it is synchronous",
                f.application_name
            ),
        ),
        (false, _) => Check::new(
            "host",
            Verdict::Warning,
            format!(
                "{host}: a standby that is not streaming now (catching up, or cut off; or this \
                 role may not read pg_stat_wal_receiver): promoted now it may lack acknowledged \
                 acquisitions"
            ),
        ),
    }
}

/// Whether a standby, once promoted, would wait for standbys of its own.
fn promotion_check(host: &str, sync_names: &str, managed: bool) -> Check {
    if sync_names.trim().is_empty() {
        Check::new(
            "promotion",
            Verdict::Ok,
            format!("{host}: once promoted, commits wait for no standby until one is configured"),
        )
    } else if managed {
        Check::new(
            "promotion",
            Verdict::Ok,
            format!(
                "{host}: has synchronous_standby_names = {sync_names:?}; pg_auto_failover \
                 (detected by its standby names) rewrites it when it promotes this node"
            ),
        )
    } else {
        Check::new(
            "promotion",
            Verdict::Warning,
            format!(
                "{host}: has synchronous_standby_names = {sync_names:?}: once promoted, every \
                 commit (every acquisition and renewal) waits for such a standby, forever if \
                 none connects, unless the failover manager rewrites it at promotion; set it to \
                 '' on standbys or let the failover manager manage it"
            ),
        )
    }
}

/// pg_auto_failover's detection and promotion time, from its monitor's
/// settings (name, value): a health check period, the checks and their
/// retries, the time a node is given before it is unhealthy, the wait for
/// the old primary to demote itself, and a second for the promotion
/// itself. `Err` says why it is unknown.
fn monitor_estimate(settings: &[(String, String)]) -> Result<Duration, String> {
    let setting = |name: &str| -> Result<u64, String> {
        settings
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, value)| value.parse().ok())
            .ok_or_else(|| {
                format!("unknown: the monitor has no {name} (is it pg_auto_failover's?)")
            })
    };
    let ms = |name: &str| setting(name).map(Duration::from_millis);
    let retries = setting("pgautofailover.health_check_max_retries")?;
    let retries = u32::try_from(retries).unwrap_or(u32::MAX);
    let timeout = ms("pgautofailover.health_check_timeout")?;
    Ok(ms("pgautofailover.health_check_period")?
        + timeout * (retries + 1)
        + ms("pgautofailover.health_check_retry_delay")? * retries
        + ms("pgautofailover.node_considered_unhealthy_timeout")?
        + ms("pgautofailover.primary_demote_timeout")?
        + Duration::from_secs(1))
}

/// The failover time, where it came from, or why it is unknown.
fn failover_time(time: &FailoverTime) -> Result<(Duration, String), String> {
    match time {
        FailoverTime::Given(time) => Ok((*time, "as given".to_owned())),
        FailoverTime::Monitor(Ok(settings)) => monitor_estimate(settings).map(|estimate| {
            (
                estimate,
                "estimated from the monitor's pgautofailover.* settings".to_owned(),
            )
        }),
        FailoverTime::Monitor(Err(why)) => {
            Err(format!("unknown: the monitor cannot be read ({why})"))
        }
        FailoverTime::Patroni(patroni) => Ok((
            patroni.failover_estimate(),
            format!(
                "estimated from Patroni's ttl {} and loop_wait {}, plus 2 s to find the old \
                 leader's host gone and a second to promote",
                Human(patroni.ttl),
                Human(patroni.loop_wait)
            ),
        )),
        FailoverTime::Unknown => Err("not known".to_owned()),
    }
}

/// The `failover` check: whether a failover, plus the time pglease takes
/// to find the new primary, fits the TTL less the safety margin
/// (`margin`, the manager's; by default a fiftieth of the TTL).
pub(super) fn failover(facts: &Failover, margin: Option<Duration>) -> Check {
    let (ttl, ttl_from) = match &facts.ttl {
        Ttl::Given(ttl) => (Some(*ttl), "as given"),
        Ttl::ShortestHeld(ttl) => (*ttl, "the shortest among the leases held now"),
        Ttl::Unreadable(why) => {
            return Check::new(
                "failover",
                Verdict::Warning,
                format!(
                    "cannot read the held leases' TTLs ({why}); give the shortest TTL in use \
                     (pglease doctor --ttl D)"
                ),
            );
        }
    };
    let Some(ttl) = ttl else {
        return Check::new(
            "failover",
            Verdict::Warning,
            "no lease is held now and no TTL was given (pglease doctor --ttl D): cannot \
             tell whether a failover fits it",
        );
    };
    let (failover, failover_from) = match failover_time(&facts.time) {
        Ok(known) => known,
        Err(why) => {
            return Check::new(
                "failover",
                Verdict::Warning,
                format!(
                    "failover time {why}: give it (pglease doctor --failover-time D, as \
                     measured; docs/design.md, \"Failover\"), the pg_auto_failover \
                     monitor (--monitor URL) or Patroni's REST API (--patroni URL) to check \
                     it against the TTL of {} ({ttl_from})",
                    Human(ttl)
                ),
            );
        }
    };
    let margin = margin.unwrap_or(ttl / 50);
    let needed = failover + FIND_PRIMARY;
    let room = ttl.saturating_sub(margin);
    let said = format!(
        "a failover of {} ({failover_from}) plus {} for pglease to find the new primary, \
         against a TTL of {} ({ttl_from}) less the safety margin {}",
        Human(failover),
        Human(FIND_PRIMARY),
        Human(ttl),
        Human(margin)
    );
    if needed < room {
        Check::new(
            "failover",
            Verdict::Ok,
            format!("{said}: fits; held leases ride out a failover"),
        )
    } else {
        Check::new(
            "failover",
            Verdict::Warning,
            format!(
                "{said}: does not fit; a failover ends every held lease (safely: holders \
                 stop before the database's expiry) and work restarts; use a TTL above {} \
                 or shorten the failover manager's timeouts",
                Human(needed + margin)
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(declared: Option<&str>, grant_after: bool) -> TimelineChange {
        let at = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("a time");
        TimelineChange {
            timeline: 3,
            previous: Some(2),
            seen: 1_033,
            floor: 1_099_511_628_809,
            at,
            grant_after: grant_after.then(|| at + chrono::Duration::seconds(30)),
            declared: declared.map(str::to_owned),
        }
    }

    #[test]
    fn the_timeline_check_says_where_tokens_continue_and_what_is_pending() {
        let pending = timeline_check(4, 3, Some(&change(None, false)));
        assert!(
            pending.detail.contains("on timeline 4")
                && pending.detail.contains("the next acquisition moves"),
            "{}",
            pending.detail
        );
        let found = timeline_check(3, 3, Some(&change(None, true)));
        assert!(
            found.detail.contains("changed from timeline 2")
                && found.detail.contains("tokens continue above 1099511628809")
                && found.detail.contains("above token 1033")
                && found.detail.contains("no lease granted before"),
            "{}",
            found.detail
        );
        let declared = timeline_check(3, 3, Some(&change(Some("snapshot"), false)));
        assert!(
            declared
                .detail
                .contains("declared by an administrator (snapshot)")
                && !declared.detail.contains("granted"),
            "{}",
            declared.detail
        );
        let never = timeline_check(1, 1, None);
        assert!(never.detail.contains("the one the schema was made on"));
        assert!(
            [pending, found, declared, never]
                .iter()
                .all(|c| c.verdict == Verdict::Ok)
        );
    }

    #[test]
    fn an_asynchronous_standby_is_a_warning_that_explains_the_grant_delay() {
        let none = replication_check(1, 0, 0, "", Some(Duration::ZERO));
        assert_eq!(none.verdict, Verdict::Warning);
        assert!(
            none.detail.contains("no token is ever issued twice")
                && none.detail.contains("none is set now"),
            "{}",
            none.detail
        );
        let set = replication_check(1, 0, 0, "", Some(Duration::from_secs(30)));
        assert!(set.detail.contains("it is 30 s now"), "{}", set.detail);
        assert_eq!(replication_check(1, 1, 0, "s", None).verdict, Verdict::Ok);
    }

    #[test]
    fn a_standby_that_would_wait_after_promotion_is_flagged_unless_managed() {
        assert_eq!(promotion_check("a:1", "", false).verdict, Verdict::Ok);
        assert_eq!(
            promotion_check("a:1", "ANY 1 (b)", false).verdict,
            Verdict::Warning
        );
        assert_eq!(
            promotion_check("a:1", "ANY 1 (b)", true).verdict,
            Verdict::Ok
        );
    }

    fn server() -> super::super::facts::Server {
        super::super::facts::Server {
            version: 150_004,
            fsync: "on".to_owned(),
            full_page_writes: "on".to_owned(),
            sync_names: String::new(),
            recovering: false,
            standbys: 0,
            sync: 0,
            hidden: 0,
            migrated: true,
        }
    }

    fn healthy() -> Here {
        Here {
            server: server(),
            applied: Some(Applied::Version(Some(1))),
            sessions_shared: false,
            notify: true,
            timelines: Some(Ok(Timelines {
                current: Some(1),
                recorded: 1,
                latest: None,
                delay: Duration::ZERO,
            })),
            can_end: Some(Ok(true)),
            audit: Some(Ok(vec![Finding {
                level: "ok".to_owned(),
                topic: "admins".to_owned(),
                message: "none".to_owned(),
            }])),
            groups: Some(Vec::new()),
            privileges: Some(Privileges {
                role: "app".to_owned(),
                usage: true,
                unreadable: Vec::new(),
            }),
            connection: Connection {
                ssl: false,
                version: None,
                cipher: None,
                mode: PgSslMode::Prefer,
                host: "/run/postgresql".to_owned(),
                local: true,
            },
        }
    }

    /// The checks of one server, in the order `Admin::doctor`
    /// documents.
    const ORDER: [&str; 11] = [
        "schema",
        "primary",
        "pooler",
        "durability",
        "replication",
        "timeline",
        "takeover",
        "security",
        "server_version",
        "privileges",
        "connection",
    ];

    fn names(checks: &[Check]) -> Vec<&'static str> {
        checks.iter().map(|c| c.name).collect()
    }

    #[test]
    fn a_group_with_unowned_partitions_and_live_members_is_a_warning() {
        let group = |members, owned| crate::GroupSummary {
            name: "orders".to_owned(),
            partitions: 16,
            members,
            owned,
            created_by: "app".to_owned(),
            created_at: chrono::DateTime::UNIX_EPOCH,
        };
        let mut facts = healthy();
        facts.groups = Some(vec![group(3, 16), group(0, 0), group(2, 13)]);
        let checks = here(&facts, 1);
        let verdicts: Vec<Verdict> = checks
            .iter()
            .filter(|c| c.name == "group")
            .map(|c| c.verdict)
            .collect();
        assert_eq!(verdicts, [Verdict::Ok, Verdict::Ok, Verdict::Warning]);
        assert!(
            checks
                .iter()
                .any(|c| c.detail.contains("3 of 16 partitions have no owner"))
        );
    }

    #[test]
    fn a_healthy_server_gets_every_check_ok_in_the_documented_order() {
        let checks = here(&healthy(), 1);
        assert_eq!(names(&checks), ORDER);
        assert!(
            checks.iter().all(|c| c.verdict == Verdict::Ok),
            "{checks:?}"
        );
        assert_eq!(checks[8].detail, "PostgreSQL 15.4");
        assert_eq!(checks[7].detail, "admins: none");
    }

    #[test]
    fn before_the_schema_exists_only_what_needs_no_schema_is_judged() {
        let facts = Here {
            server: super::super::facts::Server {
                migrated: false,
                ..server()
            },
            applied: None,
            timelines: None,
            can_end: None,
            audit: None,
            privileges: None,
            ..healthy()
        };
        let checks = here(&facts, 1);
        let without: Vec<&str> = ORDER
            .into_iter()
            .filter(|name| !["timeline", "security", "privileges"].contains(name))
            .collect();
        assert_eq!(names(&checks), without);
        assert_eq!(checks[0].verdict, Verdict::Problem);
        assert!(checks[0].detail.contains("run `pglease migrate`"));
        assert_eq!(checks[5].verdict, Verdict::Warning);
        assert!(
            checks[5]
                .detail
                .contains("cannot tell before the schema exists")
        );
    }

    #[test]
    fn the_schema_version_against_this_one() {
        let ok = schema(Some(Applied::Version(Some(3))), 3);
        assert_eq!(
            (ok.verdict, ok.detail.as_str()),
            (Verdict::Ok, "migrated to version 3")
        );
        let newer = schema(Some(Applied::Version(Some(4))), 3);
        assert_eq!(newer.verdict, Verdict::Problem);
        assert!(newer.detail.contains("by a newer pglease") && newer.detail.contains("upgrade"));
        let older = schema(Some(Applied::Version(Some(2))), 3);
        assert_eq!(older.verdict, Verdict::Problem);
        assert!(
            older
                .detail
                .contains("version 2 only; this pglease needs 3")
        );
        let none = schema(Some(Applied::Version(None)), 3);
        assert!(none.detail.contains("version none only"), "{}", none.detail);
        let hidden = schema(Some(Applied::Unreadable), 3);
        assert_eq!(hidden.verdict, Verdict::Warning);
        assert!(hidden.detail.contains("may not read which migrations"));
    }

    #[test]
    fn a_standby_durability_off_and_an_old_server_are_said() {
        assert_eq!(primary(true).verdict, Verdict::Problem);
        assert!(primary(true).detail.contains("connect to the primary"));
        let off = durability("off", "on");
        assert_eq!(off.verdict, Verdict::Problem);
        assert!(
            off.detail
                .contains("fsync is off and full_page_writes is on")
        );
        assert_eq!(durability("on", "off").verdict, Verdict::Problem);
        let old = server_version(130_011);
        assert_eq!(old.verdict, Verdict::Warning);
        assert!(
            old.detail
                .starts_with("PostgreSQL 13.11 has no client_connection_check_interval")
        );
        assert_eq!(server_version(140_000).verdict, Verdict::Ok);
    }

    #[test]
    fn a_pooler_is_informational_and_says_how_waiters_wait() {
        let none = pooler(false, true);
        assert!(none.detail.contains("no transaction pooler detected"));
        let detected = pooler(true, true);
        assert_eq!(detected.verdict, Verdict::Ok);
        assert!(detected.detail.contains("does not LISTEN there"));
        assert!(pooler(true, false).detail.contains("poll, as configured"));
    }

    #[test]
    fn takeover_audit_and_timelines_a_role_may_not_read() {
        assert_eq!(takeover(Some(&Ok(false))).verdict, Verdict::Warning);
        assert!(
            takeover(Some(&Ok(false)))
                .detail
                .contains("pg_signal_backend")
        );
        let unasked = takeover(Some(
            &Err("permission denied for schema pglease".to_owned()),
        ));
        assert_eq!(unasked.verdict, Verdict::Warning);
        assert!(unasked.detail.contains("cannot tell"), "{}", unasked.detail);
        let warned = security(&Ok(vec![Finding {
            level: "warn".to_owned(),
            topic: "public".to_owned(),
            message: "PUBLIC may use the schema".to_owned(),
        }]));
        assert_eq!(warned[0].verdict, Verdict::Warning);
        assert_eq!(warned[0].detail, "public: PUBLIC may use the schema");
        let refused = security(&Err("permission denied".to_owned()));
        assert_eq!(refused.len(), 1);
        assert!(
            refused[0]
                .detail
                .contains("may not run pglease.audit() (permission denied)")
        );
        let unreadable =
            timelines(Some(&Err("permission denied".to_owned())), Some("app")).expect("a check");
        assert_eq!(unreadable.verdict, Verdict::Warning);
        assert!(
            unreadable
                .detail
                .contains("GRANT SELECT ON pglease.timelines, pglease.grant_delay TO \"app\";"),
            "{}",
            unreadable.detail
        );
        let on_a_standby = Timelines {
            current: None,
            recorded: 1,
            latest: None,
            delay: Duration::ZERO,
        };
        assert!(timelines(Some(&Ok(on_a_standby)), None).is_none());
        assert!(timelines(None, None).is_none());
    }

    #[test]
    fn each_missing_privilege_comes_with_the_grant_that_gives_it() {
        let none = privileges_checks(&Privileges {
            role: "we\"ird".to_owned(),
            usage: false,
            unreadable: vec!["pglease.status".to_owned(), "pglease.shared".to_owned()],
        });
        assert_eq!(names(&none), ["privileges", "privileges"]);
        assert_eq!(none[0].verdict, Verdict::Problem);
        assert!(
            none[0]
                .detail
                .ends_with("GRANT USAGE ON SCHEMA pglease TO \"we\"\"ird\";"),
            "{}",
            none[0].detail
        );
        assert_eq!(none[1].verdict, Verdict::Warning);
        assert!(
            none[1]
                .detail
                .ends_with("GRANT SELECT ON pglease.status, pglease.shared TO \"we\"\"ird\";"),
            "{}",
            none[1].detail
        );
        let all = privileges_checks(&Privileges {
            role: "app".to_owned(),
            usage: true,
            unreadable: Vec::new(),
        });
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].verdict, Verdict::Ok);
    }

    #[test]
    fn a_connection_across_a_network_must_be_encrypted_and_verified() {
        let at = |ssl: bool, mode: PgSslMode, local: bool| {
            connection(&Connection {
                ssl,
                version: ssl.then(|| "TLSv1.3".to_owned()),
                cipher: ssl.then(|| "TLS_AES_256_GCM_SHA384".to_owned()),
                mode,
                host: if local { "127.0.0.1" } else { "db.example.com" }.to_owned(),
                local,
            })
        };
        let full = at(true, PgSslMode::VerifyFull, false);
        assert_eq!(full.verdict, Verdict::Ok);
        assert_eq!(
            full.detail,
            "encrypted (TLSv1.3, TLS_AES_256_GCM_SHA384); the server's certificate and host \
             name verified (sslmode=verify-full)"
        );
        for (ssl, mode) in [
            (false, PgSslMode::Prefer),
            (false, PgSslMode::Disable),
            (true, PgSslMode::Require),
            (true, PgSslMode::Prefer),
            (true, PgSslMode::VerifyCa),
        ] {
            let remote = at(ssl, mode, false);
            assert_eq!(remote.verdict, Verdict::Warning, "{remote:?}");
            assert!(
                remote
                    .detail
                    .contains("db.example.com is reached over a network")
                    && remote.detail.contains("use sslmode=verify-full"),
                "{}",
                remote.detail
            );
            assert_eq!(at(ssl, mode, true).verdict, Verdict::Ok);
        }
        assert!(
            at(false, PgSslMode::Prefer, false)
                .detail
                .starts_with("not encrypted (sslmode=prefer)")
        );
    }

    fn primary_host(standbys: &[(&str, &str)]) -> Host {
        Host {
            standbys: standbys
                .iter()
                .map(|(a, s)| ((*a).to_owned(), (*s).to_owned()))
                .collect(),
            ..Host::default()
        }
    }

    fn standby_host(name: &str, sync_names: &str) -> Host {
        Host {
            recovering: true,
            read_only: true,
            streaming: true,
            application_name: name.to_owned(),
            sync_names: sync_names.to_owned(),
            ..Host::default()
        }
    }

    fn host_names(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("h{i}:5432")).collect()
    }

    #[test]
    fn hosts_a_primary_its_standbys_and_their_promotion() {
        let facts = vec![
            Ok(primary_host(&[("s1", "sync"), ("s2", "async")])),
            Ok(standby_host("s1", "")),
            Ok(standby_host("s2", "ANY 1 (s1)")),
            Ok(Host {
                streaming: false,
                ..standby_host("s3", "")
            }),
            Err("connection refused".to_owned()),
        ];
        let checks = hosts(&host_names(5), &facts, "h1..h5");
        let said: Vec<(&str, Verdict)> = checks.iter().map(|c| (c.name, c.verdict)).collect();
        assert_eq!(
            said,
            [
                ("host", Verdict::Ok),
                ("host", Verdict::Ok),
                ("promotion", Verdict::Ok),
                ("host", Verdict::Warning),
                ("promotion", Verdict::Warning),
                ("host", Verdict::Warning),
                ("promotion", Verdict::Ok),
                ("host", Verdict::Warning),
            ],
            "{checks:#?}"
        );
        assert!(
            checks[0]
                .detail
                .contains("2 standby(s) stream from it, 1 synchronous")
        );
        assert!(checks[1].detail.contains("a synchronous standby"));
        assert!(checks[3].detail.contains("as \"async\""));
        assert!(checks[5].detail.contains("not streaming now"));
        assert!(
            checks[7]
                .detail
                .contains("h5:5432: unreachable (connection refused)")
        );
    }

    #[test]
    fn two_primaries_none_and_a_read_only_primary_are_problems() {
        let two = hosts(
            &host_names(2),
            &[Ok(primary_host(&[])), Ok(primary_host(&[]))],
            "both",
        );
        assert!(two.iter().all(|c| c.verdict == Verdict::Problem));
        assert!(two[0].detail.contains("and so does h2:5432: two primaries"));
        assert!(two[1].detail.contains("and so does h1:5432"));
        let none = hosts(&host_names(1), &[Ok(standby_host("s", ""))], "h1:5432");
        let last = none.last().expect("a check");
        assert_eq!(last.verdict, Verdict::Problem);
        assert!(last.detail.contains("none of h1:5432 accepts writes"));
        let read_only = Host {
            read_only: true,
            ..primary_host(&[])
        };
        let checks = hosts(&host_names(1), &[Ok(read_only)], "h1");
        assert_eq!(checks[0].verdict, Verdict::Problem);
        assert!(checks[0].detail.contains("default_transaction_read_only"));
    }

    #[test]
    fn pg_auto_failover_standby_names_mean_promotion_is_managed() {
        let facts = vec![
            Ok(primary_host(&[("pgautofailover_standby_2", "quorum")])),
            Ok(standby_host(
                "pgautofailover_standby_2",
                "ANY 1 (pgautofailover_standby_1)",
            )),
        ];
        let checks = hosts(&host_names(2), &facts, "both");
        assert!(
            checks.iter().all(|c| c.verdict == Verdict::Ok),
            "{checks:#?}"
        );
        assert!(checks[2].detail.contains("pg_auto_failover"));
    }

    fn monitor(missing: Option<&str>) -> Vec<(String, String)> {
        [
            ("pgautofailover.health_check_period", "5000"),
            ("pgautofailover.health_check_timeout", "5000"),
            ("pgautofailover.health_check_max_retries", "2"),
            ("pgautofailover.health_check_retry_delay", "2000"),
            ("pgautofailover.node_considered_unhealthy_timeout", "20000"),
            ("pgautofailover.primary_demote_timeout", "30000"),
        ]
        .iter()
        .filter(|(n, _)| Some(*n) != missing)
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
    }

    #[test]
    fn the_monitor_estimate_adds_up_its_settings() {
        // 5 + 5 × 3 + 2 × 2 + 20 + 30 + 1 s.
        assert_eq!(
            monitor_estimate(&monitor(None)),
            Ok(Duration::from_secs(75))
        );
        let missing = monitor_estimate(&monitor(Some("pgautofailover.primary_demote_timeout")));
        assert!(missing.is_err_and(|why| why.contains("no pgautofailover.primary_demote_timeout")),);
    }

    #[test]
    fn a_failover_fits_the_ttl_less_the_margin_or_says_what_to_change() {
        let given = |ttl: u64, time: u64| Failover {
            ttl: Ttl::Given(Duration::from_secs(ttl)),
            time: FailoverTime::Given(Duration::from_secs(time)),
        };
        // 10 s + 1 s to find the primary, against 30 s less 600 ms.
        let fits = failover(&given(30, 10), None);
        assert_eq!(fits.verdict, Verdict::Ok, "{}", fits.detail);
        assert!(
            fits.detail
                .contains("fits; held leases ride out a failover")
        );
        // 29 s + 1 s against 30 s less 600 ms: use a TTL above 30.6 s.
        let tight = failover(&given(30, 29), None);
        assert_eq!(tight.verdict, Verdict::Warning);
        assert!(tight.detail.contains("does not fit"), "{}", tight.detail);
        // The manager's margin, not a fiftieth, is taken when set.
        let margin = failover(&given(30, 10), Some(Duration::from_secs(20)));
        assert_eq!(margin.verdict, Verdict::Warning, "{}", margin.detail);
        let nothing_held = failover(
            &Failover {
                ttl: Ttl::ShortestHeld(None),
                time: FailoverTime::Unknown,
            },
            None,
        );
        assert!(nothing_held.detail.contains("no lease is held now"));
        let unknown = failover(
            &Failover {
                ttl: Ttl::ShortestHeld(Some(Duration::from_secs(30))),
                time: FailoverTime::Unknown,
            },
            None,
        );
        assert!(unknown.detail.starts_with("failover time not known"));
        assert!(
            unknown
                .detail
                .contains("the shortest among the leases held now")
        );
        let unreadable_monitor = failover(
            &Failover {
                ttl: Ttl::Given(Duration::from_secs(30)),
                time: FailoverTime::Monitor(Err("refused".to_owned())),
            },
            None,
        );
        assert!(
            unreadable_monitor
                .detail
                .contains("failover time unknown: the monitor cannot be read (refused)")
        );
        let from_monitor = failover(
            &Failover {
                ttl: Ttl::Given(Duration::from_secs(120)),
                time: FailoverTime::Monitor(Ok(monitor(None))),
            },
            None,
        );
        assert_eq!(from_monitor.verdict, Verdict::Ok, "{}", from_monitor.detail);
        let patroni = failover(
            &Failover {
                ttl: Ttl::Given(Duration::from_secs(30)),
                time: FailoverTime::Patroni(super::super::PatroniTiming::DEFAULT),
            },
            None,
        );
        // 30 + 10 + 3 s does not fit 30 s.
        assert_eq!(patroni.verdict, Verdict::Warning);
        assert!(patroni.detail.contains("estimated from Patroni's ttl 30 s"));
        let unreadable = failover(
            &Failover {
                ttl: Ttl::Unreadable("denied".to_owned()),
                time: FailoverTime::Unknown,
            },
            None,
        );
        assert!(
            unreadable
                .detail
                .contains("cannot read the held leases' TTLs (denied)")
        );
    }
}
