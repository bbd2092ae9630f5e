//! A check of the server a manager uses, for what leases rely on: the
//! schema, durable commits, where a failover would go, the privilege that
//! bounds takeovers, and what the server version provides.

use sqlx::Row;

use crate::error::Result;
use crate::manager::LeaseManager;
use crate::sql;

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
    /// `takeover`, `security` (one per finding), `server_version`.
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

/// Server facts, read in one statement.
const FACTS: &str = "SELECT current_setting('server_version_num')::integer AS version, \
     current_setting('fsync') AS fsync, current_setting('full_page_writes') AS fpw, \
     current_setting('synchronous_standby_names') AS sync_names, \
     pg_is_in_recovery() AS recovering, \
     (SELECT count(*) FROM pg_stat_replication) AS standbys, \
     (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')) AS sync, \
     (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL) AS hidden, \
     to_regclass('pglease._pglease_migrations') IS NOT NULL AS migrated";

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
    /// - `replication`: every standby is synchronous, or there is none
    ///   (an asynchronous standby, once promoted, can lose acknowledged
    ///   acquisitions and issue their tokens again);
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
        let facts = sql::query(FACTS).fetch_one(self.pool()).await?;
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
        checks.push(replication_check(standbys, sync, hidden, &sync_names));
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
        let rows = match sql::query("SELECT level, topic, message FROM pglease.audit()")
            .fetch_all(self.pool())
            .await
        {
            Ok(rows) => rows,
            Err(error) if error.as_database_error().and_then(|e| e.code()).is_some() => {
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
            Err(error)
                if error
                    .as_database_error()
                    .and_then(|e| e.code())
                    .is_some_and(|code| code == "42501") =>
            {
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

fn replication_check(standbys: i64, sync: i64, hidden: i64, sync_names: &str) -> Check {
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
        Verdict::Problem,
        format!(
            "{} of {standbys} standby(s) are asynchronous (synchronous_standby_names is \
             {sync_names:?}): promoted after a failover, such a standby can lose acknowledged \
             acquisitions and issue their tokens again; name it in synchronous_standby_names, \
             or never fail over to it",
            standbys - sync
        ),
    )
}
