//! `pglease history NAME`: a lease's recorded transitions, oldest first;
//! or drawn as a timeline (`--html`, `--svg`, see `timeline.rs`), from the
//! database or from a saved `--json` (`--from`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use pglease::LeaseManager;
use pglease::history::Transition;
use serde_json::json;

use crate::exit::{self, Outcome};
use crate::output::{note, out, printable};
use crate::timeline;

/// Where `--html` and `--svg` draw the timeline.
#[derive(Debug, Default)]
pub(crate) struct Draw {
    pub(crate) html: Option<PathBuf>,
    pub(crate) svg: Option<PathBuf>,
}

impl Draw {
    fn any(&self) -> bool {
        self.html.is_some() || self.svg.is_some()
    }
}

/// What clap does not check (before anything connects): `--from` draws,
/// and stdout takes one drawing.
pub(crate) fn check(draw: &Draw, from: Option<&Path>) -> Result<(), String> {
    if from.is_some() && !draw.any() {
        return Err("--from draws a saved history: give --html FILE or --svg FILE".to_owned());
    }
    let stdout = |p: &Option<PathBuf>| p.as_deref() == Some(Path::new("-"));
    if stdout(&draw.html) && stdout(&draw.svg) {
        return Err("--html - and --svg - would both write to stdout: give one a file".to_owned());
    }
    if from == Some(Path::new("-")) && (stdout(&draw.html) || stdout(&draw.svg)) {
        return Err("--from - reads stdin; give the drawing a file".to_owned());
    }
    Ok(())
}

/// `pglease history [NAME] --from FILE --html/--svg FILE`: draws a history
/// saved with `history NAME --json`, without a database. Exit 2 when FILE
/// cannot be read or is not such a history.
pub(crate) fn draw_saved(name: Option<&str>, from: &Path, draw: &Draw) -> ExitCode {
    let mut text = String::new();
    let read = if from == Path::new("-") {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(from).map(|t| text = t)
    };
    if let Err(e) = read {
        eprintln!("pglease: cannot read --from {}: {e}", from.display());
        return ExitCode::from(exit::USAGE);
    }
    let rows = serde_json::from_str(&text)
        .map_err(|e| format!("not JSON ({e})"))
        .and_then(|json| timeline::parse(&json));
    let mut rows = match rows {
        Ok(rows) => rows,
        Err(why) => {
            eprintln!(
                "pglease: --from {} is not a history saved with `pglease history NAME --json`: \
                 {why}",
                from.display()
            );
            return ExitCode::from(exit::USAGE);
        }
    };
    if let Some(name) = name {
        rows.retain(|r| r.name == name);
    }
    let name = name
        .map(str::to_owned)
        .or_else(|| rows.first().map(|r| r.name.clone()))
        .unwrap_or_default();
    write_drawings(&name, &rows, draw)
}

/// Writes the drawings asked for; exit 2 when a file cannot be written.
fn write_drawings(name: &str, rows: &[timeline::Row], draw: &Draw) -> ExitCode {
    let drawings = [
        (
            draw.html.as_deref(),
            timeline::html as fn(&str, &[timeline::Row]) -> String,
        ),
        (draw.svg.as_deref(), timeline::svg),
    ];
    for (path, render) in drawings {
        let Some(path) = path else { continue };
        let text = render(name, rows);
        let written = if path == Path::new("-") {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
        } else {
            std::fs::write(path, &text)
        };
        match written {
            Ok(()) if path != Path::new("-") => note!(
                "pglease: drew {} transitions of {name:?} into {}",
                rows.len(),
                path.display()
            ),
            Ok(()) => {}
            // A reader that went away is not the command's failure.
            Err(e) if path == Path::new("-") && e.kind() == std::io::ErrorKind::BrokenPipe => {}
            Err(e) => {
                eprintln!("pglease: cannot write {}: {e}", path.display());
                return ExitCode::from(exit::USAGE);
            }
        }
    }
    ExitCode::SUCCESS
}

/// `pglease history NAME [--since D] [--json | --html FILE | --svg FILE]`:
/// oldest first.
pub(crate) async fn history(
    manager: &LeaseManager,
    name: &str,
    since: Option<Duration>,
    json: bool,
    draw: &Draw,
) -> Outcome {
    // "The last D" on the database clock, which recorded the times: never
    // this machine's clock against a database timestamp.
    let since = match since {
        Some(ago) => {
            let now = manager
                .admin()
                .database_time()
                .await
                .map_err(|e| (e, "history"))?;
            let ago = chrono::Duration::from_std(ago).unwrap_or(chrono::Duration::MAX);
            Some(now.checked_sub_signed(ago).unwrap_or_default())
        }
        None => None,
    };
    let rows = manager
        .history(name, since)
        .await
        .map_err(|e| (e, "history"))?;
    if json || draw.any() {
        let rows = serde_json::Value::Array(rows.iter().map(transition_json).collect());
        if json {
            out!("{rows}");
            return Ok(ExitCode::SUCCESS);
        }
        // Drawn from exactly what --json prints.
        return Ok(match timeline::parse(&rows) {
            Ok(rows) => write_drawings(name, &rows, draw),
            Err(why) => {
                eprintln!("pglease: cannot draw the history of {name:?}: {why}");
                ExitCode::from(exit::PROBLEMS)
            }
        });
    }
    out!(
        "{:<32} {:<20} {:>10}  {:<24} {:<16} DETAIL",
        "AT",
        "EVENT",
        "TOKEN",
        "HOLDER",
        "ROLE"
    );
    for t in &rows {
        let mut detail = t.detail.as_deref().map(printable).unwrap_or_default();
        if let Some(renewals) = t.renewals {
            let times = if renewals == 1 { "time" } else { "times" };
            let rest = if detail.is_empty() { "" } else { "; " };
            detail = format!("renewed {renewals} {times}{rest}{detail}");
        }
        out!(
            "{:<32} {:<20} {:>10}  {:<24} {:<16} {detail}",
            t.at.to_rfc3339(),
            t.event.as_str(),
            t.token,
            t.holder
                .as_deref()
                .map(printable)
                .unwrap_or_else(|| "-".to_owned()),
            t.role
                .as_deref()
                .map(printable)
                .unwrap_or_else(|| "-".to_owned()),
        );
    }
    if rows.is_empty() {
        note!("pglease: no recorded transitions of {name:?}");
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn transition_json(t: &Transition) -> serde_json::Value {
    json!({
        "id": t.id,
        "name": t.name,
        "token": t.token.get(),
        "event": t.event.as_str(),
        "holder": t.holder,
        "at": t.at.to_rfc3339(),
        "renewals": t.renewals,
        "detail": t.detail,
        "role": t.role,
    })
}
