//! A lease's history drawn as a timeline (`pglease history --html/--svg`):
//! pure functions from the rows `history --json` prints (parsed by
//! [`parse`]) to a self-contained SVG image or HTML page, no scripts, no
//! fonts or images fetched. One row per holder; each term a bar from its
//! acquisition to its end, with its token; the time an expired holder
//! stayed unaware (until the lease was taken over, or its fenced sessions
//! were ended) dashed after it; evictions, values, step-down requests and
//! changes of timeline as markers; the exact times in hover titles.
//!
//! Two kinds of row are never in the database's history, only in a saved
//! file whose writer saw them (`pglease demo` adds those it saw): a
//! holder's pause (`paused`, then `resumed`), drawn as a grey band on its
//! row, and a write refused under a stale token (`refused`), drawn as a
//! red stop mark. A refused write's transaction rolls back, and with it
//! anything it could record.

use std::collections::HashMap;
use std::fmt::Write;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

/// One row of `history --json`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) token: i64,
    pub(crate) event: String,
    pub(crate) holder: Option<String>,
    pub(crate) at: DateTime<Utc>,
    pub(crate) renewals: Option<u64>,
    pub(crate) detail: Option<String>,
}

/// The rows of a `history --json` array, in its order; why not, naming
/// the row and field at fault.
pub(crate) fn parse(json: &Value) -> Result<Vec<Row>, String> {
    let rows = json
        .as_array()
        .ok_or("not a JSON array (the output of `pglease history NAME --json`)")?;
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            let n = i + 1;
            let text = |field: &str| -> Result<Option<String>, String> {
                match &row[field] {
                    Value::Null => Ok(None),
                    Value::String(s) => Ok(Some(s.clone())),
                    _ => Err(format!("row {n}: \"{field}\" is not a string")),
                }
            };
            let need = |field: &str| -> Result<String, String> {
                text(field)?.ok_or_else(|| format!("row {n}: no \"{field}\""))
            };
            if !row.is_object() {
                return Err(format!("row {n} is not a JSON object"));
            }
            let at = need("at")?;
            let at = DateTime::parse_from_rfc3339(&at)
                .map_err(|e| format!("row {n}: \"at\" is not an RFC 3339 time ({e}): {at:?}"))?
                .with_timezone(&Utc);
            let token = row["token"]
                .as_i64()
                .ok_or_else(|| format!("row {n}: \"token\" is not an integer"))?;
            let renewals = match &row["renewals"] {
                Value::Null => None,
                v => Some(
                    v.as_u64()
                        .ok_or_else(|| format!("row {n}: \"renewals\" is not a count"))?,
                ),
            };
            Ok(Row {
                name: need("name")?,
                token,
                event: need("event")?,
                holder: text("holder")?,
                at,
                renewals,
                detail: text("detail")?,
            })
        })
        .collect()
}

/// How a term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Still held when the history was read (or its end not recorded).
    Open,
    Released,
    HandedOver,
    Expired,
    /// Expired early: its holder's session ended (a session-bound lease).
    SessionEnded,
    ForceReleased,
}

impl End {
    fn class(self) -> &'static str {
        match self {
            End::Open => "open",
            End::Released => "released",
            End::HandedOver => "handed-over",
            End::Expired => "expired",
            End::SessionEnded => "session-ended",
            End::ForceReleased => "force-released",
        }
    }

    fn words(self) -> &'static str {
        match self {
            End::Open => "held (no end recorded)",
            End::Released => "released",
            End::HandedOver => "handed over",
            End::Expired => "expired",
            End::SessionEnded => "its holder's session ended",
            End::ForceReleased => "force released",
        }
    }
}

/// One holder's term: a token from its acquisition to its end.
#[derive(Debug, Clone, PartialEq)]
struct Term {
    lane: usize,
    token: i64,
    /// None when the acquisition is not in the rows (before `--since`).
    start: Option<DateTime<Utc>>,
    end: Option<DateTime<Utc>>,
    ended: End,
    renewals: Option<u64>,
    /// After an expiry: until when its holder may not have known (the
    /// takeover, or the end of its fenced sessions).
    unaware_until: Option<DateTime<Utc>>,
    /// The holder that took it over after it expired.
    taken_by: Option<String>,
    /// Whom it took the lease over from, having waited for its expiry.
    took_from: Option<String>,
    detail: Option<String>,
}

/// A moment on a holder's row (or on every row: a change of timeline).
#[derive(Debug, Clone, PartialEq)]
struct Mark {
    /// None: every row.
    lane: Option<usize>,
    kind: &'static str,
    token: i64,
    at: DateTime<Utc>,
    detail: Option<String>,
    event: String,
}

/// A holder's pause, as its observer saw it (not in the database's
/// history): from `paused` to `resumed` (or the end of the rows).
#[derive(Debug, Clone, PartialEq)]
struct Pause {
    lane: usize,
    token: i64,
    from: DateTime<Utc>,
    to: Option<DateTime<Utc>>,
}

/// The history as drawn.
#[derive(Debug, Clone, PartialEq)]
struct Chart {
    name: String,
    holders: Vec<String>,
    terms: Vec<Term>,
    marks: Vec<Mark>,
    pauses: Vec<Pause>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
}

/// The name of a row without a holder.
const NOBODY: &str = "(no holder)";

fn chart(name: &str, rows: &[Row]) -> Chart {
    let mut holders: Vec<String> = Vec::new();
    let lane_of =
        |holder: &str, holders: &mut Vec<String>| match holders.iter().position(|h| h == holder) {
            Some(i) => i,
            None => {
                holders.push(holder.to_owned());
                holders.len() - 1
            }
        };
    let mut terms: Vec<Term> = Vec::new();
    let mut marks = Vec::new();
    let mut pauses: Vec<Pause> = Vec::new();
    // The latest term of each token.
    let mut by_token: HashMap<i64, usize> = HashMap::new();
    // Oldest first by time (a history saved by an older version is in
    // the order recorded).
    let mut rows = rows.to_vec();
    rows.sort_by_key(|r| r.at);
    for row in &rows {
        let holder = row
            .holder
            .clone()
            .or_else(|| {
                by_token
                    .get(&row.token)
                    .map(|&t| holders[terms[t].lane].clone())
            })
            .unwrap_or_else(|| NOBODY.to_owned());
        let ended = match row.event.as_str() {
            "released"
                if row
                    .detail
                    .as_deref()
                    .is_some_and(|d| d.starts_with("handed over to")) =>
            {
                Some(End::HandedOver)
            }
            "released" => Some(End::Released),
            "expired" if row.detail.is_some() => Some(End::SessionEnded),
            "expired" => Some(End::Expired),
            "force_released" => Some(End::ForceReleased),
            _ => None,
        };
        if row.event == "acquired" {
            let lane = lane_of(&holder, &mut holders);
            // The term before ended by an expiry, another's, and no term
            // is still held (a shared holder beside others takes nothing
            // over): taken over.
            let mut took_from = None;
            let none_held = terms.iter().all(|t| t.end.is_some());
            if let Some(before) = terms.iter_mut().rev().find(|t| t.end.is_some())
                && none_held
                && before.ended == End::Expired
                && before.lane != lane
                && before.taken_by.is_none()
                && before.end.is_some_and(|e| e <= row.at)
            {
                before.taken_by = Some(holder.clone());
                before.unaware_until = Some(before.unaware_until.map_or(row.at, |u| u.max(row.at)));
                took_from = Some(holders[before.lane].clone());
            }
            by_token.insert(row.token, terms.len());
            terms.push(Term {
                lane,
                token: row.token,
                start: Some(row.at),
                end: None,
                ended: End::Open,
                renewals: None,
                unaware_until: None,
                taken_by: None,
                took_from,
                detail: row.detail.clone(),
            });
        } else if let Some(ended) = ended {
            let lane = lane_of(&holder, &mut holders);
            let index = match by_token.get(&row.token) {
                Some(&t) if terms[t].end.is_none() => t,
                _ => {
                    // Acquired before the rows begin.
                    by_token.insert(row.token, terms.len());
                    terms.push(Term {
                        lane,
                        token: row.token,
                        start: None,
                        end: None,
                        ended: End::Open,
                        renewals: None,
                        unaware_until: None,
                        taken_by: None,
                        took_from: None,
                        detail: None,
                    });
                    terms.len() - 1
                }
            };
            let term = &mut terms[index];
            term.end = Some(row.at);
            term.ended = ended;
            term.renewals = row.renewals;
        } else if row.event == "paused" {
            pauses.push(Pause {
                lane: lane_of(&holder, &mut holders),
                token: row.token,
                from: row.at,
                to: None,
            });
        } else if row.event == "resumed" {
            let lane = lane_of(&holder, &mut holders);
            if let Some(pause) = pauses
                .iter_mut()
                .rev()
                .find(|p| p.lane == lane && p.to.is_none())
            {
                pause.to = Some(row.at);
            }
        } else {
            let (lane, kind) = match row.event.as_str() {
                "refused" => (Some(lane_of(&holder, &mut holders)), "refused"),
                "timeline" => (None, "timeline"),
                "evicted" => (Some(lane_of(&holder, &mut holders)), "evicted"),
                "value" => (Some(lane_of(&holder, &mut holders)), "value"),
                "step_down_requested" => (Some(lane_of(&holder, &mut holders)), "step-down"),
                _ => (Some(lane_of(&holder, &mut holders)), "other"),
            };
            // An eviction after the term expired: its holder's sessions
            // worked on, unaware, until then.
            if kind == "evicted"
                && let Some(&t) = by_token.get(&row.token)
                && terms[t].ended == End::Expired
                && terms[t].end.is_some_and(|e| e <= row.at)
            {
                let term = &mut terms[t];
                term.unaware_until = Some(term.unaware_until.map_or(row.at, |u| u.max(row.at)));
            }
            marks.push(Mark {
                lane,
                kind,
                token: row.token,
                at: row.at,
                detail: row.detail.clone(),
                event: row.event.clone(),
            });
        }
    }
    let from = rows.iter().map(|r| r.at).min().unwrap_or_default();
    let to = rows.iter().map(|r| r.at).max().unwrap_or_default();
    Chart {
        name: name.to_owned(),
        holders,
        terms,
        marks,
        pauses,
        from,
        to,
    }
}

/// Text escaped for XML and HTML (element content and attribute values).
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0.
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// A time as the hover titles give it: RFC 3339, microseconds, UTC.
fn exact(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Tick steps in milliseconds: 1, 2, 5 ms ... 1 day.
const STEPS: &[i64] = &[
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000,
    120_000, 300_000, 600_000, 900_000, 1_800_000, 3_600_000, 7_200_000, 10_800_000, 21_600_000,
    43_200_000, 86_400_000,
];

/// The smallest step giving at most `most` ticks over `span_ms`.
fn tick_step(span_ms: i64, most: i64) -> i64 {
    STEPS
        .iter()
        .copied()
        .find(|s| span_ms / s < most)
        .unwrap_or_else(|| (span_ms / most / 86_400_000 + 1) * 86_400_000)
}

/// A tick's label: the time of day (UTC), to the precision of the step.
fn tick_label(at: DateTime<Utc>, step_ms: i64) -> String {
    if step_ms < 1_000 {
        at.format("%H:%M:%S%.3f").to_string()
    } else if step_ms < 60_000 {
        at.format("%H:%M:%S").to_string()
    } else if step_ms < 86_400_000 {
        at.format("%H:%M").to_string()
    } else {
        at.format("%Y-%m-%d").to_string()
    }
}

const WIDTH: f64 = 960.0;
const LEFT: f64 = 150.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 72.0;
const LANE: f64 = 46.0;
const BAR: f64 = 16.0;

/// The styles of the drawing (inline, in the SVG itself).
const STYLE: &str = "\
text{font-family:sans-serif;font-size:12px;fill:#222}\
.title{font-size:15px;font-weight:bold}\
.axis text{font-size:11px;fill:#555}.axis line{stroke:#ddd}\
.holder{font-size:13px;font-weight:bold}\
.lane{stroke:#eee}\
.term rect{fill:#4a7fb5;stroke:#2d5a87}\
.term.force-released rect{fill:#8a5fb0}\
.term.open rect{fill:#6fa1d6}\
.token{font-size:11px;fill:#1b3d5e}\
.unaware{fill:url(#hatch);stroke:#d9822b;stroke-dasharray:4 2}\
.end-released{stroke:#222;stroke-width:2}\
.end-handed-over{fill:#2f9e6a}\
.end-expired,.end-session-ended{fill:#fff;stroke:#d9822b;stroke-width:2}\
.end-force-released{fill:#8a5fb0}\
.takeover{fill:#d9822b}\
.evicted{stroke:#c62828;stroke-width:3}\
.value{fill:#2f9e6a}\
.step-down{fill:#f2c12e;stroke:#8a6d00}\
.other{fill:#888}\
.paused{fill:#8a8a8a;fill-opacity:.28;stroke:#777;stroke-dasharray:3 3}\
.refused{fill:#fff;stroke:#c62828;stroke-width:2.5}\
.timeline{stroke:#7b1fa2;stroke-width:2;stroke-dasharray:6 3}\
.legend text{font-size:11px}";

/// The exact times and words of a term, for its hover title.
fn term_title(chart: &Chart, t: &Term) -> String {
    let holder = &chart.holders[t.lane];
    let mut title = format!("{holder}: token {}", t.token);
    match t.start {
        Some(s) => write!(title, "\nacquired {}", exact(s)),
        None => write!(title, "\nacquired before the first row shown"),
    }
    .ok();
    if let Some(from) = &t.took_from {
        write!(title, " (took over from {from}, whose term had expired)").ok();
    }
    if let Some(d) = t.detail.as_deref() {
        write!(title, " ({d})").ok();
    }
    match t.end {
        Some(e) => write!(title, "\n{} {}", t.ended.words(), exact(e)),
        None => write!(title, "\n{}", t.ended.words()),
    }
    .ok();
    if let Some(r) = t.renewals {
        write!(title, "\nrenewed {r} time{}", if r == 1 { "" } else { "s" }).ok();
    }
    if let Some(by) = &t.taken_by {
        write!(title, "\ntaken over by {by}").ok();
    }
    title
}

/// `rows` (from `history NAME --json`) of lease `name`, drawn as a
/// standalone SVG image.
pub(crate) fn svg(name: &str, rows: &[Row]) -> String {
    let chart = chart(name, rows);
    let lanes = chart.holders.len().max(1);
    let plot_bottom = TOP + LANE * lanes as f64;
    // The span drawn: the rows' times, padded; an instant widened to 1 s.
    let span = match (chart.to - chart.from).num_milliseconds() {
        0 => 1_000,
        span => span,
    };
    let pad = span / 25 + 1;
    let from = chart.from - chrono::Duration::milliseconds(pad);
    let to = chart.from + chrono::Duration::milliseconds(span + pad);
    let total = (to - from).num_microseconds().unwrap_or(i64::MAX).max(1) as f64;
    let x = |at: DateTime<Utc>| {
        let off = (at - from).num_microseconds().unwrap_or(0) as f64;
        LEFT + (off / total).clamp(0.0, 1.0) * (WIDTH - LEFT - RIGHT)
    };
    let y = |lane: usize| TOP + LANE * lane as f64 + LANE / 2.0;
    let mut s = String::new();
    write!(
        s,
        "<title>pglease history of {n}</title><style>{STYLE}</style>\
         <defs><pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" \
         patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#fbe3c8\"/>\
         <line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#d9822b\" stroke-width=\"2\"/>\
         </pattern></defs>\
         <rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\
         <text class=\"title\" x=\"10\" y=\"20\">Lease {n}: {count} transition{plural}</text>",
        n = escape(&chart.name),
        count = rows.len(),
        plural = if rows.len() == 1 { "" } else { "s" },
    )
    .ok();
    // The time axis: ticks on round times, labelled, over every lane.
    let step = tick_step((to - from).num_milliseconds(), 9);
    let first = from.timestamp_millis().div_euclid(step) * step + step;
    s.push_str("<g class=\"axis\">");
    let mut tick = first;
    while tick <= to.timestamp_millis() {
        if let Some(at) = DateTime::<Utc>::from_timestamp_millis(tick) {
            let tx = x(at);
            write!(
                s,
                "<line x1=\"{tx:.1}\" y1=\"{y0:.1}\" x2=\"{tx:.1}\" y2=\"{plot_bottom:.1}\"/>\
                 <text x=\"{tx:.1}\" y=\"{ty:.1}\" text-anchor=\"middle\">{label}</text>",
                y0 = TOP - 6.0,
                ty = TOP - 10.0,
                label = tick_label(at, step),
            )
            .ok();
        }
        tick += step;
    }
    write!(
        s,
        "<text x=\"{LEFT}\" y=\"{ay:.1}\">time (UTC), {day}</text></g>",
        ay = TOP - 26.0,
        day = chart.from.format("%Y-%m-%d"),
    )
    .ok();
    // One lane per holder.
    for (lane, holder) in chart.holders.iter().enumerate() {
        let shown: String = if holder.chars().count() > 20 {
            holder.chars().take(19).chain(['…']).collect()
        } else {
            holder.clone()
        };
        write!(
            s,
            "<g class=\"row\" data-holder=\"{h}\"><title>{h}</title>\
             <line class=\"lane\" x1=\"{LEFT}\" y1=\"{ly:.1}\" x2=\"{x2:.1}\" y2=\"{ly:.1}\"/>\
             <text class=\"holder\" x=\"10\" y=\"{ty:.1}\">{shown}</text></g>",
            h = escape(holder),
            ly = y(lane),
            x2 = WIDTH - RIGHT,
            ty = y(lane) + 4.0,
            shown = escape(&shown),
        )
        .ok();
    }
    // The pauses, behind the terms.
    for p in &chart.pauses {
        let (p1, p2) = (x(p.from), x(p.to.unwrap_or(to)));
        write!(
            s,
            "<g class=\"pause\" data-holder=\"{h}\" data-token=\"{token}\">\
             <title>{h} paused (token {token}) from {a} {until}: seen by its observer, \
             not recorded by the database</title>\
             <rect class=\"paused\" x=\"{p1:.1}\" y=\"{ry:.1}\" width=\"{w:.1}\" \
             height=\"{hh:.1}\" rx=\"2\"/></g>",
            h = escape(&chart.holders[p.lane]),
            token = p.token,
            a = exact(p.from),
            until =
                p.to.map_or_else(|| "on".to_owned(), |t| format!("to {}", exact(t))),
            ry = y(p.lane) - LANE / 2.0 + 4.0,
            w = (p2 - p1).max(2.0),
            hh = LANE - 8.0,
        )
        .ok();
    }
    // The terms, and after an expiry the time their holder stayed unaware.
    for t in &chart.terms {
        let x1 = x(t.start.unwrap_or(from));
        // An open term runs to the end of the axis.
        let x2 = x(t.end.unwrap_or(to)).max(x1 + 2.0);
        let cy = y(t.lane);
        let title = escape(&term_title(&chart, t));
        write!(
            s,
            "<g class=\"term {end}\" data-holder=\"{h}\" data-token=\"{token}\" \
             data-end=\"{end}\"><title>{title}</title>\
             <rect x=\"{x1:.1}\" y=\"{ry:.1}\" width=\"{w:.1}\" height=\"{BAR}\" rx=\"3\"/>\
             <text class=\"token\" x=\"{x1:.1}\" y=\"{tty:.1}\">#{token}</text>",
            end = t.ended.class(),
            h = escape(&chart.holders[t.lane]),
            token = t.token,
            ry = cy - BAR / 2.0,
            w = x2 - x1,
            tty = cy - BAR / 2.0 - 3.0,
        )
        .ok();
        match (t.ended, t.end) {
            (End::Released, Some(_)) => write!(
                s,
                "<line class=\"end-released\" x1=\"{x2:.1}\" y1=\"{a:.1}\" x2=\"{x2:.1}\" \
                 y2=\"{b:.1}\"/>",
                a = cy - BAR / 2.0 - 3.0,
                b = cy + BAR / 2.0 + 3.0,
            ),
            (End::HandedOver, Some(_)) => write!(
                s,
                "<path class=\"end-handed-over\" d=\"M{x2:.1} {a:.1} L{c:.1} {cy:.1} L{x2:.1} \
                 {b:.1} Z\"/>",
                a = cy - 7.0,
                b = cy + 7.0,
                c = x2 + 9.0,
            ),
            (End::Expired | End::SessionEnded, Some(_)) => write!(
                s,
                "<circle class=\"end-{c}\" cx=\"{x2:.1}\" cy=\"{cy:.1}\" r=\"5\"/>",
                c = t.ended.class(),
            ),
            (End::ForceReleased, Some(_)) => write!(
                s,
                "<rect class=\"end-force-released\" x=\"{a:.1}\" y=\"{b:.1}\" width=\"10\" \
                 height=\"10\"/>",
                a = x2 - 5.0,
                b = cy - 5.0,
            ),
            _ => Ok(()),
        }
        .ok();
        s.push_str("</g>");
        if let (Some(end), Some(until)) = (t.end, t.unaware_until) {
            let (u1, u2) = (x(end), x(until));
            write!(
                s,
                "<g class=\"unaware-term\" data-holder=\"{h}\" data-token=\"{token}\">\
                 <title>{h}: token {token} expired {e}, its holder unaware until {u}{by}</title>\
                 <rect class=\"unaware\" x=\"{u1:.1}\" y=\"{ry:.1}\" width=\"{w:.1}\" \
                 height=\"{BAR}\"/></g>",
                h = escape(&chart.holders[t.lane]),
                token = t.token,
                e = exact(end),
                u = exact(until),
                by = t
                    .taken_by
                    .as_deref()
                    .map(|b| format!(" (taken over by {})", escape(b)))
                    .unwrap_or_default(),
                ry = cy - BAR / 2.0 + 3.0,
                w = (u2 - u1).max(1.0),
            )
            .ok();
        }
        if let (Some(from_holder), Some(start)) = (&t.took_from, t.start) {
            write!(
                s,
                "<g class=\"marker takeover\" data-holder=\"{h}\" data-token=\"{token}\">\
                 <title>{h} took over from {f} at {at} (token {token})</title>\
                 <path class=\"takeover\" d=\"M{a:.1} {b:.1} L{x1:.1} {cy:.1} L{a:.1} {c:.1} Z\"/>\
                 </g>",
                h = escape(&chart.holders[t.lane]),
                f = escape(from_holder),
                token = t.token,
                at = exact(start),
                a = x1 - 10.0,
                b = cy - 8.0,
                c = cy + 8.0,
            )
            .ok();
        }
    }
    // The moments: evictions, values, step-down requests, timelines.
    for m in &chart.marks {
        let mx = x(m.at);
        let detail = m
            .detail
            .as_deref()
            .map(|d| format!(": {}", escape(d)))
            .unwrap_or_default();
        let (holder, lane_y) = match m.lane {
            Some(lane) => (escape(&chart.holders[lane]), Some(y(lane))),
            None => (String::new(), None),
        };
        write!(
            s,
            "<g class=\"marker {k}\" data-holder=\"{holder}\" data-token=\"{token}\">\
             <title>{what}{detail}\n{at} (token {token}{by})</title>",
            k = m.kind,
            token = m.token,
            what = match m.kind {
                "evicted" => "evicted: its fenced sessions ended, their open writes rolled back",
                "refused" => "write refused under a stale token (seen by its writer, not recorded by the database)",
                "value" => "value published",
                "step-down" => "step-down requested",
                "timeline" => "the database changed timeline: every lease's fence moved",
                _ => "",
            }
            .to_owned()
                + if m.kind == "other" { &m.event } else { "" },
            at = exact(m.at),
            by = if holder.is_empty() {
                String::new()
            } else {
                format!(", {holder}")
            },
        )
        .ok();
        match (m.kind, lane_y) {
            ("timeline", _) | (_, None) => write!(
                s,
                "<line class=\"timeline\" x1=\"{mx:.1}\" y1=\"{a:.1}\" x2=\"{mx:.1}\" \
                 y2=\"{plot_bottom:.1}\"/>",
                a = TOP - 4.0,
            ),
            ("evicted", Some(cy)) => write!(
                s,
                "<path class=\"evicted\" d=\"M{a:.1} {b:.1} L{c:.1} {d:.1} M{a:.1} {d:.1} \
                 L{c:.1} {b:.1}\"/>",
                a = mx - 7.0,
                c = mx + 7.0,
                b = cy - 7.0,
                d = cy + 7.0,
            ),
            ("refused", Some(cy)) => write!(
                s,
                "<circle class=\"refused\" cx=\"{mx:.1}\" cy=\"{cy:.1}\" r=\"7\"/>\
                 <line class=\"refused\" x1=\"{a:.1}\" y1=\"{b:.1}\" x2=\"{c:.1}\" y2=\"{d:.1}\"/>",
                a = mx - 5.0,
                b = cy + 5.0,
                c = mx + 5.0,
                d = cy - 5.0,
            ),
            ("value", Some(cy)) => write!(
                s,
                "<circle class=\"value\" cx=\"{mx:.1}\" cy=\"{c:.1}\" r=\"4\"/>",
                c = cy + BAR / 2.0 + 6.0,
            ),
            ("step-down", Some(cy)) => write!(
                s,
                "<path class=\"step-down\" d=\"M{mx:.1} {a:.1} L{r:.1} {cy:.1} L{mx:.1} {b:.1} \
                 L{l:.1} {cy:.1} Z\"/>",
                a = cy - 7.0,
                b = cy + 7.0,
                r = mx + 6.0,
                l = mx - 6.0,
            ),
            (_, Some(cy)) => write!(
                s,
                "<circle class=\"other\" cx=\"{mx:.1}\" cy=\"{cy:.1}\" r=\"4\"/>"
            ),
        }
        .ok();
        s.push_str("</g>");
    }
    if rows.is_empty() {
        write!(
            s,
            "<text x=\"{LEFT}\" y=\"{ty:.1}\">no recorded transitions</text>",
            ty = TOP + LANE / 2.0
        )
        .ok();
    }
    let height = legend(&mut s, &chart, plot_bottom + 24.0) + 14.0;
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"pglease-timeline\" width=\"{WIDTH}\" \
         height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" role=\"img\">{s}</svg>"
    )
}

/// The legend's entries: each kind the chart shows; returns the y of its
/// last line.
fn legend(s: &mut String, chart: &Chart, top: f64) -> f64 {
    let ends = |e: End| chart.terms.iter().any(|t| t.ended == e);
    let marks = |k: &str| chart.marks.iter().any(|m| m.kind == k);
    let mut entries: Vec<(&str, &str)> = vec![(
        "<rect x=\"0\" y=\"-6\" width=\"22\" height=\"12\" rx=\"3\" fill=\"#4a7fb5\"/>",
        "held (token above)",
    )];
    let shapes: [(bool, &str, &str); 12] = [
        (
            !chart.pauses.is_empty(),
            "<rect class=\"paused\" x=\"0\" y=\"-7\" width=\"22\" height=\"14\" rx=\"2\"/>",
            "paused (seen by the client)",
        ),
        (
            marks("refused"),
            "<circle class=\"refused\" cx=\"11\" cy=\"0\" r=\"7\"/>\
             <line class=\"refused\" x1=\"6\" y1=\"5\" x2=\"16\" y2=\"-5\"/>",
            "write refused (seen by the client)",
        ),
        (
            ends(End::Released),
            "<line class=\"end-released\" x1=\"11\" y1=\"-8\" x2=\"11\" y2=\"8\"/>",
            "released",
        ),
        (
            ends(End::Expired) || ends(End::SessionEnded),
            "<circle class=\"end-expired\" cx=\"11\" cy=\"0\" r=\"5\"/>",
            "expired",
        ),
        (
            chart.terms.iter().any(|t| t.unaware_until.is_some()),
            "<rect class=\"unaware\" x=\"0\" y=\"-5\" width=\"22\" height=\"10\"/>",
            "expired, holder unaware",
        ),
        (
            chart.terms.iter().any(|t| t.took_from.is_some()),
            "<path class=\"takeover\" d=\"M4 -8 L14 0 L4 8 Z\"/>",
            "took over",
        ),
        (
            ends(End::HandedOver),
            "<path class=\"end-handed-over\" d=\"M6 -7 L15 0 L6 7 Z\"/>",
            "handed over",
        ),
        (
            ends(End::ForceReleased),
            "<rect class=\"end-force-released\" x=\"6\" y=\"-5\" width=\"10\" height=\"10\"/>",
            "force released",
        ),
        (
            marks("evicted"),
            "<path class=\"evicted\" d=\"M5 -6 L17 6 M5 6 L17 -6\"/>",
            "evicted (fenced writes ended)",
        ),
        (
            marks("value"),
            "<circle class=\"value\" cx=\"11\" cy=\"0\" r=\"4\"/>",
            "value",
        ),
        (
            marks("step-down"),
            "<path class=\"step-down\" d=\"M11 -7 L17 0 L11 7 L5 0 Z\"/>",
            "step-down requested",
        ),
        (
            marks("timeline"),
            "<line class=\"timeline\" x1=\"11\" y1=\"-8\" x2=\"11\" y2=\"8\"/>",
            "timeline changed",
        ),
    ];
    entries.extend(
        shapes
            .iter()
            .filter(|(shown, _, _)| *shown)
            .map(|(_, shape, words)| (*shape, *words)),
    );
    s.push_str("<g class=\"legend\">");
    let (mut lx, mut ly) = (10.0, top);
    for (shape, words) in entries {
        let w = 40.0 + 6.0 * words.chars().count() as f64;
        if lx + w > WIDTH - RIGHT {
            lx = 10.0;
            ly += 24.0;
        }
        write!(
            s,
            "<g class=\"entry\" transform=\"translate({lx:.1} {ly:.1})\">{shape}\
             <text x=\"28\" y=\"4\">{words}</text></g>"
        )
        .ok();
        lx += w;
    }
    s.push_str("</g>");
    ly
}

/// `rows` (from `history NAME --json`) of lease `name` as a standalone
/// HTML page: the timeline, then the rows as a table.
pub(crate) fn html(name: &str, rows: &[Row]) -> String {
    let mut s = String::new();
    write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>pglease history: {n}</title><style>\
         body{{font-family:sans-serif;margin:16px;color:#222}}\
         table{{border-collapse:collapse;font-size:13px}}\
         th,td{{border:1px solid #ccc;padding:2px 8px;text-align:left}}\
         td.at{{font-family:monospace;white-space:nowrap}}</style></head><body>\n",
        n = escape(name),
    )
    .ok();
    s.push_str(&svg(name, rows));
    s.push_str(
        "\n<table class=\"transitions\"><thead><tr><th>at (UTC)</th><th>event</th>\
         <th>token</th><th>holder</th><th>renewals</th><th>detail</th></tr></thead><tbody>\n",
    );
    for r in rows {
        writeln!(
            s,
            "<tr data-event=\"{e}\"><td class=\"at\">{at}</td><td>{e}</td><td>{t}</td>\
             <td>{h}</td><td>{n}</td><td>{d}</td></tr>",
            e = escape(&r.event),
            at = exact(r.at),
            t = r.token,
            h = escape(r.holder.as_deref().unwrap_or("-")),
            n = r.renewals.map(|n| n.to_string()).unwrap_or_default(),
            d = escape(r.detail.as_deref().unwrap_or("")),
        )
        .ok();
    }
    s.push_str("</tbody></table>\n</body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(id: i64, token: i64, event: &str, holder: &str, at: &str) -> Value {
        json!({"id": id, "name": "job", "token": token, "event": event,
               "holder": holder, "at": at, "renewals": null, "detail": null, "role": "app"})
    }

    /// The demo's story: A acquires, expires while its fenced write is
    /// open, that session is ended by B's takeover, B releases.
    fn story() -> Vec<Row> {
        let mut expired = row(3, 1, "expired", "A", "2026-12-06T15:09:41.203+00:00");
        expired["renewals"] = json!(2);
        let mut evicted = row(2, 1, "evicted", "A", "2026-12-06T15:09:41.272+00:00");
        evicted["detail"] = json!("ended sessions 4711");
        parse(&json!([
            row(1, 1, "acquired", "A", "2026-12-06T15:09:39.203+00:00"),
            expired,
            evicted,
            row(4, 2, "acquired", "B", "2026-12-06T15:09:41.280+00:00"),
            row(5, 2, "released", "B", "2026-12-06T15:09:42.100+00:00"),
        ]))
        .expect("parsed")
    }

    #[test]
    fn a_takeover_after_an_expiry_is_drawn_with_the_eviction() {
        let c = chart("job", &story());
        assert_eq!(c.holders, ["A", "B"]);
        assert_eq!(c.terms.len(), 2);
        let a = &c.terms[0];
        assert_eq!((a.lane, a.token, a.ended), (0, 1, End::Expired));
        assert_eq!(a.renewals, Some(2));
        assert_eq!(a.taken_by.as_deref(), Some("B"));
        // Unaware until the takeover, after the eviction.
        assert_eq!(a.unaware_until, Some(story()[3].at));
        let b = &c.terms[1];
        assert_eq!((b.lane, b.ended), (1, End::Released));
        assert_eq!(b.took_from.as_deref(), Some("A"));
        assert_eq!(c.marks.len(), 1);
        assert_eq!((c.marks[0].kind, c.marks[0].lane), ("evicted", Some(0)));
    }

    #[test]
    fn a_pause_and_a_refused_write_seen_by_the_client_are_drawn_on_its_row() {
        let mut refused = row(0, 1, "refused", "A", "2026-12-06T15:09:41.500+00:00");
        refused["detail"] = json!("by PostgreSQL (LE001): stale token");
        let rows = parse(&json!([
            row(1, 1, "acquired", "A", "2026-12-06T15:09:39.203+00:00"),
            row(0, 1, "paused", "A", "2026-12-06T15:09:40.000+00:00"),
            row(3, 1, "expired", "A", "2026-12-06T15:09:41.203+00:00"),
            row(4, 2, "acquired", "B", "2026-12-06T15:09:41.280+00:00"),
            row(0, 1, "resumed", "A", "2026-12-06T15:09:41.450+00:00"),
            refused,
            row(0, 1, "paused", "B", "2026-12-06T15:09:41.900+00:00"),
        ]))
        .expect("parsed");
        let c = chart("job", &rows);
        let at = |i: usize| rows[i].at;
        assert_eq!(
            c.pauses,
            [
                Pause {
                    lane: 0,
                    token: 1,
                    from: at(1),
                    to: Some(at(4))
                },
                // Not resumed within the rows: to the end of the axis.
                Pause {
                    lane: 1,
                    token: 1,
                    from: at(6),
                    to: None
                },
            ]
        );
        assert_eq!(c.marks.len(), 1);
        assert_eq!((c.marks[0].kind, c.marks[0].lane), ("refused", Some(0)));
        let svg = svg("job", &rows);
        assert_eq!(svg.matches("<g class=\"pause\"").count(), 2);
        assert!(svg.contains("<g class=\"marker refused\" data-holder=\"A\" data-token=\"1\">"));
        assert!(svg.contains("not recorded by the database"));
        for words in [
            "paused (seen by the client)",
            "write refused (seen by the client)",
        ] {
            assert!(svg.contains(words), "{words}");
        }
        // A history without them shows neither in its legend.
        assert!(!super::svg("job", &story()).contains("seen by the client"));
    }

    #[test]
    fn the_svg_has_a_row_per_holder_terms_with_tokens_markers_and_exact_times() {
        let svg = svg("job", &story());
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<g class=\"row\"").count(), 2);
        assert_eq!(svg.matches("<g class=\"term ").count(), 2);
        assert!(svg.contains(">#1</text>") && svg.contains(">#2</text>"));
        assert_eq!(svg.matches("<g class=\"marker evicted\"").count(), 1);
        assert_eq!(svg.matches("<g class=\"marker takeover\"").count(), 1);
        assert_eq!(svg.matches("<g class=\"unaware-term\"").count(), 1);
        assert!(svg.contains("expired 2026-12-06T15:09:41.203000Z"), "{svg}");
        assert!(svg.contains("renewed 2 times"));
        assert!(svg.contains("ended sessions 4711"));
        // Axis labels to the millisecond over a span of 3 s.
        assert!(svg.contains(">15:09:40.000</text>"), "{svg}");
        assert!(svg.contains("time (UTC), 2026-12-06"));
        // The legend names what is drawn, and only that.
        for words in ["held", "released", "expired", "took over", "evicted"] {
            assert!(svg.contains(&format!(">{words}")), "{words}");
        }
        assert!(!svg.contains(">handed over<") && !svg.contains(">timeline changed<"));
        // Self-contained: nothing fetched.
        for fetch in [
            "<script",
            "href=",
            "url(http",
            "@import",
            "<image",
            "@font-face",
        ] {
            assert!(!svg.contains(fetch), "{fetch}");
        }
    }

    #[test]
    fn names_and_details_are_escaped() {
        let mut r = row(1, 7, "acquired", "<b>&\"'", "2026-12-06T15:00:00+00:00");
        r["name"] = json!("x<y");
        let mut v = row(2, 7, "value", "<b>&\"'", "2026-12-06T15:00:01+00:00");
        v["detail"] = json!("</title><script>alert(1)</script>\u{7}");
        let rows = parse(&json!([r, v])).expect("parsed");
        let page = html("x<y", &rows);
        assert!(!page.contains("<script"), "{page}");
        assert!(!page.contains("<b>"));
        assert!(page.contains("&lt;b&gt;&amp;&quot;&#39;"));
        assert!(page.contains("pglease history: x&lt;y"));
        assert!(!page.contains('\u{7}'));
    }

    #[test]
    fn handovers_forced_releases_timelines_and_open_terms() {
        let mut handed = row(2, 1, "released", "A", "2026-12-06T15:00:02+00:00");
        handed["detail"] = json!("handed over to B");
        let mut forced = row(4, 2, "force_released", "B", "2026-12-06T15:00:05+00:00");
        forced["detail"] = json!("INC-7");
        let mut timeline = row(5, 100, "timeline", "", "2026-12-06T15:00:06+00:00");
        timeline["holder"] = Value::Null;
        let rows = parse(&json!([
            row(1, 1, "acquired", "A", "2026-12-06T15:00:00+00:00"),
            handed,
            row(3, 2, "acquired", "B", "2026-12-06T15:00:02+00:00"),
            forced,
            timeline,
            row(6, 101, "acquired", "C", "2026-12-06T15:00:07+00:00"),
            row(
                7,
                101,
                "step_down_requested",
                "C",
                "2026-12-06T15:00:08+00:00"
            ),
        ]))
        .expect("parsed");
        let c = chart("job", &rows);
        let ends: Vec<End> = c.terms.iter().map(|t| t.ended).collect();
        assert_eq!(ends, [End::HandedOver, End::ForceReleased, End::Open]);
        assert!(c.terms.iter().all(|t| t.took_from.is_none()));
        let kinds: Vec<(&str, Option<usize>)> = c.marks.iter().map(|m| (m.kind, m.lane)).collect();
        assert_eq!(kinds, [("timeline", None), ("step-down", Some(2))]);
        let svg = svg("job", &rows);
        for words in ["handed over", "force released", "timeline changed"] {
            assert!(svg.contains(&format!(">{words}</text>")), "{words}");
        }
        assert!(svg.contains("data-end=\"open\""));
    }

    #[test]
    fn shared_holders_beside_each_other_take_nothing_over() {
        let rows = parse(&json!([
            row(1, 1, "acquired", "A", "2026-12-06T15:00:00+00:00"),
            row(2, 2, "acquired", "B", "2026-12-06T15:00:01+00:00"),
            row(3, 1, "expired", "A", "2026-12-06T15:00:02+00:00"),
            row(4, 3, "acquired", "C", "2026-12-06T15:00:03+00:00"),
            row(5, 2, "released", "B", "2026-12-06T15:00:04+00:00"),
        ]))
        .expect("parsed");
        let c = chart("job", &rows);
        assert_eq!(c.holders, ["A", "B", "C"]);
        assert!(c.terms.iter().all(|t| t.took_from.is_none()), "{c:?}");
        assert_eq!(c.terms[0].unaware_until, None);
        assert_eq!(c.terms[2].ended, End::Open);
    }

    #[test]
    fn a_history_cut_by_since_starts_its_first_term_at_the_axis() {
        let rows = parse(&json!([row(
            9,
            3,
            "released",
            "A",
            "2026-12-06T15:00:00+00:00"
        )]))
        .expect("parsed");
        let c = chart("job", &rows);
        assert_eq!(c.terms.len(), 1);
        assert_eq!((c.terms[0].start, c.terms[0].ended), (None, End::Released));
        assert!(svg("job", &rows).contains("acquired before the first row shown"));
    }

    #[test]
    fn an_empty_history_draws_an_empty_chart() {
        let page = html("job", &[]);
        assert!(page.contains("no recorded transitions"));
        assert!(page.contains("Lease job: 0 transitions"));
    }

    #[test]
    fn malformed_rows_are_refused_with_the_row_and_field() {
        let bad = |v: Value| parse(&v).expect_err("refused");
        assert!(bad(json!({"a": 1})).contains("not a JSON array"));
        assert_eq!(bad(json!([1])), "row 1 is not a JSON object");
        let mut r = row(1, 1, "acquired", "A", "yesterday");
        assert!(bad(json!([r.clone()])).contains("row 1: \"at\" is not an RFC 3339 time"));
        r["at"] = json!("2026-12-06T15:00:00Z");
        r["token"] = json!("one");
        assert_eq!(
            bad(json!([r.clone()])),
            "row 1: \"token\" is not an integer"
        );
        r["token"] = json!(1);
        r["event"] = Value::Null;
        assert_eq!(bad(json!([r])), "row 1: no \"event\"");
    }

    #[test]
    fn ticks_are_round_and_at_most_nine() {
        assert_eq!(tick_step(3_000, 9), 500);
        assert_eq!(tick_step(60_000, 9), 10_000);
        assert_eq!(tick_step(86_400_000, 9), 10_800_000);
        assert_eq!(tick_step(100 * 86_400_000, 9), 12 * 86_400_000);
        let at = DateTime::parse_from_rfc3339("2026-12-06T15:09:41.2Z")
            .expect("a time")
            .with_timezone(&Utc);
        assert_eq!(tick_label(at, 200), "15:09:41.200");
        assert_eq!(tick_label(at, 5_000), "15:09:41");
        assert_eq!(tick_label(at, 600_000), "15:09");
    }
}
