//! `pglease demo`: the failures a lease must survive, played live against
//! a lease and the advisory-lock variants, in a scratch database created
//! for it and dropped after.

use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use pglease::LeaseManager;
use pglease::connect::Target;
use pglease_scenarios::engine::{Fault, Who};
use pglease_scenarios::{BoxError, Narrator, Observer, Scenario, Step, Variant, Written};
use serde_json::json;
use sqlx::{AssertSqlSafe, Connection};

use crate::connect::connect;
use crate::exit;
use crate::output::{note, out};
use crate::sync::lock;

/// Runs the demo in a scratch database created for it and dropped after.
pub(crate) async fn demo(target: &Target, explicit: bool, timeout: Duration) -> ExitCode {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let scratch = format!("pglease_demo_{}_{nanos}", std::process::id());
    // The URL given, else the first of: the libpq defaults if a server
    // answers, a throwaway cluster, a container if built with the feature
    // `containers` (pglease::provision).
    let found;
    let target = if explicit {
        target
    } else {
        let container = if cfg!(feature = "containers") {
            ", else a container"
        } else {
            ""
        };
        note!(
            "pglease: looking for PostgreSQL (libpq defaults, else a throwaway cluster{container})"
        );
        match pglease::provision::find(None).await {
            Ok(server) => {
                say(&format!("pglease demo on {server}"));
                found = Target::from(server.options.clone());
                &found
            }
            Err(e) => {
                eprintln!("pglease: {e}");
                return ExitCode::from(exit::DATABASE);
            }
        }
    };
    let mut admin = match target.connect(timeout).await {
        Ok((conn, _)) => conn,
        Err(e) => {
            eprintln!(
                "pglease: cannot connect to PostgreSQL at {}: {e}\n\
                 Set --database-url or DATABASE_URL (or PGHOST, PGPORT, PGUSER, PGDATABASE) \
                 to a reachable server.",
                target.describe()
            );
            return ExitCode::from(exit::DATABASE);
        }
    };
    if let Err(e) = sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {scratch}")))
        .execute(&mut admin)
        .await
    {
        eprintln!(
            "pglease: the demo needs a scratch database and could not create one: {e}\n\
             Connect as a role with CREATEDB."
        );
        return ExitCode::from(exit::DATABASE);
    }
    out!("pglease demo in scratch database {scratch} (dropped at the end)\n");
    let code = demo_in(
        &target.clone().map_options(|o| o.database(&scratch)),
        timeout,
    )
    .await;
    let dropped = sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {scratch} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await;
    let _ = admin.close().await;
    if let Err(e) = dropped {
        eprintln!("pglease: could not drop the scratch database {scratch}: {e}");
    }
    code
}

async fn demo_in(target: &Target, timeout: Duration) -> ExitCode {
    let manager = match connect(target, timeout).await {
        Ok(manager) => manager,
        Err(_) => return ExitCode::from(exit::DATABASE),
    };
    let outcome = async {
        manager.migrate().await?;
        out!(
            "1. Scenario (a) step by step: a holder pauses past its TTL, another takes over, its \
             late write:\n"
        );
        let seen = paused_holder(&manager).await?;
        save_history(&manager, seen).await?;
        out!(
            "\n2. Five failures against a lease, a session advisory lock and a transaction \
             advisory lock:\n"
        );
        let outcomes = pglease_scenarios::run(&manager, Duration::from_millis(200), |o| {
            say(&format!(
                "  {} / {}: {} - {}",
                o.scenario.label(),
                o.contender.label(),
                if o.safe() { "safe" } else { "UNSAFE" },
                o.detail
            ));
        })
        .await?;
        out!("\n{}", pglease_scenarios::table(&outcomes));
        Ok::<_, BoxError>(())
    }
    .await;
    manager.pool().close().await;
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pglease: demo failed: {e}");
            ExitCode::from(exit::DATABASE)
        }
    }
}

/// Scenario (a) for the lease, played by the scenario engine and told
/// step by step as it happens: the paused holder's late write is rejected
/// by PostgreSQL, its delayed release ignored. What the demo saw of A
/// that the database's history cannot know (its pause, its refused
/// write), as rows of `history --json`.
async fn paused_holder(manager: &LeaseManager) -> Result<Vec<serde_json::Value>, BoxError> {
    let (scenario, variant) = (Scenario::PausedHolder, Variant::Lease);
    let unit = Duration::from_millis(300);
    let narrator = Narrator::new("report", variant.ttl(scenario, unit), |line: &str| {
        say(&format!("  {line}"))
    });
    // The database's clock against this host's, to place what the demo
    // saw beside the history's times.
    let sent = Utc::now();
    let database = manager.admin().database_time().await?;
    let offset = database - (sent + (Utc::now() - sent) / 2);
    let witness = Witness {
        narrator: &narrator,
        token: Mutex::new(None),
        seen: Mutex::new(Vec::new()),
    };
    pglease_scenarios::play(manager, scenario, variant, "report", unit, &witness).await?;
    let seen = lock(&witness.seen)
        .iter()
        .map(|(event, token, at, detail)| {
            json!({
                "id": null, "name": "report", "token": token, "event": event, "holder": "A",
                "at": (*at + offset).to_rfc3339_opts(SecondsFormat::Micros, false),
                "renewals": null, "detail": detail,
                "role": null,
            })
        })
        .collect();
    Ok(seen)
}

/// Tells the narrator every step, and keeps what the history cannot
/// know: A's pause and its refused write (event, token, when, detail).
struct Witness<'a, O> {
    narrator: &'a O,
    /// A's token.
    token: Mutex<Option<i64>>,
    seen: Mutex<Vec<Saw>>,
}

/// One thing the demo saw: (event, token, when on this host's clock,
/// detail).
type Saw = (&'static str, Option<i64>, DateTime<Utc>, String);

impl<O: Observer> Observer for Witness<'_, O> {
    fn step(&self, step: Step<'_>) {
        self.narrator.step(step);
        let token = *lock(&self.token);
        let seen = match step {
            Step::Acquired {
                who: Who::A, token, ..
            } => {
                *lock(&self.token) = token;
                None
            }
            Step::Fault(Fault::Pause) => Some(("paused", token, "seen by pglease demo".to_owned())),
            Step::Healed(Fault::Pause) => {
                Some(("resumed", token, "seen by pglease demo".to_owned()))
            }
            Step::Wrote {
                who: Who::A,
                token,
                written: Written::Refused(why),
            } => Some((
                "refused",
                token,
                format!("seen by pglease demo: refused {why}"),
            )),
            _ => None,
        };
        if let Some((event, token, detail)) = seen {
            lock(&self.seen).push((event, token, Utc::now(), detail));
        }
    }
}

/// Saves the history of scenario (a)'s lease (the scratch database goes
/// at the end) as `history --json` prints it, with what the demo `saw`,
/// and says how to draw it.
async fn save_history(manager: &LeaseManager, saw: Vec<serde_json::Value>) -> Result<(), BoxError> {
    let rows = manager.history("report", None).await?;
    let mut rows: Vec<_> = rows
        .iter()
        .map(crate::cmd::history::transition_json)
        .chain(saw)
        .collect();
    // Oldest first.
    let at = |row: &serde_json::Value| {
        row["at"]
            .as_str()
            .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
    };
    rows.sort_by_key(|row| at(row));
    let path = std::env::temp_dir().join(format!("pglease-demo-{}.json", std::process::id()));
    match std::fs::write(&path, serde_json::Value::Array(rows).to_string()) {
        Ok(()) => say(&format!(
            "  Its history (with A's pause and refused write, which only the demo saw) is saved \
             in {path}; its timeline: pglease history --from {path} --html demo.html",
            path = path.display()
        )),
        Err(e) => note!(
            "pglease: could not save the history of \"report\" in {}: {e}",
            path.display()
        ),
    }
    Ok(())
}

/// The demo's lines are at most this wide.
const WIDTH: usize = 100;

/// Prints `text` wrapped at [`WIDTH`] columns, continuation lines indented
/// four spaces past the first line's indentation.
fn say(text: &str) {
    for line in wrap(text, WIDTH) {
        out!("{line}");
    }
}

/// `text` broken at spaces into lines of at most `width` characters (a
/// word longer than that stays whole on a line of its own).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let indent = text.chars().take_while(|c| *c == ' ').count();
    let follow = " ".repeat(indent + 4);
    let mut lines = Vec::new();
    let mut line = " ".repeat(indent);
    for word in text.split_whitespace() {
        let blank = line.trim().is_empty();
        if !blank && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::replace(&mut line, follow.clone()));
        } else if !blank {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines
}
