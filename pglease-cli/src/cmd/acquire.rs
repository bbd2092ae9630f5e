//! `pglease acquire NAME --ttl D`: acquire a lease and print its token.

use std::process::ExitCode;
use std::time::Duration;

use pglease::{AcquireOptions, Error, Lease, LeaseManager};

use nix::sys::signal::Signal;

use super::{Asked, announced, not_acquired};
use crate::args::AcquireArgs;
use crate::child::{StopSignals, signalled};
use crate::exit::Outcome;
use crate::output::{lease_json, out};

pub(crate) async fn acquire(manager: &LeaseManager, args: AcquireArgs) -> Outcome {
    let AcquireArgs {
        name,
        ttl,
        holder,
        wait,
        value,
        limit,
        shared,
        json,
    } = args;
    let name = name.as_str();
    let holder = holder.unwrap_or_else(acquire_holder);
    // Without --wait one attempt; the library starts its release listener
    // only once an attempt with time to wait has failed.
    let attempt = |wait: Duration| {
        let mut how = AcquireOptions::ttl(ttl)
            .holder(holder.as_str())
            .wait(wait)
            .shared(shared);
        if let Some(value) = &value {
            how = how.value(value.as_str());
        }
        if let Some(limit) = limit {
            how = how.limit(limit);
        }
        manager.acquire(name, how)
    };
    let asked = Asked {
        manager,
        limit,
        exclusive: !shared,
    };
    // Waiting, a signal ends the wait, said on stderr (without signals
    // to watch, said by StopSignals, the wait goes on).
    let signals = if wait.is_zero() {
        None
    } else {
        StopSignals::watch()
    };
    let outcome = match signals {
        None => announced(asked, wait, attempt).await,
        Some(mut signals) => tokio::select! {
            outcome = announced(asked, wait, attempt) => outcome,
            signal = signals.next() => return Ok(interrupted(manager, name, signal).await),
        },
    };
    match outcome {
        Ok(lease) => {
            print_lease(&lease, json);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            if let (true, Some(found)) = (json, found(&e)) {
                out!("{found}");
            }
            not_acquired(asked, e, "acquire").await
        }
    }
}

/// The lease as found, in JSON, when the refusal `e` says it was held,
/// pinned or its grant delayed. The error names the lease it describes:
/// NAME, or the slot of a counted lease that expires first.
fn found(e: &Error) -> Option<serde_json::Value> {
    match e {
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
        Error::GrantDelayed { name, until, .. } => {
            let mut found = lease_json(name, None, None, None);
            found["delayed_until"] = serde_json::json!(until.to_rfc3339());
            Some(found)
        }
        _ => None,
    }
}

/// A signal while `acquire --wait` waited: the attempt in flight is
/// dropped, and what it may have acquired released (the manager's
/// shutdown waits for that release, bounded); said on stderr, exit 128 +
/// the signal's number.
async fn interrupted(manager: &LeaseManager, name: &str, signal: Signal) -> ExitCode {
    let released = tokio::time::timeout(Duration::from_secs(5), manager.shutdown()).await;
    let left = if matches!(released, Ok(Ok(()))) {
        "an acquisition in flight, if it succeeded, was released (or, if that failed, ends at \
         its expiry)"
    } else {
        "an acquisition in flight, if it succeeded, ends at its expiry"
    };
    eprintln!("pglease: interrupted ({signal}) while waiting for {name:?}; not acquired, {left}");
    ExitCode::from(signalled(signal))
}

fn print_lease(lease: &Lease, json: bool) {
    if json {
        let mut found = lease_json(
            lease.name(),
            Some(lease.holder()),
            Some(lease.token()),
            Some(lease.expires_at()),
        );
        if lease.is_shared() {
            found["shared"] = serde_json::json!(true);
        }
        out!("{found}");
    } else {
        out!(
            "acquired {:?}{} for {:?}: token {}, held {}",
            lease.name(),
            if lease.is_shared() { " shared" } else { "" },
            lease.holder(),
            lease.token(),
            crate::output::from_now(lease.expires_at())
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
