//! The pairs of P1, each pglease operation beside its minimal hand-made
//! statements: the SQL level (`BENCH_ONLY=sql`) runs them with pgbench,
//! P1 through the library (`BENCH_ONLY=p1`) through sqlx.

use pglease::Error;
use sqlx::PgPool;

use super::database::set_history;

/// One pair: what it measures, the raw baseline's script, its floor
/// twin, pglease's script, whether the history records
/// (pglease.set_history), and whether a waiter watches every cycle name
/// (a session that LISTENs on both channels and watches them, draining
/// what it hears).
pub(crate) struct Pair {
    pub(crate) label: &'static str,
    /// `bench/pgbench/raw_*.sql`.
    pub(crate) raw: &'static str,
    /// The floor twin of the raw script (`bench/pgbench/floor_*.sql`):
    /// the same statements inside `SECURITY DEFINER` functions
    /// (setup.sql), the least a design in which the database enforces who
    /// may act must cost.
    pub(crate) floor: &'static str,
    /// `bench/pgbench/lease_*.sql`.
    pub(crate) lease: &'static str,
    pub(crate) history: bool,
    pub(crate) watched: bool,
}

/// Every pair, in the tables' order.
pub(crate) const PAIRS: [Pair; 7] = [
    Pair {
        label: "acquire + release, history off, nobody watching (raw cycle)",
        raw: "raw_cycle",
        floor: "floor_cycle",
        lease: "lease_cycle",
        history: false,
        watched: false,
    },
    Pair {
        label: "acquire + release, default history (raw cycle + the same history rows)",
        raw: "raw_cycle_history",
        floor: "floor_cycle_history",
        lease: "lease_cycle",
        history: true,
        watched: false,
    },
    Pair {
        label: "acquire + release, a waiter watching (raw cycle + history rows + pg_notify)",
        raw: "raw_cycle_notify",
        floor: "floor_cycle_notify",
        lease: "lease_cycle",
        history: true,
        watched: true,
    },
    Pair {
        label: "renew (raw token-checked UPDATE)",
        raw: "raw_renew",
        floor: "floor_renew",
        lease: "lease_renew",
        history: true,
        watched: false,
    },
    Pair {
        label: "failed acquire (raw UPDATE that matches nothing)",
        raw: "raw_failed",
        floor: "floor_failed",
        lease: "lease_failed",
        history: true,
        watched: false,
    },
    Pair {
        label: "guarded write, one statement (minimal guard: FOR KEY SHARE + token + clock)",
        raw: "raw_write",
        floor: "floor_write",
        lease: "lease_write",
        history: true,
        watched: false,
    },
    Pair {
        label: "fenced transaction (minimal guard: FOR KEY SHARE + token + clock)",
        raw: "raw_fenced",
        floor: "floor_fenced",
        lease: "lease_fenced",
        history: true,
        watched: false,
    },
];

/// The clients and names of each pair's rows, in the tables' order.
pub(crate) const ROWS: [(usize, usize); 4] = [(1, 1), (1, 1000), (8, 1), (8, 1000)];

impl Pair {
    /// Sets the database at `url` (`pool` on it) as this pair needs it:
    /// the history on or off and, if the pair is watched, a waiter's
    /// session, returned (to abort after the pair's rows).
    pub(crate) async fn prepare(&self, pool: &PgPool, url: &str) -> Result<Watcher, Error> {
        set_history(pool, self.history).await?;
        Ok(Watcher(if self.watched {
            Some(watch_cycle_names(url).await?)
        } else {
            None
        }))
    }
}

/// The waiter's session of a watched pair, if any.
pub(crate) struct Watcher(Option<tokio::task::JoinHandle<()>>);

impl Watcher {
    /// Ends the waiter's session.
    pub(crate) fn stop(self) {
        if let Some(watcher) = self.0 {
            watcher.abort();
        }
    }
}

/// A waiter's session for the SQL-level benchmark: LISTENs on pglease's
/// release channel and the raw baseline's, watches every cycle name, and
/// drains what it hears until aborted.
async fn watch_cycle_names(url: &str) -> Result<tokio::task::JoinHandle<()>, Error> {
    let mut listener = sqlx::postgres::PgListener::connect(url).await?;
    listener
        .listen_all(["pglease_release", "raw_release"])
        .await?;
    let watched: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pglease.watch('cycle-' || g)) \
           FROM generate_series(1, 1000) AS g",
    )
    .fetch_one(&mut listener)
    .await?;
    assert_eq!(watched, 1000, "every cycle name watched");
    Ok(tokio::spawn(async move {
        while let Ok(Some(_)) = listener.try_recv().await {}
    }))
}
