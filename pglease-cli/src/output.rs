//! What the command line prints: requested output on stdout (`out!`),
//! progress and confirmations on stderr unless `--quiet` (`note!`), leases
//! as JSON objects with the field names every command shares, and text
//! made safe for a terminal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use pglease::{LeaseStatus, Token};
use serde_json::json;

/// Prints an informational line on stderr unless `--quiet` was given.
macro_rules! note {
    ($($arg:tt)*) => {
        if !$crate::output::quiet() {
            eprintln!($($arg)*);
        }
    };
}
pub(crate) use note;

/// Prints a line of the requested output on stdout. A reader that went
/// away (`| head`, a closed pipe) is not the command's failure: the line
/// is dropped and the command's own exit status stands.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}
pub(crate) use out;

static QUIET: AtomicBool = AtomicBool::new(false);

/// Whether `--quiet` was given.
pub(crate) fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Records `--quiet`.
pub(crate) fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// A failure as one JSON object on stdout: `{"error": ..., "status": N}`.
pub(crate) fn json_failure(error: &str, status: u8) {
    out!("{}", json!({"error": error, "status": status}));
}

/// A lease as the JSON objects of every command describe it.
pub(crate) fn lease_json(
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

/// A row of the status view as JSON (`status`, `leader`, `observe`).
pub(crate) fn status_json(s: &LeaseStatus) -> serde_json::Value {
    let mut value = lease_json(&s.name, s.holder.as_deref(), s.token, s.expires_at);
    value["held"] = json!(s.held);
    value["remaining_ms"] = json!(s.remaining.map(|r| r.as_millis() as u64));
    value["value"] = json!(s.value);
    value["step_down_requested_by"] = json!(s.step_down_requested_by);
    value["step_down_requested_at"] = json!(s.step_down_requested_at.map(|t| t.to_rfc3339()));
    value["kind"] = json!(s.kind.as_str());
    value["readers"] = json!(s.readers);
    value["readers_until"] = json!(s.readers_until.map(|t| t.to_rfc3339()));
    value["slots"] = json!(s.slots);
    value["slots_held"] = json!(s.slots_held);
    value["fair"] = json!(s.fair);
    value["waiting"] = json!(s.waiting);
    value
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

/// A duration rounded to what a person reads: 1h 2m, 3m 4s, 5.6s.
pub(crate) fn short(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 3600 {
        format!("{}h {}m", secs / 3600, secs % 3600 / 60)
    } else if secs >= 60 {
        format!("{}m {}s", secs / 60, secs % 60)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// How far `at` (a database time) is from now, as `status` says it:
/// `for another 9.9s`, or `until a moment ago`. Read on this machine's
/// clock, for people; `--json` gives the time itself.
pub(crate) fn from_now(at: chrono::DateTime<chrono::Utc>) -> String {
    match (at - chrono::Utc::now()).to_std() {
        Ok(left) => format!("for another {}", short(left)),
        Err(_) => "until a moment ago".to_owned(),
    }
}

/// How long ago `at` (a database time) was, as `from_now` says the
/// future: `4.2s ago`, or `just now`.
pub(crate) fn ago(at: chrono::DateTime<chrono::Utc>) -> String {
    match (chrono::Utc::now() - at).to_std() {
        Ok(past) => format!("{} ago", short(past)),
        Err(_) => "just now".to_owned(),
    }
}

/// A duration as the command line takes it (`humantime`: `7days`,
/// `1m 30s`, `500ms`).
pub(crate) fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}
