//! A check of the server a manager uses, for what leases rely on: the
//! schema, durable commits, where a failover would go, the privilege that
//! bounds takeovers, and what the server version provides.

// Two halves: `facts` reads (each statement from `crate::sql`) and judges
// nothing; `verdicts` turns facts into `Check`s, pure and unit-tested. A
// new check of the server: its fact in `sql::DOCTOR_FACTS` and
// `facts::Server`; its verdict, a pure function in verdicts.rs called
// from `verdicts::here` in its place, with a unit test and its name in
// the tests' `ORDER`; its name in the lists on `Admin::doctor`
// and `Check::name` below, and in docs/cli.md's table of checks. The
// integration tests that count the checks (`it::doctor`, `cli::commands`)
// say so when they fail.

use std::time::Duration;

use crate::connect::Target;
use crate::error::Result;
use crate::manager::Admin;
#[cfg(doc)]
use crate::manager::LeaseManager;

mod facts;
mod verdicts;

/// What [`Admin::doctor`] is told about the failover manager
/// and the leases, for the `failover` check of a manager of several hosts:
/// nothing by default; set with its builder methods, read with `get_*`.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct DoctorOptions {
    ttl: Option<Duration>,
    failover_time: Option<Duration>,
    monitor: Option<Target>,
    patroni: Option<PatroniTiming>,
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
    pub const fn new(ttl: Duration, loop_wait: Duration, retry_timeout: Duration) -> PatroniTiming {
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

    /// The shortest TTL the leases use; without it, the shortest among
    /// the leases held now (`expires_at` minus the last renewal).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long a failover takes, detection and promotion, as measured or
    /// configured; without it, estimated from the monitor's settings when
    /// [`monitor`](Self::monitor) is given, else from Patroni's when
    /// [`patroni`](Self::patroni) is.
    #[must_use]
    pub fn failover_time(mut self, time: Duration) -> Self {
        self.failover_time = Some(time);
        self
    }

    /// pg_auto_failover's monitor (`pg_autoctl show uri --monitor`), whose
    /// `pgautofailover.*` settings give the failover time estimate.
    #[must_use]
    pub fn monitor(mut self, monitor: Target) -> Self {
        self.monitor = Some(monitor);
        self
    }

    /// Patroni's timing (its REST API's `GET /config`), which gives the
    /// failover time estimate.
    #[must_use]
    pub fn patroni(mut self, timing: PatroniTiming) -> Self {
        self.patroni = Some(timing);
        self
    }

    /// The shortest TTL told, if any.
    pub fn get_ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The failover time told, if any.
    pub fn get_failover_time(&self) -> Option<Duration> {
        self.failover_time
    }

    /// The monitor told, if any.
    pub fn get_monitor(&self) -> Option<&Target> {
        self.monitor.as_ref()
    }

    /// Patroni's timing told, if any.
    pub fn get_patroni(&self) -> Option<PatroniTiming> {
        self.patroni
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

/// One check of [`Admin::doctor`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Check {
    /// What was checked: `schema`, `primary`, `pooler`, `durability`,
    /// `replication`, `timeline`, `takeover`, `security` (one per finding),
    /// `group` (one per lease group), `server_version`, `privileges` (one
    /// per missing privilege),
    /// `connection`; with
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
    pub(crate) fn new(name: &'static str, verdict: Verdict, detail: impl Into<String>) -> Check {
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

impl Admin<'_> {
    /// Checks the server the manager uses for what leases rely on, and
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
    ///   client has gone is abandoned (`client_connection_check_interval`);
    /// - `privileges`, once the schema exists: one check per privilege the
    ///   connected role lacks (USAGE on the schema, SELECT on the views an
    ///   application reads), each with the `GRANT` that gives it;
    /// - `connection`: whether the connection is encrypted (`pg_stat_ssl`),
    ///   its TLS version and cipher, and whether the server's identity was
    ///   verified (the sslmode in use); a warning for a connection that is
    ///   not encrypted, or not verified, to a host that is neither a
    ///   loopback address nor a socket.
    ///
    /// For a manager of several hosts (see
    /// [`LeaseManager::connect_with`]), a look at every host too:
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
    ///   ([`DoctorOptions::ttl`], else the shortest among the leases held
    ///   now) against the failover time ([`DoctorOptions::failover_time`],
    ///   else an estimate from pg_auto_failover's monitor,
    ///   [`DoctorOptions::monitor`], else from Patroni's timing,
    ///   [`DoctorOptions::patroni`]),
    ///   plus a second for pglease to find the new primary, before the
    ///   local deadline (TTL less the safety margin).
    ///
    /// # Errors
    ///
    /// [`Error::Database`](crate::Error::Database) if the server cannot be
    /// reached; findings, an unreachable host or monitor among them, are
    /// returned as data, never as errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn doctor(&self, options: &DoctorOptions) -> Result<Diagnosis> {
        let manager = self.manager();
        let here = manager.facts_here().await?;
        let mut checks = verdicts::here(&here, crate::migrate::latest_version());
        if let Some(follow) = &self.context().follow
            && follow.target.len() > 1
        {
            let hosts = facts::hosts(&follow.target).await;
            checks.extend(verdicts::hosts(
                &follow.target.hosts(),
                &hosts,
                &follow.target.describe(),
            ));
            let failover = manager.failover_facts(options).await;
            checks.push(verdicts::failover(
                &failover,
                manager.options().get_safety_margin(),
            ));
        }
        Ok(Diagnosis { checks })
    }
}
