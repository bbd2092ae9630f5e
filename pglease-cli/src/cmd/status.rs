//! `pglease status [NAME]`: one lease, or the leases the filters keep.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use pglease::{Error, LeaseKind, LeaseManager, LeaseStatus, ListFilter};
use serde_json::json;

use crate::args::StatusArgs;
use crate::exit::{self, Outcome};
use crate::output::{note, out, printable, short, status_json};

/// `pglease status [NAME]`: one name (exit 3 if nobody holds it), or the
/// leases the filters keep, with a summary line on stderr.
pub(crate) async fn status(manager: &LeaseManager, args: StatusArgs) -> Outcome {
    if let Some(group) = &args.group {
        return group_status(manager, group, args.json).await;
    }
    let filter = filter(&args);
    let name = args.name.as_deref();
    let leases = match name {
        Some(name) => vec![manager.inspect(name).await.map_err(|e| (e, "status"))?],
        // Filtered and limited in the database.
        None => manager.list(&filter).await.map_err(|e| (e, "status"))?,
    };
    let code = match name {
        Some(_) if !leases[0].is_held_by_anyone() => ExitCode::from(exit::NOT_ACQUIRED),
        _ => ExitCode::SUCCESS,
    };
    if args.json {
        let value = match name {
            Some(_) => one_json(manager, &leases[0]).await?,
            None => serde_json::Value::Array(leases.iter().map(status_json).collect()),
        };
        out!("{value}");
        return Ok(code);
    }
    let now: DateTime<Utc> = manager
        .admin()
        .database_time()
        .await
        .map_err(|e| (e, "status"))?;
    table(&leases, now);
    if name.is_none() && unfiltered(&args) {
        groups_table(manager).await;
    }
    if name.is_none() && !crate::output::quiet() {
        summary(manager, &leases).await?;
    }
    timeline_note(manager, now).await;
    Ok(code)
}

/// Whether no filter was asked for (the whole overview).
fn unfiltered(args: &StatusArgs) -> bool {
    !args.held && !args.expired && args.prefix.is_none() && args.limit.is_none()
}

/// The overview's lease groups, after its leases: a table, if there are
/// any and the role may read `pglease.groups` (nothing otherwise).
async fn groups_table(manager: &LeaseManager) {
    let Ok(groups) = manager.admin().groups().await else {
        return;
    };
    if groups.is_empty() {
        return;
    }
    let (names, width) = column(groups.iter().map(|g| g.name.as_str()), NAME_WIDTH, "GROUP");
    out!();
    out!(
        "{:<width$} {:>10} {:>8} {:>6}",
        "GROUP",
        "PARTITIONS",
        "MEMBERS",
        "OWNED"
    );
    for (g, shown) in groups.iter().zip(&names) {
        out!(
            "{shown:<width$} {:>10} {:>8} {:>6}",
            g.partitions,
            g.members,
            g.owned
        );
    }
}

/// `status --group GROUP`: a line per member with the partitions it owns,
/// then the free partitions; `--json`: one object.
async fn group_status(manager: &LeaseManager, group: &str, json: bool) -> Outcome {
    let status = manager.group(group).await.map_err(|e| (e, "status"))?;
    let free: Vec<u32> = status
        .owners
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_none())
        .map(|(k, _)| k as u32)
        .collect();
    if json {
        out!("{}", group_json(&status, &free));
        return Ok(ExitCode::SUCCESS);
    }
    let (names, width) = column(
        status.members.iter().map(|m| m.name.as_str()),
        HOLDER_WIDTH,
        "MEMBER",
    );
    out!(
        "{:<width$} {:>10} {:>8}  PARTITIONS",
        "MEMBER",
        "TOKEN",
        "EXPIRES"
    );
    for (m, shown) in status.members.iter().zip(&names) {
        // A partition handed over to the member, not picked up yet: k*.
        let handed = |k: u32| {
            status
                .owners
                .get(k as usize)
                .and_then(Option::as_ref)
                .is_some_and(|o| o.handed)
        };
        let owns = if m.owns.is_empty() {
            "-".to_owned()
        } else if m.owns.iter().any(|&k| handed(k)) {
            let each: Vec<String> = m
                .owns
                .iter()
                .map(|&k| format!("{k}{}", if handed(k) { "*" } else { "" }))
                .collect();
            each.join(" ")
        } else {
            ranges(&m.owns)
        };
        out!(
            "{shown:<width$} {:>10} {:>8}  {owns}",
            m.token,
            format!("in {}", short(m.remaining)),
        );
    }
    out!(
        "{:<width$} {:>10} {:>8}  {}",
        "(free)",
        "",
        "",
        if free.is_empty() {
            "-".to_owned()
        } else {
            ranges(&free)
        }
    );
    let handed = status.owners.iter().flatten().any(|o| o.handed);
    note!(
        "pglease: group {:?}: {} partitions, {} member{}, {} owned, {} free{}",
        status.name,
        status.partitions,
        status.members.len(),
        plural(status.members.len() as u32),
        status.owners.iter().flatten().count(),
        free.len(),
        if handed {
            "; k*: handed over to the member, not picked up yet"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// `status --group --json`: the group, its members (each with the
/// partitions it owns) and each partition's owner (null: free).
fn group_json(status: &pglease::GroupStatus, free: &[u32]) -> serde_json::Value {
    json!({
        "name": status.name,
        "partitions": status.partitions,
        "members": status.members.iter().map(|m| json!({
            "name": m.name,
            "token": m.token.get(),
            "remaining_ms": m.remaining.as_millis() as u64,
            "owns": m.owns,
        })).collect::<Vec<_>>(),
        "owners": status.owners.iter().enumerate().map(|(k, o)| o.as_ref().map(|o| json!({
            "partition": k,
            "name": pglease::partition_name(&status.name, k as u32),
            "member": o.member,
            "token": o.token.get(),
            "remaining_ms": o.remaining.as_millis() as u64,
            "handed": o.handed,
        }))).collect::<Vec<_>>(),
        "free": free,
    })
}

/// Partition numbers as ranges: `0-3 5 7-8`.
fn ranges(ks: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ks.len() {
        let start = ks[i];
        let mut end = start;
        while i + 1 < ks.len() && ks[i + 1] == end + 1 {
            i += 1;
            end = ks[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(" ")
}

/// The filter the command line asks for (all leases without one).
fn filter(args: &StatusArgs) -> ListFilter {
    let mut filter = ListFilter::default();
    if args.held {
        filter = filter.held();
    }
    if args.expired {
        filter = filter.expired();
    }
    if let Some(prefix) = &args.prefix {
        filter = filter.prefix(prefix.clone());
    }
    if let Some(limit) = args.limit {
        filter = filter.limit(limit);
    }
    filter
}

/// The widest NAME column; a longer name is shortened in the table
/// (`--json` gives it whole).
const NAME_WIDTH: usize = 48;
/// The HOLDER column's width, likewise.
const HOLDER_WIDTH: usize = 28;

/// A table's first column: each text made printable and cut to `limit`
/// characters, and the column's width (at least its `heading`'s).
fn column<'a>(
    texts: impl Iterator<Item = &'a str>,
    limit: usize,
    heading: &str,
) -> (Vec<String>, usize) {
    let cells: Vec<String> = texts.map(|t| fit(&printable(t), limit)).collect();
    let width = cells
        .iter()
        .map(|c| c.chars().count())
        .max()
        .unwrap_or(0)
        .max(heading.chars().count());
    (cells, width)
}

/// Prints `leases` as a table, their expiries as seen at `now` (database
/// clock).
fn table(leases: &[LeaseStatus], now: DateTime<Utc>) {
    let (names, width) = column(leases.iter().map(|s| s.name.as_str()), NAME_WIDTH, "NAME");
    out!(
        "{:<width$} {:<HOLDER_WIDTH$} {:>10}  EXPIRES",
        "NAME",
        "HOLDER",
        "TOKEN"
    );
    for (s, shown) in leases.iter().zip(&names) {
        let (holder, expires) = holder_and_expiry(s, now);
        out!(
            "{shown:<width$} {:<HOLDER_WIDTH$} {:>10}  {expires}",
            fit(&holder, HOLDER_WIDTH),
            s.token
                .filter(|_| s.kind != LeaseKind::Shared)
                .map_or("-".to_owned(), |t| t.to_string()),
        );
    }
}

/// `text`, shortened to `width` characters with a `…` in its middle when
/// it is longer.
fn fit(text: &str, width: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= width {
        return text.to_owned();
    }
    let head = (width - 1) / 2;
    let tail = width - 1 - head;
    let mut fitted: String = chars[..head].iter().collect();
    fitted.push('…');
    fitted.extend(&chars[chars.len() - tail..]);
    fitted
}

/// The HOLDER and EXPIRES columns of a name, as seen at `now`.
fn holder_and_expiry(s: &LeaseStatus, now: DateTime<Utc>) -> (String, String) {
    let until =
        |at: DateTime<Utc>| format!("in {}", short((at - now).to_std().unwrap_or_default()));
    match s.kind {
        LeaseKind::Shared => (
            format!("{} shared holder{}", s.readers, plural(s.readers)),
            s.readers_until.map_or_else(|| "-".to_owned(), until),
        ),
        LeaseKind::Counted => (
            format!(
                "{} of {} slots held",
                s.slots_held,
                s.slots.map_or("?".to_owned(), |n| n.to_string())
            ),
            s.expires_at
                .map_or_else(|| "-".to_owned(), |at| format!("last {}", until(at))),
        ),
        LeaseKind::Free if s.slots.is_some() => (
            format!(
                "0 of {} slots held",
                s.slots.map_or("?".to_owned(), |n| n.to_string())
            ),
            s.expires_at.map_or_else(
                || "never acquired".to_owned(),
                |at| {
                    format!(
                        "ended {} ago",
                        short((now - at).to_std().unwrap_or_default())
                    )
                },
            ),
        ),
        _ => (
            s.holder
                .as_deref()
                .map_or_else(|| "-".to_owned(), printable),
            expiry(s.expires_at, s.held, s.holder.is_none(), now),
        ),
    }
}

/// "s" unless `n` is 1.
fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `status NAME --json`: the name's row, with each shared holder (when
/// the role may read `pglease.shared`) or each slot of a counted name.
async fn one_json(
    manager: &LeaseManager,
    s: &LeaseStatus,
) -> Result<serde_json::Value, (Error, &'static str)> {
    let mut value = status_json(s);
    if s.readers > 0 {
        match manager.admin().shared_holders(&s.name).await {
            Ok(holders) => {
                value["holders"] = holders
                    .iter()
                    .map(|h| {
                        json!({"token": h.token.get(), "holder": h.holder, "role": h.role,
                               "acquired_at": h.acquired_at.to_rfc3339(),
                               "expires_at": h.expires_at.to_rfc3339(), "renewals": h.renewals})
                    })
                    .collect();
            }
            Err(Error::NotPermitted { .. }) => {
                note!("pglease: each shared holder needs SELECT on pglease.shared; left out");
            }
            Err(e) => return Err((e, "status")),
        }
    }
    if let Some(slots) = s.slots {
        let filter = ListFilter::default().prefix(format!("{}#", s.name));
        let rows = manager.list(&filter).await.map_err(|e| (e, "status"))?;
        value["slot_leases"] = rows
            .iter()
            .filter(|row| {
                row.name[s.name.len() + 1..]
                    .parse::<u32>()
                    .is_ok_and(|k| (1..=slots).contains(&k))
            })
            .map(status_json)
            .collect();
    }
    Ok(value)
}

/// The EXPIRES column of a lease that expires (or ended) at `expires_at`,
/// is `held` or not, and was `released` or not, as seen at `now`.
fn expiry(
    expires_at: Option<DateTime<Utc>>,
    held: bool,
    released: bool,
    now: DateTime<Utc>,
) -> String {
    match (expires_at, held) {
        (None, _) => "never acquired".to_owned(),
        (Some(at), true) => format!("in {}", short((at - now).to_std().unwrap_or_default())),
        (Some(at), false) if released => format!(
            "released {} ago",
            short((now - at).to_std().unwrap_or_default())
        ),
        (Some(at), false) => format!(
            "expired {} ago",
            short((now - at).to_std().unwrap_or_default())
        ),
    }
}

/// On stderr: how many of all leases are shown, and how many of them are
/// held, expired and released.
async fn summary(
    manager: &LeaseManager,
    leases: &[LeaseStatus],
) -> Result<(), (Error, &'static str)> {
    let total = manager
        .admin()
        .count_leases()
        .await
        .map_err(|e| (e, "status"))?;
    let held = leases.iter().filter(|s| s.is_held_by_anyone()).count();
    let released = leases
        .iter()
        .filter(|s| !s.is_held_by_anyone() && s.holder.is_none())
        .count();
    let expired = leases.len() - held - released;
    note!(
        "pglease: {} of {total} leases shown: {held} held, {expired} expired, {released} released",
        leases.len()
    );
    Ok(())
}

/// On stderr: the latest change of timeline (a failover or a restore), while
/// a lease acquired before it could still run (the longest TTL). A role
/// that may not read `pglease.timelines` is told nothing.
async fn timeline_note(manager: &LeaseManager, now: DateTime<Utc>) {
    let Ok(mut changes) = manager.admin().timeline_changes().await else {
        return;
    };
    let Some(change) = changes.pop() else {
        return;
    };
    if (now - change.at).to_std().unwrap_or_default() >= pglease::limits::MAX_TTL {
        return;
    }
    let what = match (&change.declared, change.previous) {
        (Some(reason), _) => format!("an administrator declared a rollback ({reason})"),
        (None, Some(previous)) => format!(
            "the database changed from timeline {previous} to {} (a failover or a restore)",
            change.timeline
        ),
        (None, None) => format!("the database changed to timeline {}", change.timeline),
    };
    let delay = match change.grant_after {
        Some(after) if after > now => format!("; no lease granted before {}", after.to_rfc3339()),
        _ => String::new(),
    };
    note!(
        "pglease: {} ago {what}: tokens continue above {}; acquisitions made before it above \
         token {} are unknown here and refused{delay}",
        short((now - change.at).to_std().unwrap_or_default()),
        change.floor,
        change.seen
    );
}
