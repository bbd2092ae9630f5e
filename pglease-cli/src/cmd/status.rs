//! `pglease status [NAME]`: one lease, or the leases the filters keep.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use pglease::{Error, LeaseManager, LeaseStatus, ListFilter};

use crate::args::StatusArgs;
use crate::exit::{self, Outcome};
use crate::output::{note, out, printable, short, status_json};

/// `pglease status [NAME]`: one lease (exit 3 if it is not held), or the
/// leases the filters keep, with a summary line on stderr.
pub(crate) async fn status(manager: &LeaseManager, args: StatusArgs) -> Outcome {
    let filter = filter(&args);
    let name = args.name.as_deref();
    let leases = match name {
        Some(name) => vec![manager.inspect(name).await.map_err(|e| (e, "status"))?],
        // Filtered and limited in the database.
        None => manager
            .list_matching(&filter)
            .await
            .map_err(|e| (e, "status"))?,
    };
    let code = match name {
        Some(_) if !leases[0].held => ExitCode::from(exit::NOT_ACQUIRED),
        _ => ExitCode::SUCCESS,
    };
    if args.json {
        let value = match name {
            Some(_) => status_json(&leases[0]),
            None => serde_json::Value::Array(leases.iter().map(status_json).collect()),
        };
        out!("{value}");
        return Ok(code);
    }
    let now: DateTime<Utc> = manager.database_time().await.map_err(|e| (e, "status"))?;
    table(&leases, now);
    if name.is_none() && !crate::output::quiet() {
        summary(manager, &leases).await?;
    }
    timeline_note(manager, now).await;
    Ok(code)
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

/// Prints `leases` as a table, their expiries as seen at `now` (database
/// clock).
fn table(leases: &[LeaseStatus], now: DateTime<Utc>) {
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
        let expires = expiry(s.expires_at, s.held, s.holder.is_none(), now);
        out!(
            "{shown:<width$} {:<28} {:>10}  {expires}",
            s.holder
                .as_deref()
                .map_or_else(|| "-".to_owned(), printable),
            s.token.map_or("-".to_owned(), |t| t.to_string()),
        );
    }
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
    let total = manager.count_leases().await.map_err(|e| (e, "status"))?;
    let held = leases.iter().filter(|s| s.held).count();
    let released = leases.iter().filter(|s| s.holder.is_none()).count();
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
    let Ok(mut changes) = manager.timeline_changes().await else {
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
