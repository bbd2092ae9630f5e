//! Every statement the library sends, in one place. Each is one round trip
//! and at most one commit; the clock and lock each relies on are described
//! at the function it calls, in `migrations/`.
//!
//! No other module writes SQL. Who sends it: the facade (`manager`) and
//! the modules on its surface (`history`, `elect`, `observe`) send
//! nothing themselves, but call `db`; each module below the facade
//! (`connect`, `context`, `db`, `notify`, `fencing`, `hold`, `wait`) sends
//! the statements of its own concern, on the pool or on a connection it
//! owns; above the facade only `advisory`, `migrate` and `doctor`'s facts
//! send, each on a connection it owns (the doctor also on the pool).
//!
//! Statements go over the simple query protocol with their values written
//! in as literals: a transaction pooler (PgBouncer in transaction mode)
//! may hand each statement to a different server session, where a
//! statement prepared on another does not exist, and sqlx's unnamed
//! statements take two round trips that the pooler may split. The simple
//! protocol is one message and one answer, on any server and any pooler
//! version. Values come back in text format, which sqlx decodes for every
//! type used here. Acquire, renew and release also have a form with
//! parameters ([`ACQUIRE_PREPARED`] and the two beside it), which the
//! manager prepares once it knows no pooler is in the way (see
//! `ManagerOptions::prepared_statements`).
//!
//! The exception is the advisory-lock comparison (`crate::advisory`),
//! whose statements bind the key as `$1` and are prepared: session
//! advisory locks need a session of their own anyway, which no
//! transaction pooler keeps.

use std::fmt::{self, Display, Write};

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use sqlx::{AssertSqlSafe, RawSql};

use crate::lease::Fence;
use crate::schema::MIGRATIONS_TABLE;
use crate::token::Token;

/// A statement built by this module, ready to send.
pub(crate) fn query(statement: impl Into<String>) -> RawSql {
    sqlx::raw_sql(AssertSqlSafe(statement.into()))
}

/// A text value as an escape string literal (`E'...'`), whose meaning does
/// not depend on `standard_conforming_strings`: backslashes and quotes are
/// doubled or escaped, so nothing in the value can end the literal. (A NUL
/// byte, which PostgreSQL text cannot hold and the inputs refuse anyway,
/// would end the query string inside the literal: a syntax error.)
struct Text<'a>(&'a str);

/// `value` as a text literal (see [`Text`]).
pub(crate) fn text(value: &str) -> String {
    Text(value).to_string()
}

impl Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("E'")?;
        for c in self.0.chars() {
            if matches!(c, '\\' | '\'') {
                f.write_char('\\')?;
            }
            f.write_char(c)?;
        }
        f.write_char('\'')
    }
}

/// An interval literal, exact to the microsecond.
struct Interval<'a>(&'a PgInterval);

impl Display for Interval<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let PgInterval {
            months,
            days,
            microseconds,
        } = *self.0;
        write!(
            f,
            "'{months} mons {days} days {microseconds} microseconds'::interval"
        )
    }
}

/// `'{"a","b",...}'::type[]`: one array literal, which the server reads as
/// one value (an `ARRAY[...]` of thousands of expressions took a third
/// longer to run for a batch of 20,000 renewals). Each element is quoted
/// for the array syntax (backslash before `"` and `\`), and the whole is a
/// text literal ([`Text`]), so no element can end either.
fn array<T>(items: &[T], element: impl Fn(&T) -> String, ty: &str) -> String {
    let mut body = String::with_capacity(2 + items.len() * 24);
    body.push('{');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push('"');
        for c in element(item).chars() {
            if c == '"' || c == '\\' {
                body.push('\\');
            }
            body.push(c);
        }
        body.push('"');
    }
    body.push('}');
    format!("{}::{ty}[]", Text(&body))
}

/// How a name is acquired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// One holder (`pglease.acquire`); `waits`: the acquirer attempts
    /// again until it acquires, and keeps new shared holders out meanwhile.
    Exclusive { waits: bool },
    /// One of N slots (`pglease.acquire_counted`).
    Counted(u32),
    /// Beside other shared holders (`pglease.acquire_shared`).
    Shared,
}

/// Acquire if free or expired. Database clock (`clock_timestamp()` after the
/// row lock); read-only when the lease is held; ends the sessions still
/// fenced on an ended lease; answers within about 2 s, with a note saying
/// why an ended lease could not be taken.
/// With a value, `set_value` runs in the same statement (one round trip,
/// one commit) once the acquisition has succeeded; a failed one stays
/// read-only. Session-bound: bound to the session that sends it.
pub(crate) fn acquire(
    name: &str,
    holder: &str,
    ttl: &PgInterval,
    value: Option<&str>,
    mode: Mode,
    session_bound: bool,
    ticket: Option<i64>,
) -> String {
    let slots = match mode {
        Mode::Counted(slots) => Some(slots),
        Mode::Exclusive { .. } | Mode::Shared => None,
    };
    // Only when wanted: the defaults are the function's own.
    let bound = match (session_bound, ticket) {
        (_, Some(ticket)) => format!(", {session_bound}, {ticket}::bigint"),
        (true, None) => ", true".to_owned(),
        (false, None) => String::new(),
    };
    // A counted lease answers the slot too: the lease it acquired, or the
    // one that expires first; it has no line.
    let ahead = if slots.is_some() {
        "NULL::integer AS ahead, NULL::boolean AS fair"
    } else {
        "ahead, fair"
    };
    let (acquire, slot) = match slots {
        None if mode == Mode::Shared => (
            format!(
                "pglease.acquire_shared({}, {}, {})",
                Text(name),
                Text(holder),
                Interval(ttl)
            ),
            format!("{}::text", Text(name)),
        ),
        None => (
            format!(
                "pglease.acquire({}, {}, {}{bound}{})",
                Text(name),
                Text(holder),
                Interval(ttl),
                // A waiter keeps new shared holders out while it waits.
                if mode == (Mode::Exclusive { waits: true }) {
                    ", waits => true"
                } else {
                    ""
                }
            ),
            format!("{}::text", Text(name)),
        ),
        Some(slots) => (
            format!(
                "pglease.acquire_counted({}, {slots}, {}, {}{bound})",
                Text(name),
                Text(holder),
                Interval(ttl)
            ),
            "slot_name".to_owned(),
        ),
    };
    match value {
        None => format!(
            "SELECT token, expires_at, holder, checked_at, note, {slot} AS slot_name, \
                    holder_session, delayed_until, {ahead} FROM {acquire}"
        ),
        Some(value) => format!(
            "WITH a AS MATERIALIZED (SELECT * FROM {acquire}) \
             SELECT token, expires_at, holder, checked_at, note, {slot} AS slot_name, \
                    holder_session, delayed_until, {ahead}, \
                    CASE WHEN token IS NOT NULL THEN pglease.set_value({slot}, token, {}) END \
               FROM a",
            Text(value)
        ),
    }
}

/// [`acquire`] of one holder, no value, bound to no session, with its
/// values as parameters ($1 name, $2 holder, $3 ttl, $4 ticket or NULL,
/// $5 waits): what the manager sends when it prepares (see
/// `ManagerOptions::prepared_statements`).
pub(crate) const ACQUIRE_PREPARED: &str = "SELECT token, expires_at, holder, checked_at, note, $1::text AS slot_name, holder_session, \
            delayed_until, ahead, fair FROM pglease.acquire($1, $2, $3, false, $4, $5)";

/// [`renew`] with its values as parameters (see [`ACQUIRE_PREPARED`]).
pub(crate) const RENEW_PREPARED: &str = "SELECT pglease.renew($1, $2, $3)";

/// [`release`] with its values as parameters (see [`ACQUIRE_PREPARED`]).
pub(crate) const RELEASE_PREPARED: &str = "SELECT pglease.release($1, $2)";

/// Acquire every lease of `names` or none (see `pglease.acquire_all`):
/// one row per name in byte order when all were acquired, otherwise one
/// row, token NULL, for the first name that could not be taken.
pub(crate) fn acquire_all(
    names: &[String],
    holder: &str,
    ttl: &PgInterval,
    ticket: Option<i64>,
) -> String {
    let ticket = ticket.map_or_else(String::new, |t| format!(", {t}::bigint"));
    format!(
        "SELECT name, token, expires_at, holder, checked_at, note, holder_session, \
                delayed_until, ahead, fair FROM pglease.acquire_all({}, {}, {}{ticket})",
        array(names, |n| n.clone(), "text"),
        Text(holder),
        Interval(ttl)
    )
}

/// Join the line of every name of `names` (first come, first served): the
/// ticket (NULL: the line is full), position and how many wait.
pub(crate) fn enqueue(
    names: &[String],
    holder: &str,
    ttl: &PgInterval,
    max_waiting: Option<u32>,
) -> String {
    let bound = max_waiting.map_or_else(String::new, |n| format!(", {n}"));
    format!(
        "SELECT ticket, position, waiting FROM pglease.enqueue({}, {}, {}{bound})",
        array(names, |n| n.clone(), "text"),
        Text(holder),
        Interval(ttl)
    )
}

/// Leave the line: end every place of `ticket`.
pub(crate) fn dequeue(ticket: i64) -> String {
    format!("SELECT pglease.dequeue({ticket}::bigint)")
}

/// Who waits in line for `name`, from the front.
pub(crate) fn places_in_line(name: &str) -> String {
    format!(
        "SELECT ticket, holder, position, joined_at, expires_at FROM pglease.line \
          WHERE name = {} ORDER BY position",
        Text(name)
    )
}

/// The valid shared holders of `name`, the first acquired first.
pub(crate) fn shared_holders(name: &str) -> String {
    format!(
        "SELECT token, holder, role::text AS role, acquired_at, expires_at, renewals \
           FROM pglease.shared WHERE name = {} ORDER BY token",
        Text(name)
    )
}

/// Publish (or, with `None`, clear) the value of a valid lease; false when
/// lost.
pub(crate) fn set_value(name: &str, token: Token, value: Option<&str>) -> String {
    format!(
        "SELECT pglease.set_value({}, {}::bigint, {})",
        Text(name),
        token.get(),
        value.map_or_else(|| "NULL".to_owned(), text)
    )
}

/// Extend a valid lease; NULL when lost. Database clock at the row update.
pub(crate) fn renew(name: &str, token: Token, ttl: &PgInterval) -> String {
    format!(
        "SELECT pglease.renew({}, {}::bigint, {})",
        Text(name),
        token.get(),
        Interval(ttl)
    )
}

/// Renew many leases in one statement and one commit (the background
/// renewal tick). Database clock at each row update.
pub(crate) fn renew_many(names: &[&str], tokens: &[i64], ttls: &[PgInterval]) -> String {
    format!(
        "SELECT name, token, expires_at, renewed, current_token, current_holder, session_ended, \
                forgotten_in \
         FROM pglease.renew_many({}, {}, {})",
        array(names, |n| (*n).to_owned(), "text"),
        array(tokens, i64::to_string, "bigint"),
        array(
            ttls,
            |t| format!(
                "{} mons {} days {} microseconds",
                t.months, t.days, t.microseconds
            ),
            "interval"
        ),
    )
}

/// End a valid lease; false when it was not valid. Notifies
/// `pglease_release` when it ends one that a session watches.
pub(crate) fn release(name: &str, token: Token) -> String {
    format!(
        "SELECT pglease.release({}, {}::bigint)",
        Text(name),
        token.get()
    )
}

/// Make every waiter for `name` wait in line (or not): administrators.
pub(crate) fn set_fair(name: &str, fair: bool) -> String {
    format!("SELECT pglease.set_fair({}, {fair})", Text(name))
}

/// Move a held lease to `successor`, waiting in its line, for `ttl`: the
/// new token, or NULL when it was released instead (`or_release`) or kept.
pub(crate) fn hand_over(
    fence: &Fence,
    successor: &str,
    ttl: &PgInterval,
    or_release: bool,
) -> String {
    format!(
        "SELECT pglease.hand_over({}, {}::bigint, {}, {}{})",
        Text(fence.name()),
        fence.token().get(),
        Text(successor),
        Interval(ttl),
        if or_release {
            ""
        } else {
            ", or_release => false"
        }
    )
}

/// Join `group` as `member` for `ttl` (creating it with `partitions`):
/// acquire's answer for the membership lease.
pub(crate) fn join_group(group: &str, member: &str, partitions: u32, ttl: &PgInterval) -> String {
    format!(
        "SELECT token, expires_at, holder, checked_at, note \
         FROM pglease.join_group({}, {}, {partitions}, {})",
        Text(group),
        Text(member),
        Interval(ttl)
    )
}

/// The group now: its partition count, live members and, with
/// `partitions`, each partition's valid owner.
pub(crate) fn group_state(group: &str, partitions: bool) -> String {
    format!(
        "SELECT kind, member, partition, token, \
         (extract(epoch FROM remaining) * 1000000)::bigint AS remaining_us, handed \
         FROM pglease.group_state({}, {partitions})",
        Text(group)
    )
}

/// Take `partitions` of `group` as `member` under its membership token.
pub(crate) fn take_partitions(
    group: &str,
    member: &str,
    member_token: Token,
    partitions: &[usize],
    ttl: &PgInterval,
) -> String {
    format!(
        "SELECT partition, token, expires_at, acquired_at, handed \
         FROM pglease.take_partitions({}, {}, {}::bigint, {}, {})",
        Text(group),
        Text(member),
        member_token.get(),
        array(partitions, ToString::to_string, "integer"),
        Interval(ttl)
    )
}

/// Hand each of `partitions` of `group`, held under `tokens`, over to
/// its member in `successors` (empty: release it): one row per partition
/// with its new token, NULL when released or no longer valid.
pub(crate) fn hand_over_partitions(
    group: &str,
    partitions: &[usize],
    tokens: &[i64],
    successors: &[&str],
    ttl: &PgInterval,
) -> String {
    format!(
        "SELECT partition, token FROM pglease.hand_over_partitions({}, {}, {}, {}, {})",
        Text(group),
        array(partitions, ToString::to_string, "integer"),
        array(tokens, ToString::to_string, "bigint"),
        array(successors, |s| (*s).to_owned(), "text"),
        Interval(ttl)
    )
}

/// Say that `member` is leaving `group`: the others stop counting it.
pub(crate) fn start_leaving(group: &str, member: &str, member_token: Token) -> String {
    format!(
        "SELECT pglease.start_leaving({}, {}, {}::bigint)",
        Text(group),
        Text(member),
        member_token.get()
    )
}

/// End `member`'s membership of `group`.
pub(crate) fn leave_group(group: &str, member: &str, member_token: Token) -> String {
    format!(
        "SELECT pglease.leave_group({}, {}, {}::bigint)",
        Text(group),
        Text(member),
        member_token.get()
    )
}

/// Change a group's partition count: the count before.
pub(crate) fn set_group_partitions(group: &str, partitions: u32) -> String {
    format!(
        "SELECT pglease.set_group_partitions({}, {partitions})",
        Text(group)
    )
}

/// Every group: partitions, live members, owned partitions.
pub(crate) const GROUPS: &str = "SELECT name, partitions, members, owned, created_by::text, created_at FROM pglease.groups ORDER BY name";

/// Whether `hand_over` would hand the lease over to `successor` now.
pub(crate) fn successor_waits(fence: &Fence, successor: &str) -> String {
    format!(
        "SELECT pglease.successor_waits({}, {}::bigint, {})",
        Text(fence.name()),
        fence.token().get(),
        Text(successor)
    )
}

/// Blocks for at most half a second until the server session with
/// process id `pid` has ended (or let go of its session-bound leases'
/// wake-up key): one implicit transaction, whose lock and setting end
/// with it, also through a transaction pooler.
pub(crate) fn session_wake(pid: i32) -> String {
    format!(
        "SET LOCAL lock_timeout = '500ms'; \
         SELECT pg_advisory_xact_lock_shared(1886155618, {pid})"
    )
}

/// On the listening connection: be notified when a lease is released
/// (false while a release of it is committing: try again).
pub(crate) fn watch(name: &str) -> String {
    format!("SELECT pglease.watch({0}), hashtext({0})::text", Text(name))
}

/// On the listening connection: undo one `watch`.
pub(crate) fn unwatch(name: &str) -> String {
    format!("SELECT pglease.unwatch({})", Text(name))
}

/// Check a token inside a transaction and hold FOR KEY SHARE on the lease
/// row until the transaction ends: a shared holder's with
/// `assert_shared`, which declares no write.
pub(crate) fn assert_held(fence: &Fence) -> String {
    let function = if fence.is_shared() {
        "assert_shared"
    } else {
        "assert_held"
    };
    format!(
        "SELECT pglease.{function}({}, {}::bigint)",
        Text(fence.name()),
        fence.token().get()
    )
}

/// `BEGIN` and [`assert_held`] as one simple query (one round trip).
pub(crate) fn begin_fenced(fence: &Fence) -> String {
    format!("BEGIN; {}", assert_held(fence))
}

/// Separate-resource fencing: accept iff the token is the highest seen.
pub(crate) fn admit(resource: &str, token: Token) -> String {
    format!(
        "SELECT pglease.admit({}, {}::bigint)",
        Text(resource),
        token.get()
    )
}

/// The status view's columns as `LeaseStatus` reads them.
macro_rules! status_select {
    ($rest:literal) => {
        concat!(
            "SELECT name, holder, token, expires_at, ",
            "(extract(epoch FROM remaining) * 1000000)::bigint AS remaining_us, held, value, ",
            "step_down_requested_by, step_down_requested_at, renewals, holder_session, session_ended, ",
            "kind, readers, readers_until, slots, slots_held, fair, waiting ",
            "FROM pglease.status",
            $rest
        )
    };
}

/// One lease as the status view shows it (database clock at the read).
pub(crate) fn inspect(name: &str) -> String {
    format!("{} WHERE name = {}", status_select!(""), Text(name))
}

/// Why a fence may no longer be accepted (the failure path of renew,
/// release and set_value): the status view's row for its lease (every
/// column NULL for a name never acquired), and the timeline whose change
/// made the database forget the acquisition, if one did.
pub(crate) fn fence_status(fence: &Fence) -> String {
    let (name, token) = (fence.name(), fence.token());
    if fence.is_shared() {
        // A shared holder's token: valid or not (an ended one is gone).
        return format!(
            "SELECT EXISTS (SELECT 1 FROM pglease.shared WHERE name = {0} \
                              AND token = {1}::bigint) AS shared_held, \
                    pglease.forgotten_in({0}, {1}::bigint) AS forgotten_in",
            Text(name),
            token.get()
        );
    }
    format!(
        "SELECT s.*, pglease.forgotten_in({0}, {1}::bigint) AS forgotten_in \
           FROM (SELECT) AS one LEFT JOIN ({2} WHERE name = {0}) AS s ON true",
        Text(name),
        token.get(),
        status_select!("")
    )
}

/// The leases `filter` keeps, by name.
pub(crate) fn list(filter: &crate::lease::ListFilter) -> String {
    let mut conditions = Vec::new();
    if filter.get_held() {
        conditions.push("kind <> 'free'".to_owned());
    }
    if filter.get_expired() {
        conditions.push("kind = 'free' AND holder IS NOT NULL".to_owned());
    }
    if let Some(prefix) = filter.get_prefix() {
        conditions.push(format!("starts_with(name, {})", Text(prefix)));
    }
    let mut statement = status_select!("").to_owned();
    if !conditions.is_empty() {
        statement.push_str(" WHERE ");
        statement.push_str(&conditions.join(" AND "));
    }
    statement.push_str(" ORDER BY name");
    if let Some(limit) = filter.get_limit() {
        let _ = write!(statement, " LIMIT {limit}");
    }
    statement
}

/// Be notified on this session of every change of `name` (after LISTEN
/// on [`crate::schema::CHANGE_CHANNEL`]).
pub(crate) fn observe(name: &str) -> String {
    format!(
        "SELECT pglease.observe({0}), hashtext({0})::text",
        Text(name)
    )
}

/// On the listening connection: undo one `observe`.
pub(crate) fn unobserve(name: &str) -> String {
    format!("SELECT pglease.unobserve({})", Text(name))
}

/// Ask the holder of `name` to step down; the token asked, or NULL.
pub(crate) fn request_step_down(name: &str, by: &str) -> String {
    format!(
        "SELECT pglease.request_step_down({}, {})",
        Text(name),
        Text(by)
    )
}

/// End a held lease at once and move its fence; the token ended, or NULL.
pub(crate) fn force_release(name: &str, reason: &str) -> String {
    format!(
        "SELECT pglease.force_release({}, {})",
        Text(name),
        Text(reason)
    )
}

/// The recorded transitions of `name`, oldest first, from `since` on.
pub(crate) fn history(name: &str, since: Option<DateTime<Utc>>) -> String {
    let since = match since {
        Some(since) => format!(" AND at >= {}::timestamptz", Text(&since.to_rfc3339())),
        None => String::new(),
    };
    // A change of timeline (name NULL) belongs to every lease's history.
    // By time, then id: rows are not written in the order of their times
    // (a takeover records the eviction of the old term's fenced sessions
    // first, then that term's expiry, at the earlier time it expired).
    format!(
        "SELECT id, coalesce(name, {0}) AS name, token, event, holder, at, renewals, detail, \
                role::text AS role \
         FROM pglease.history \
          WHERE (name = {0} OR name IS NULL){since} ORDER BY at, id",
        Text(name)
    )
}

/// Make a table reject writes from transactions that do not hold a lease.
pub(crate) fn protect(table: &str, name: &str) -> String {
    format!(
        "SELECT pglease.protect({}::regclass, {})",
        Text(table),
        Text(name)
    )
}

/// Remove that protection; true if the table was protected.
pub(crate) fn unprotect(table: &str) -> String {
    format!("SELECT pglease.unprotect({}::regclass)", Text(table))
}

/// Turn the DDL fence on or off; true if it was on.
pub(crate) fn fence_ddl(on: bool) -> String {
    format!("SELECT pglease.fence_ddl({on})")
}

/// For `doctor`: the server's timeline, the latest one pglease recorded,
/// and the grant delay in microseconds (NULL on a standby, where the
/// timeline cannot be read and nothing draws tokens).
pub(crate) const TIMELINE_FACTS: &str = "SELECT CASE WHEN NOT pg_is_in_recovery() \
            THEN pglease.server_timeline() END AS current, \
        (SELECT timeline FROM pglease.timelines ORDER BY at DESC LIMIT 1) AS recorded, \
        (SELECT (extract(epoch FROM delay) * 1000000)::bigint FROM pglease.grant_delay) \
            AS delay_us";

/// The changes of timeline recorded (not the row of the migration).
pub(crate) const TIMELINE_CHANGES: &str = "SELECT timeline, previous, seen, floor, at, grant_after, cause \
     FROM pglease.timelines WHERE cause <> 'migrated' ORDER BY at";

/// The latest migration applied to the schema.
pub(crate) const SCHEMA_VERSION: &str =
    "SELECT max(version) FROM pglease._pglease_migrations WHERE success";

/// Whether the owner of the functions may end stale fenced sessions.
pub(crate) const CAN_END_STALE: &str = "SELECT pglease.can_end_stale_transactions()";

/// The role that owns the functions (the one `CAN_END_STALE` is about).
pub(crate) const FUNCTIONS_OWNER: &str = "SELECT r.rolname::text FROM pg_catalog.pg_proc AS p \
       JOIN pg_catalog.pg_roles AS r ON r.oid = p.proowner \
      WHERE p.oid = 'pglease.acquire(text, text, interval, boolean, bigint, boolean)'::pg_catalog.regprocedure";

/// The database server's clock, as every lease decision reads it.
pub(crate) const DATABASE_TIME: &str = "SELECT clock_timestamp()";

/// How many lease names the database knows (held or not).
pub(crate) const COUNT_LEASES: &str = "SELECT count(*) FROM pglease.status";

// The doctor's facts.

/// The doctor's server facts, read in one statement.
pub(crate) const DOCTOR_FACTS: &str = "SELECT current_setting('server_version_num')::integer AS version, \
     current_setting('fsync') AS fsync, current_setting('full_page_writes') AS fpw, \
     current_setting('synchronous_standby_names') AS sync_names, \
     pg_is_in_recovery() AS recovering, \
     (SELECT count(*) FROM pg_stat_replication) AS standbys, \
     (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')) AS sync, \
     (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL) AS hidden, \
     EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE n.nspname = 'pglease' AND c.relname = '_pglease_migrations') AS migrated";

/// How the connection `doctor` asks through is secured.
pub(crate) const CONNECTION_SECURITY: &str =
    "SELECT ssl, version, cipher FROM pg_stat_ssl WHERE pid = pg_backend_pid()";

/// What the connected role may do with the schema: use it, and which of
/// the views an application reads (docs/design.md, "Roles and grants") it
/// may not read. The views are found by their catalogue rows, readable
/// without USAGE on the schema (a name would need it to resolve).
pub(crate) const PRIVILEGE_FACTS: &str = "SELECT current_user::text AS role, \
     has_schema_privilege('pglease', 'USAGE') AS usage, \
     coalesce((SELECT string_agg('pglease.' || c.relname, ', ' ORDER BY t.o) \
                 FROM unnest(ARRAY['status', 'history', 'shared']) WITH ORDINALITY AS t(r, o) \
                 JOIN pg_class c ON c.relname = t.r \
                 JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'pglease' \
                WHERE NOT has_table_privilege(c.oid, 'SELECT')), '') AS unreadable";

/// The security posture (`pglease.audit()`).
pub(crate) const AUDIT: &str = "SELECT level, topic, message FROM pglease.audit()";

/// What one host of several says of itself (the doctor's topology).
pub(crate) const HOST_FACTS: &str = "SELECT pg_is_in_recovery() AS recovering, \
     current_setting('transaction_read_only') = 'on' AS read_only, \
     current_setting('synchronous_standby_names') AS sync_names, \
     coalesce((SELECT status = 'streaming' FROM pg_stat_wal_receiver), false) AS streaming, \
     coalesce((SELECT substring(conninfo FROM 'application_name=([^ ]+)') \
                 FROM pg_stat_wal_receiver), \
              nullif(current_setting('cluster_name'), ''), 'walreceiver') AS application_name, \
     coalesce((SELECT string_agg(application_name || '=' || coalesce(sync_state, '?'), ' ') \
                 FROM pg_stat_replication), '') AS standbys";

/// The shortest TTL among the leases held now, exclusive and shared, in
/// microseconds (the doctor's failover check, when no TTL is given).
pub(crate) const SHORTEST_HELD_TTL: &str = "SELECT (extract(epoch FROM min(ttl)) * 1000000)::bigint \
     FROM (SELECT expires_at - coalesce(renewed_at, acquired_at) AS ttl FROM pglease.leases \
            WHERE holder IS NOT NULL AND expires_at > now() \
           UNION ALL \
           SELECT expires_at - coalesce(renewed_at, acquired_at) FROM pglease._shared \
            WHERE expires_at > now()) AS held";

/// pg_auto_failover's settings, on its monitor.
pub(crate) const AUTO_FAILOVER_SETTINGS: &str =
    "SELECT name, setting FROM pg_settings WHERE name LIKE 'pgautofailover.%'";

// Advisory locks (`crate::advisory`, the unfenced comparison), prepared,
// key `$1`.

/// Whether the caller's own session holds advisory key `$1`.
pub(crate) const ADVISORY_SESSION_HOLDS: &str = "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
     AND pid = pg_backend_pid() AND granted AND objsubid = 1 \
     AND classid = (($1::bigint >> 32) & 4294967295)::oid \
     AND objid = ($1::bigint & 4294967295)::oid)";

/// Releases one hold of session lock `$1`; whether it was held.
pub(crate) const ADVISORY_UNLOCK: &str = "SELECT pg_advisory_unlock($1)";

/// Releases every session lock the connection holds.
pub(crate) const ADVISORY_UNLOCK_ALL: &str = "SELECT pg_advisory_unlock_all()";

/// Tries session lock `$1`; whether taken, and the session's process id.
pub(crate) const ADVISORY_TRY_LOCK: &str = "SELECT pg_try_advisory_lock($1), pg_backend_pid()";

/// `lock_timeout` for this transaction only, `$1` in milliseconds.
pub(crate) const LOCAL_LOCK_TIMEOUT: &str = "SELECT set_config('lock_timeout', $1, true)";

/// Waits for session lock `$1`; the session's process id.
pub(crate) const ADVISORY_LOCK: &str =
    "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock($1)) AS locked";

/// Tries transaction lock `$1`; whether taken.
pub(crate) const ADVISORY_TRY_XACT_LOCK: &str = "SELECT pg_try_advisory_xact_lock($1)";

// Migrations (`crate::migrate`), on a connection of their own.

/// The migration's start: take the lock `lock`, then make sure the schema and the record exist, and read
/// the record (one round trip).
pub(crate) fn migration_prepare(lock: i64) -> String {
    format!(
        "BEGIN; SELECT pg_advisory_xact_lock({lock}); \
         CREATE SCHEMA IF NOT EXISTS pglease; \
         CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} ( \
             version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
             installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL, \
             checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL); \
         SELECT version, encode(checksum, 'hex') AS checksum, success \
           FROM {MIGRATIONS_TABLE} ORDER BY version"
    )
}

/// Records migration `version` as applied (in the migration's transaction).
pub(crate) fn record_migration(
    version: i64,
    description: &str,
    checksum_hex: &str,
    nanos: i64,
) -> String {
    format!(
        "INSERT INTO {MIGRATIONS_TABLE} (version, description, success, checksum, execution_time) \
         VALUES ({version}, {}, true, decode({}, 'hex'), {nanos})",
        Text(description),
        Text(checksum_hex),
    )
}

/// Ends the migration's transaction.
pub(crate) const COMMIT: &str = "COMMIT";

/// Abandons the transaction in progress (a migration's, a fenced one
/// that failed to open, a probe's).
pub(crate) const ROLLBACK: &str = "ROLLBACK";

// Connecting (`crate::connect`).

/// Run on every new connection of `connect::pool_options`: if the client goes
/// away while a statement of its own still runs or waits in the server (an
/// acquisition held up behind a lock when the process is killed), the
/// server notices within a second and abandons the statement, instead of
/// completing it and holding a lease for nobody until it expires. The
/// setting exists from PostgreSQL 14; older servers skip it.
pub(crate) const ABANDON_WHEN_GONE: &str = "SELECT set_config('client_connection_check_interval', '1000', false) \
     WHERE current_setting('server_version_num')::integer >= 140000";

/// The session's process id.
pub(crate) const BACKEND_PID: &str = "SELECT pg_backend_pid()";

/// A transaction begun, and the session's process id (the pooler probe:
/// does a second connection keep its server session?).
pub(crate) const BEGIN_BACKEND_PID: &str = "BEGIN; SELECT pg_backend_pid()";

/// Whether the server is a standby, and whether it refuses writes
/// (`target_session_attrs`).
pub(crate) const RECOVERY_AND_READ_ONLY: &str =
    "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_into_literals() {
        let token = Token::issued(42);
        assert_eq!(
            begin_fenced(&Fence::new(r"it's a\name", token).unwrap()),
            r"BEGIN; SELECT pglease.assert_held(E'it\'s a\\name', 42::bigint)"
        );
        assert_eq!(
            begin_fenced(&Fence::shared("doc", token).unwrap()),
            r"BEGIN; SELECT pglease.assert_shared(E'doc', 42::bigint)"
        );
        assert_eq!(
            release("plain", token),
            "SELECT pglease.release(E'plain', 42::bigint)"
        );
    }

    #[test]
    fn intervals_and_arrays_are_typed() {
        let ttl = PgInterval {
            months: 0,
            days: 0,
            microseconds: 1_500_000,
        };
        assert_eq!(
            Interval(&ttl).to_string(),
            "'0 mons 0 days 1500000 microseconds'::interval"
        );
        assert_eq!(
            renew_many(&[], &[], &[]),
            "SELECT name, token, expires_at, renewed, current_token, current_holder, session_ended, \
                    forgotten_in \
             FROM pglease.renew_many(E'{}'::text[], E'{}'::bigint[], E'{}'::interval[])"
        );
        // Quoted for the array, then for the text literal.
        assert!(
            renew_many(&["a", r#"b'"\,{}"#], &[1, 2], &[ttl, ttl]).contains(
                r#"(E'{"a","b\'\\"\\\\,{}"}'::text[], E'{"1","2"}'::bigint[], E'{"0 mons 0 days 1500000 microseconds","#
            )
        );
    }
}
