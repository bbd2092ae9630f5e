//! The scripts told step by step, in plain words: the observer
//! `pglease demo` prints its first part with.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::engine::{Fault, Observer, Row, Step, Who, Written};

/// An [`Observer`] that tells each step as a line ("worker-A acquires
/// "report" for 600ms: token 1", "  worker-A writes under token 1:
/// committed", ...) and hands it to a sink. Lines about a write are
/// indented two spaces; the last line says which writes committed, with
/// the token each writer held.
pub struct Narrator<F> {
    name: String,
    ttl: Option<Duration>,
    story: Mutex<Story>,
    sink: Mutex<F>,
}

/// What the narrator remembers between steps.
#[derive(Default)]
struct Story {
    /// Each worker's latest token, A's then B's.
    tokens: [Option<i64>; 2],
    /// Whether each worker holds the resource now.
    holding: [bool; 2],
    /// The fault, once it hit.
    fault: Option<Fault>,
    /// Whether A's write was staged before the fault.
    staged: bool,
}

fn index(who: Who) -> usize {
    match who {
        Who::A => 0,
        Who::B => 1,
    }
}

fn other(who: Who) -> Who {
    match who {
        Who::A => Who::B,
        Who::B => Who::A,
    }
}

fn worker(who: Who) -> String {
    format!("worker-{}", who.name())
}

impl<F: FnMut(&str) + Send> Narrator<F> {
    /// Tells the steps on the resource `name`, whose holds last `ttl`
    /// (`None`: they do not expire), one line at a time to `sink`.
    pub fn new(name: &str, ttl: Option<Duration>, sink: F) -> Narrator<F> {
        Narrator {
            name: name.to_owned(),
            ttl,
            story: Mutex::new(Story::default()),
            sink: Mutex::new(sink),
        }
    }

    /// The line for `step`, if it is told; the story moves on.
    fn line(&self, step: Step<'_>, story: &mut Story) -> Option<String> {
        match step {
            Step::Acquired { who, token, after } => Some(self.acquired(story, who, token, after)),
            Step::Missed { window } => Some(format!(
                "{} could not take {:?} over within {} ms",
                worker(Who::B),
                self.name,
                window.as_millis()
            )),
            Step::Wrote {
                who,
                token,
                written,
            } => Some(format!("  {}: {}", writes(who, token), outcome(written))),
            Step::Staged { who, token } => {
                story.staged = true;
                Some(format!("  {}: not committed yet", writes(who, token)))
            }
            Step::Fault(fault) => {
                story.fault = Some(fault);
                Some(struck(fault))
            }
            Step::Healed(fault) => healed(fault, story.staged),
            Step::Told { after } => Some(format!(
                "{} is told it lost {:?}, {} ms after the fault",
                worker(Who::A),
                self.name,
                after.as_millis()
            )),
            Step::Released { who, token, ended } => Some(released(story, who, token, ended)),
            Step::Ledger(rows) => Some(committed(story, rows)),
        }
    }

    fn acquired(
        &self,
        story: &mut Story,
        who: Who,
        token: Option<i64>,
        after: Option<Duration>,
    ) -> String {
        let mut line = format!("{} acquires {:?}", worker(who), self.name);
        match (after, story.fault) {
            (Some(after), Some(fault)) => {
                line.push_str(&format!(" {} ms {}", after.as_millis(), since(fault)));
            }
            _ => {
                if let Some(ttl) = self.ttl {
                    line.push_str(&format!(" for {ttl:?}"));
                }
            }
        }
        let before = story.tokens[index(other(who))];
        match (token, before) {
            (Some(t), Some(b)) if t > b => line.push_str(&format!(": token {t} > {b}")),
            (Some(t), Some(b)) => line.push_str(&format!(": token {t}, NOT above {b}")),
            (Some(t), None) => line.push_str(&format!(": token {t}")),
            (None, _) => {}
        }
        story.tokens[index(who)] = token;
        story.holding[index(who)] = true;
        line
    }
}

impl<F: FnMut(&str) + Send> Observer for Narrator<F> {
    fn step(&self, step: Step<'_>) {
        // A sink that panicked leaves nothing half-done here to protect.
        let mut story = self.story.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(line) = self.line(step, &mut story) {
            let mut sink = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
            (*sink)(&line);
        }
    }
}

/// "worker-A writes under token 1", or without the token where there is
/// none.
fn writes(who: Who, token: Option<i64>) -> String {
    match token {
        Some(t) => format!("{} writes under token {t}", worker(who)),
        None => format!("{} writes", worker(who)),
    }
}

/// A write's outcome; a refusal's reason that names who refused (`by
/// PostgreSQL (LE001): ...`) follows "REJECTED" as its complement.
fn outcome(written: &Written) -> String {
    match written {
        Written::Committed => "committed".to_owned(),
        Written::Refused(why) if why.starts_with("by ") => format!("REJECTED {why}"),
        Written::Refused(why) => format!("REJECTED: {why}"),
    }
}

/// The fault, as it hits A.
fn struck(fault: Fault) -> String {
    let a = worker(Who::A);
    match fault {
        Fault::Pause => format!("{a} pauses (a GC pause, a stopped VM...)"),
        Fault::Kill => format!("{a}'s connection is killed"),
        Fault::Die => format!("{a} dies without releasing"),
        Fault::LateRelease => format!(
            "{a} releases, acquires again, and a copy of its first release is held up on the way"
        ),
        Fault::Stall => format!("{a}'s renewals get no answer (a silent network)"),
    }
}

/// When B took over, after `fault`.
fn since(fault: Fault) -> String {
    let a = worker(Who::A);
    match fault {
        Fault::Pause => format!("into {a}'s pause"),
        Fault::Kill => format!("after {a}'s connection was killed"),
        Fault::Die => format!("after {a} died"),
        Fault::LateRelease => "after the late release arrived".to_owned(),
        Fault::Stall => "into the stall".to_owned(),
    }
}

/// The fault's end, where it is a step of the story.
fn healed(fault: Fault, staged: bool) -> Option<String> {
    let a = worker(Who::A);
    match fault {
        Fault::Pause if staged => Some(format!("{a} resumes, and its commit arrives:")),
        Fault::Pause => Some(format!("{a} resumes and sends the write it had prepared:")),
        Fault::LateRelease => Some("the held-up release arrives".to_owned()),
        Fault::Stall => Some(format!("{a}'s network answers again")),
        Fault::Kill | Fault::Die => None,
    }
}

/// `who`'s release, delayed if the other worker holds the resource.
fn released(story: &mut Story, who: Who, token: Option<i64>, ended: Option<bool>) -> String {
    story.holding[index(who)] = false;
    let with = token.map_or_else(String::new, |t| format!(" with token {t}"));
    let holder = other(who);
    if story.holding[index(holder)] {
        let what = match ended {
            Some(false) => format!("ignored, {} still holds it", worker(holder)),
            Some(true) => format!("ENDED {}'s hold (wrong!)", worker(holder)),
            None => format!("sent while {} holds it", worker(holder)),
        };
        return format!("{}'s delayed release{with}: {what}", worker(who));
    }
    match ended {
        Some(false) => format!("{}'s release{with}: nothing left to release", worker(who)),
        _ => format!("{} releases{with}", worker(who)),
    }
}

/// The committed writes, each with the token its writer held last.
fn committed(story: &Story, rows: &[Row]) -> String {
    let writes: Vec<String> = rows
        .iter()
        .map(|row| {
            let who = [Who::A, Who::B]
                .into_iter()
                .find(|w| w.name() == row.writer);
            match who.and_then(|w| story.tokens[index(w)].map(|t| (w, t))) {
                Some((w, t)) => format!("{}@{t}", worker(w)),
                None => who.map_or_else(|| row.writer.clone(), worker),
            }
        })
        .collect();
    if writes.is_empty() {
        "committed writes: none".to_owned()
    } else {
        format!("committed writes: {}", writes.join(", "))
    }
}
