//! A check of the server a manager uses, for what leases rely on: the
//! schema, durable commits, where a failover would go, the privilege that
//! bounds takeovers, and what the server version provides.

use std::time::Duration;

use sqlx::Row;

use crate::connect::{PER_HOST_TIMEOUT, SessionAttrs, Target};
use crate::error::{Error, Result};
use crate::history::TimelineChange;
use crate::human::Human;
use crate::manager::LeaseManager;
use crate::sql;
use crate::sqlstate::NOT_PERMITTED;

/// What [`LeaseManager::doctor_with`] is told about the failover manager
/// and the leases, for the `failover` check of a manager of several hosts.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct DoctorOptions {
    /// The shortest TTL the leases use; without it, the shortest among the
    /// leases held now (`expires_at` minus the last renewal).
    pub ttl: Option<Duration>,
    /// How long a failover takes, detection and promotion, as measured or
    /// configured; without it, estimated from the monitor's settings when
    /// `monitor` is given, else from Patroni's when `patroni` is.
    pub failover_time: Option<Duration>,
    /// pg_auto_failover's monitor (`pg_autoctl show uri --monitor`), whose
    /// `pgautofailover.*` settings give the failover time estimate.
    pub monitor: Option<Target>,
    /// Patroni's timing (its REST API's `GET /config`), which gives the
    /// failover time estimate.
    pub patroni: Option<PatroniTiming>,
}

/// The settings of Patroni's that bound how long its automatic failover
/// takes, as its REST API's `GET /config` (or `patronictl show-config`)
/// gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PatroniTiming {
    /// `ttl`: how long the leader key lives without a refresh (30 s by
    /// default).
    pub ttl: Duration,
    /// `loop_wait`: the pause between two runs of each node's loop (10 s).
    pub loop_wait: Duration,
    /// `retry_timeout`: how long operations on the configuration store and
    /// PostgreSQL are retried (10 s).
    pub retry_timeout: Duration,
}

impl PatroniTiming {
    /// Patroni's defaults: `ttl` 30 s, `loop_wait` 10 s, `retry_timeout`
    /// 10 s.
    pub const DEFAULT: PatroniTiming = PatroniTiming {
        ttl: Duration::from_secs(30),
        loop_wait: Duration::from_secs(10),
        retry_timeout: Duration::from_secs(10),
    };

    /// These settings.
    pub fn new(ttl: Duration, loop_wait: Duration, retry_timeout: Duration) -> PatroniTiming {
        PatroniTiming {
            ttl,
            loop_wait,
            retry_timeout,
        }
    }

    /// How long an automatic failover can take after the leader's host
    /// dies: its key lives up to `ttl` after its last refresh, the replica
    /// sees it gone at its next loop (up to `loop_wait` later), asks the
    /// other members' REST APIs how far they are (2 s at most for a dead
    /// host), and promotes (about a second). (Measured with `ttl` 5 s and
    /// `loop_wait` 1 s, the old primary's processes killed: 4.5 to 5.5 s,
    /// against this 9 s.) The settings are taken as given: Patroni 3.2
    /// and later raise a `ttl` below 20 s to 20 s.
    pub fn failover_estimate(&self) -> Duration {
        self.ttl + self.loop_wait + Duration::from_secs(3)
    }
}

impl DoctorOptions {
    /// Nothing told.
    pub fn new() -> DoctorOptions {
        DoctorOptions::default()
    }

    /// The shortest TTL in use.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long a failover takes.
    #[must_use]
    pub fn failover_time(mut self, time: Duration) -> Self {
        self.failover_time = Some(time);
        self
    }

    /// pg_auto_failover's monitor.
    #[must_use]
    pub fn monitor(mut self, monitor: Target) -> Self {
        self.monitor = Some(monitor);
        self
    }

    /// Patroni's timing.
    #[must_use]
    pub fn patroni(mut self, timing: PatroniTiming) -> Self {
        self.patroni = Some(timing);
        self
    }
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Leases get what they rely on.
    Ok,
    /// Leases work, but a guarantee or a bound is weaker than documented.
    Warning,
    /// A guarantee does not hold here (or leases cannot work at all).
    Problem,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Verdict::Ok => "ok",
            Verdict::Warning => "warning",
            Verdict::Problem => "problem",
        })
    }
}

/// One check of [`LeaseManager::doctor`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Check {
    /// What was checked: `schema`, `primary`, `pooler`, `durability`, `replication`,
    /// `takeover`, `security` (one per finding), `server_version`; with
    /// several hosts also `host` (one per host), `promotion` (one per
    /// standby) and `failover`.
    pub name: &'static str,
    /// How it came out.
    pub verdict: Verdict,
    /// What was found and, unless all is well, what it means and what to
    /// do.
    pub detail: String,
}

impl Check {
    fn new(name: &'static str, verdict: Verdict, detail: impl Into<String>) -> Check {
        Check {
            name,
            verdict,
            detail: detail.into(),
        }
    }
}

/// The checks, in a fixed order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Diagnosis {
    /// Every check made.
    pub checks: Vec<Check>,
}

impl Diagnosis {
    /// The worst verdict ([`Verdict::Ok`] when all is well).
    pub fn verdict(&self) -> Verdict {
        self.checks
            .iter()
            .map(|c| c.verdict)
            .max()
            .unwrap_or(Verdict::Ok)
    }
}

impl LeaseManager {
    /// Checks the server this manager uses for what leases rely on, and
    /// explains each finding:
    ///
    /// - `schema`: migrated, by this version;
    /// - `primary`: the server accepts writes (not a standby);
    /// - `pooler`: whether connections share server sessions between
    ///   transactions (a transaction pooler in front), and what that means
    ///   here (informational: leases work there);
    /// - `durability`: `fsync` and `full_page_writes` are on (a crash could
    ///   otherwise lose acquisitions and issue tokens again);
    /// - `replication`: every standby is synchronous, or there is none (an
    ///   asynchronous standby, once promoted, may lack the latest
    ///   acknowledged acquisitions and renewals, whose holders are then
    ///   told; it never issues a token again), and the grant delay after a
    ///   change of timeline;
    /// - `timeline`: the server's timeline, and the latest change of
    ///   timeline (a failover or a restore) pglease recorded: where tokens
    ///   continue from, the grant delay's end;
    /// - `takeover`: the functions' owner may end stale fenced sessions
    ///   (the bounded takeover needs it);
    /// - `security`: the security posture, one check per finding of
    ///   `pglease.audit()` (who may use the schema, who administers, name
    ///   grants, protected tables whose guard was replaced or whose
    ///   TRIGGER privilege is granted, the history's bounds); see
    ///   docs/design.md, "Roles and grants";
    /// - `server_version`: PostgreSQL 14 or later, where a statement whose
    ///   client has gone is abandoned (`client_connection_check_interval`).
    ///
    /// # Errors
    ///
    /// [`Error::Database`](crate::Error::Database) if the server cannot be
    /// reached; findings are returned as data, never as errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn doctor(&self) -> Result<Diagnosis> {
        self.doctor_with(&DoctorOptions::default()).await
    }

    /// [`LeaseManager::doctor`], and for a manager of several hosts (see
    /// [`LeaseManager::connect_target`]) a look at every host:
    ///
    /// - `host`, one per host: the primary (exactly one may accept
    ///   writes), or a standby and whether it streams from the primary
    ///   synchronously (the primary's `pg_stat_replication`, matched by the
    ///   standby's `application_name`), or unreachable;
    /// - `promotion`, one per standby: whether, once promoted, it would
    ///   wait for standbys of its own (its `synchronous_standby_names`),
    ///   and so take no lease operation until one exists, unless the
    ///   failover manager rewrites the setting (pg_auto_failover does);
    /// - `failover`: whether a failover fits the TTL: the shortest TTL
    ///   (`options.ttl`, else the shortest among the leases held now)
    ///   against the failover time (`options.failover_time`, else an
    ///   estimate from pg_auto_failover's monitor, `options.monitor`, else
    ///   from Patroni's timing, `options.patroni`),
    ///   plus a second for pglease to find the new primary, before the
    ///   local deadline (TTL less the safety margin).
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::doctor`]; an unreachable host or monitor is a
    /// finding, not an error.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn doctor_with(&self, options: &DoctorOptions) -> Result<Diagnosis> {
        let mut diagnosis = self.doctor_here().await?;
        if let Some(follow) = &self.context().follow
            && follow.target.len() > 1
        {
            diagnosis.checks.extend(hosts_checks(&follow.target).await);
            diagnosis.checks.push(self.failover_check(options).await?);
        }
        Ok(diagnosis)
    }

    async fn doctor_here(&self) -> Result<Diagnosis> {
        let facts = sql::query(sql::DOCTOR_FACTS).fetch_one(self.pool()).await?;
        let version: i32 = facts.try_get("version")?;
        let fsync: String = facts.try_get("fsync")?;
        let fpw: String = facts.try_get("fpw")?;
        let sync_names: String = facts.try_get("sync_names")?;
        let recovering: bool = facts.try_get("recovering")?;
        let standbys: i64 = facts.try_get("standbys")?;
        let sync: i64 = facts.try_get("sync")?;
        let hidden: i64 = facts.try_get("hidden")?;
        let migrated: bool = facts.try_get("migrated")?;
        let mut checks = Vec::new();

        checks.push(self.schema_check(migrated).await?);
        checks.push(if recovering {
            Check::new(
                "primary",
                Verdict::Problem,
                "the server is a standby (in recovery): it refuses every lease operation; \
                 connect to the primary",
            )
        } else {
            Check::new("primary", Verdict::Ok, "the server accepts writes")
        });
        checks.push(self.pooler_check().await?);
        checks.push(if fsync == "on" && fpw == "on" {
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
                    "fsync is {fsync} and full_page_writes is {fpw}: after an operating-system \
                     crash or power loss, acknowledged acquisitions can be lost and their tokens \
                     issued again; turn both on"
                ),
            )
        });
        // The timeline and the grant delay, once the schema exists (a role
        // not granted the views gets a finding, not an error).
        let timeline = if migrated {
            match self.timeline_facts().await {
                Ok(facts) => Some(Ok(facts)),
                Err(e @ Error::NotPermitted { .. }) => Some(Err(e)),
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let delay = timeline
            .as_ref()
            .and_then(|t| t.as_ref().ok())
            .map(|t| t.delay);
        checks.push(replication_check(
            standbys,
            sync,
            hidden,
            &sync_names,
            delay,
        ));
        match &timeline {
            Some(Ok(TimelineFacts {
                current: Some(current),
                recorded,
                latest,
                ..
            })) => checks.push(timeline_check(*current, *recorded, latest.as_ref())),
            Some(Err(e)) => checks.push(Check::new(
                "timeline",
                Verdict::Warning,
                format!(
                    "cannot read this server's timelines ({e}): GRANT SELECT ON \
                     pglease.timelines, pglease.grant_delay to this role"
                ),
            )),
            _ => {}
        }
        checks.push(if !migrated {
            Check::new(
                "takeover",
                Verdict::Warning,
                "cannot tell before the schema exists (it depends on the functions' owner)",
            )
        } else if self.can_end_stale_transactions().await? {
            Check::new(
                "takeover",
                Verdict::Ok,
                "the functions' owner may end stale fenced sessions: takeovers are bounded",
            )
        } else {
            Check::new(
                "takeover",
                Verdict::Warning,
                "the role owning the pglease functions is neither a superuser nor a member of \
                 pg_signal_backend: an expired lease whose holder froze inside a fenced \
                 transaction stays pinned until that transaction ends; `pglease migrate` \
                 prints the GRANT that fixes it",
            )
        });
        if migrated {
            checks.extend(self.security_checks().await?);
        }
        checks.push(if version >= 140_000 {
            Check::new(
                "server_version",
                Verdict::Ok,
                format!("PostgreSQL {}.{}", version / 10_000, version % 10_000),
            )
        } else {
            Check::new(
                "server_version",
                Verdict::Warning,
                format!(
                    "PostgreSQL {}.{} has no client_connection_check_interval: an acquisition \
                     whose client was killed while it waited in the server can still complete \
                     and hold the lease for nobody until it expires",
                    version / 10_000,
                    version % 10_000
                ),
            )
        });
        Ok(Diagnosis { checks })
    }

    async fn security_checks(&self) -> Result<Vec<Check>> {
        let rows = match sql::query(sql::AUDIT).fetch_all(self.pool()).await {
            Ok(rows) => rows,
            Err(error) if crate::sqlstate::of(&error).is_some() => {
                return Ok(vec![Check::new(
                    "security",
                    Verdict::Warning,
                    format!(
                        "this role may not run pglease.audit() ({}); run doctor as the \
                         schema's owner or a pglease administrator to see the security posture",
                        crate::Error::from(error)
                    ),
                )]);
            }
            Err(error) => return Err(error.into()),
        };
        rows.iter()
            .map(|row| {
                let level: String = row.try_get("level")?;
                let topic: String = row.try_get("topic")?;
                let message: String = row.try_get("message")?;
                let verdict = if level == "warn" {
                    Verdict::Warning
                } else {
                    Verdict::Ok
                };
                Ok(Check::new(
                    "security",
                    verdict,
                    format!("{topic}: {message}"),
                ))
            })
            .collect()
    }

    async fn pooler_check(&self) -> Result<Check> {
        let options = self.pool().connect_options();
        Ok(if !crate::connect::sessions_shared(&options).await? {
            Check::new(
                "pooler",
                Verdict::Ok,
                "connections keep their server session (no transaction pooler detected)",
            )
        } else {
            let waits = if self.options().get_notify() {
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
        })
    }

    async fn schema_check(&self, migrated: bool) -> Result<Check> {
        if !migrated {
            return Ok(Check::new(
                "schema",
                Verdict::Problem,
                "no pglease schema in this database: run `pglease migrate` (or \
                 LeaseManager::migrate)",
            ));
        }
        let applied: Option<i64> = match sql::query(sql::SCHEMA_VERSION)
            .fetch_one(self.pool())
            .await
            .and_then(|row| row.try_get(0))
        {
            Ok(applied) => applied,
            // An application role may not read the migrations table.
            Err(error) if crate::sqlstate::of(&error).as_deref() == Some(NOT_PERMITTED) => {
                return Ok(Check::new(
                    "schema",
                    Verdict::Warning,
                    "the schema exists, but this role may not read which migrations are \
                     applied; run doctor as the schema's owner to check its version",
                ));
            }
            Err(error) => return Err(error.into()),
        };
        let known = crate::migrate::latest_version();
        Ok(match applied {
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
        })
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

/// What one host says of itself.
struct HostFacts {
    recovering: bool,
    read_only: bool,
    sync_names: String,
    /// As a standby: whether its WAL receiver streams, and the name it
    /// gives the primary.
    streaming: bool,
    application_name: String,
    /// As a primary: (application_name, sync_state) of each standby.
    standbys: Vec<(String, String)>,
}

/// What host `index` of `any` (a target whose attributes are `any`: every
/// server answers) says of itself, or why it cannot be asked.
async fn host_facts(any: &Target, index: usize) -> std::result::Result<HostFacts, String> {
    let mut connection = match any.connect_host(index, PER_HOST_TIMEOUT).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(why)) => return Err(why),
        Err(error) => return Err(error.to_string()),
    };
    let row = sql::query(sql::HOST_FACTS)
        .fetch_one(&mut connection)
        .await
        .map_err(|e| Error::from(e).to_string())?;
    let _ = sqlx::Connection::close(connection).await;
    let get = |row: &sqlx::postgres::PgRow| -> sqlx::Result<HostFacts> {
        let standbys: String = row.try_get("standbys")?;
        Ok(HostFacts {
            recovering: row.try_get("recovering")?,
            read_only: row.try_get("read_only")?,
            sync_names: row.try_get("sync_names")?,
            streaming: row.try_get("streaming")?,
            application_name: row.try_get("application_name")?,
            standbys: standbys
                .split_whitespace()
                .filter_map(|s| s.rsplit_once('='))
                .map(|(a, s)| (a.to_owned(), s.to_owned()))
                .collect(),
        })
    };
    get(&row).map_err(|e| Error::from(e).to_string())
}

/// The `host` and `promotion` checks of every host of `target`.
async fn hosts_checks(target: &Target) -> Vec<Check> {
    let names = target.hosts();
    let any = target.clone().with_attrs(SessionAttrs::Any);
    let mut facts = Vec::with_capacity(names.len());
    for index in 0..names.len() {
        facts.push(host_facts(&any, index).await);
    }
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
    for (index, found) in facts.iter().enumerate() {
        let host = &names[index];
        let check = match found {
            Err(why) => Check::new(
                "host",
                Verdict::Warning,
                format!("{host}: unreachable ({why}): a failover cannot go there now"),
            ),
            Ok(f) if !f.recovering && primaries.len() > 1 => Check::new(
                "host",
                Verdict::Problem,
                format!(
                    "{host}: accepts writes, and so does {}: two primaries (a split brain, or \
                     an old primary not yet demoted); leases taken on one are unknown to the \
                     other",
                    primaries
                        .iter()
                        .filter(|i| **i != index)
                        .map(|i| names[*i].as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            Ok(f) if !f.recovering => {
                let sync = f
                    .standbys
                    .iter()
                    .filter(|(_, s)| s == "sync" || s == "quorum")
                    .count();
                Check::new(
                    "host",
                    if f.read_only {
                        Verdict::Problem
                    } else {
                        Verdict::Ok
                    },
                    if f.read_only {
                        format!(
                            "{host}: the primary, but read-only (default_transaction_read_only \
                             is on): no lease operation succeeds"
                        )
                    } else {
                        format!(
                            "{host}: the primary; {} standby(s) stream from it, {sync} \
                             synchronous",
                            f.standbys.len()
                        )
                    },
                )
            }
            Ok(f) => standby_check(host, f, primary),
        };
        checks.push(check);
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
                "none of {} accepts writes: no lease operation succeeds until one is promoted",
                target.describe()
            ),
        ));
    }
    checks
}

fn standby_check(host: &str, f: &HostFacts, primary: Option<&HostFacts>) -> Check {
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

/// What `doctor` reads of timelines.
struct TimelineFacts {
    /// The server's timeline; `None` on a standby.
    current: Option<i64>,
    /// The latest one pglease recorded.
    recorded: i64,
    /// The latest change of timeline recorded.
    latest: Option<TimelineChange>,
    /// The grant delay after a change.
    delay: Duration,
}

impl LeaseManager {
    async fn timeline_facts(&self) -> Result<TimelineFacts> {
        let facts = sql::query(sql::TIMELINE_FACTS)
            .fetch_one(self.pool())
            .await?;
        let delay: i64 = facts.try_get("delay_us")?;
        Ok(TimelineFacts {
            current: facts.try_get("current")?,
            recorded: facts.try_get("recorded")?,
            latest: self.timeline_changes().await?.pop(),
            delay: Duration::from_micros(delay.max(0).unsigned_abs()),
        })
    }

    async fn failover_check(&self, options: &DoctorOptions) -> Result<Check> {
        let (ttl, ttl_from) = match options.ttl {
            Some(ttl) => (Some(ttl), "as given".to_owned()),
            None => {
                let shortest = sql::query(sql::SHORTEST_HELD_TTL)
                    .fetch_one(self.pool())
                    .await
                    .and_then(|row| row.try_get::<Option<i64>, _>(0));
                match shortest {
                    Ok(micros) => (
                        micros
                            .and_then(|m| u64::try_from(m).ok())
                            .map(Duration::from_micros),
                        "the shortest among the leases held now".to_owned(),
                    ),
                    Err(error) => {
                        return Ok(Check::new(
                            "failover",
                            Verdict::Warning,
                            format!(
                                "cannot read the held leases' TTLs ({}); give the shortest \
                                 TTL in use (pglease doctor --ttl D)",
                                Error::from(error)
                            ),
                        ));
                    }
                }
            }
        };
        let (failover, failover_from) = match (options.failover_time, &options.monitor) {
            (Some(time), _) => (Ok(time), "as given".to_owned()),
            (None, Some(monitor)) => (
                monitor_estimate(monitor).await,
                "estimated from the monitor's pgautofailover.* settings".to_owned(),
            ),
            (None, None) => match options.patroni {
                Some(patroni) => (
                    Ok(patroni.failover_estimate()),
                    format!(
                        "estimated from Patroni's ttl {} and loop_wait {}, plus 2 s to find \
                         the old leader's host gone and a second to promote",
                        Human(patroni.ttl),
                        Human(patroni.loop_wait)
                    ),
                ),
                None => (Err("not known".to_owned()), String::new()),
            },
        };
        let Some(ttl) = ttl else {
            return Ok(Check::new(
                "failover",
                Verdict::Warning,
                "no lease is held now and no TTL was given (pglease doctor --ttl D): cannot \
                 tell whether a failover fits it",
            ));
        };
        let failover = match failover {
            Ok(failover) => failover,
            Err(why) => {
                return Ok(Check::new(
                    "failover",
                    Verdict::Warning,
                    format!(
                        "failover time {why}: give it (pglease doctor --failover-time D, as \
                         measured; docs/design.md, \"Failover\"), the pg_auto_failover \
                         monitor (--monitor URL) or Patroni's REST API (--patroni URL) to check \
                         it against the TTL of {} ({ttl_from})",
                        Human(ttl)
                    ),
                ));
            }
        };
        let margin = self.options().get_safety_margin().unwrap_or(ttl / 50);
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
        Ok(if needed < room {
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
        })
    }
}

/// How long pglease may take to find a new primary and renew there once
/// it is writable: the watch task's search pause and the renewal's retry.
const FIND_PRIMARY: Duration = Duration::from_secs(1);

/// pg_auto_failover's detection and promotion time, from its monitor's
/// settings: a health check period, the checks and their retries, the time
/// a node is given before it is unhealthy, the wait for the old primary to
/// demote itself, and a second for the promotion itself.
async fn monitor_estimate(monitor: &Target) -> std::result::Result<Duration, String> {
    let (mut connection, _) = monitor
        .connect(PER_HOST_TIMEOUT)
        .await
        .map_err(|e| format!("unknown: the monitor cannot be read ({e})"))?;
    let rows = sql::query(sql::AUTO_FAILOVER_SETTINGS)
        .fetch_all(&mut connection)
        .await
        .map_err(|e| format!("unknown: the monitor cannot be read ({})", Error::from(e)))?;
    let _ = sqlx::Connection::close(connection).await;
    let setting = |name: &str| -> std::result::Result<u64, String> {
        rows.iter()
            .find(|row| row.try_get::<String, _>("name").is_ok_and(|n| n == name))
            .and_then(|row| row.try_get::<String, _>("setting").ok())
            .and_then(|value| value.parse().ok())
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
}
