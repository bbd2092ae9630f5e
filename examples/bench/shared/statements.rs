//! Statements counted on the client, by pool: each pool of a measure logs
//! its statements (sqlx's statement log, `log_statements`) at a level of
//! its own, its [`Class`], and the subscriber [`install`] puts in place
//! counts them and adds up their time (from the send to the last row, as
//! sqlx times them), by level. Pools of other measures log at sqlx's
//! default level (debug), which no class uses.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber, span};

/// Whose statements: one level of sqlx's statement log each.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Class {
    /// The measure's baseline (error).
    Baseline,
    /// One member watched on its own (warn).
    Watched,
    /// The other members (info).
    Members,
}

impl Class {
    /// The level its pools log at, as sqlx's log level names it.
    fn level(self) -> &'static str {
        match self {
            Class::Baseline => "error",
            Class::Watched => "warn",
            Class::Members => "info",
        }
    }

    fn index(self) -> usize {
        match self {
            Class::Baseline => 0,
            Class::Watched => 1,
            Class::Members => 2,
        }
    }

    /// `options` logging every statement, slow or not, at this class's
    /// level.
    pub(crate) fn options(self, options: PgConnectOptions) -> PgConnectOptions {
        options
            .log_statements(self.level().parse().expect("a log level"))
            .log_slow_statements(
                self.level().parse().expect("a log level"),
                Duration::from_secs(1),
            )
    }

    /// This class's statements so far.
    pub(crate) fn count(self) -> Count {
        let (statements, nanos) = &COUNTS[self.index()];
        Count {
            statements: statements.load(Ordering::Relaxed),
            time: Duration::from_nanos(nanos.load(Ordering::Relaxed)),
        }
    }
}

/// Statements, and their time added up.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Count {
    pub(crate) statements: u64,
    pub(crate) time: Duration,
}

impl std::ops::Sub for Count {
    type Output = Count;

    fn sub(self, earlier: Count) -> Count {
        Count {
            statements: self.statements - earlier.statements,
            time: self.time.saturating_sub(earlier.time),
        }
    }
}

impl std::ops::Add for Count {
    type Output = Count;

    fn add(self, other: Count) -> Count {
        Count {
            statements: self.statements + other.statements,
            time: self.time + other.time,
        }
    }
}

/// By level (error, warn, info): statements, nanoseconds.
static COUNTS: [(AtomicU64, AtomicU64); 3] = [
    (AtomicU64::new(0), AtomicU64::new(0)),
    (AtomicU64::new(0), AtomicU64::new(0)),
    (AtomicU64::new(0), AtomicU64::new(0)),
];

const TARGET: &str = "sqlx::query";

/// Puts the counting subscriber in place, once (the process's global
/// one; nothing else in the benchmark sets one).
pub(crate) fn install() {
    // A second call finds it in place.
    let _ = tracing::subscriber::set_global_default(Counter);
}

struct Counter;

/// `BENCH_TRACE_PGLEASE` set: the library's own events go to stderr too.
static TRACE_PGLEASE: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var_os("BENCH_TRACE_PGLEASE").is_some());

/// An event's fields, as `name=value` pairs.
struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

/// The `elapsed_secs` field of sqlx's statement event.
struct Elapsed(f64);

impl Visit for Elapsed {
    fn record_f64(&mut self, field: &Field, value: f64) {
        if field.name() == "elapsed_secs" {
            self.0 = value;
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

impl Subscriber for Counter {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if self.enabled(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        // sqlx asks with `enabled!` (a callsite of kind hint) before it
        // makes the event: both must be enabled.
        !metadata.is_span()
            && (metadata.target() == TARGET
                || (*TRACE_PGLEASE && metadata.target().starts_with("pglease")))
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        if event.metadata().target() != TARGET {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            eprintln!(
                "{} {}:{}",
                event.metadata().level(),
                event.metadata().target(),
                fields.0
            );
            return;
        }
        let index = match *event.metadata().level() {
            Level::ERROR => 0,
            Level::WARN => 1,
            Level::INFO => 2,
            _ => return,
        };
        let mut elapsed = Elapsed(0.0);
        event.record(&mut elapsed);
        let (statements, nanos) = &COUNTS[index];
        statements.fetch_add(1, Ordering::Relaxed);
        nanos.fetch_add((elapsed.0 * 1e9) as u64, Ordering::Relaxed);
    }

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}
