//! Running an operation for a while, alternating two of them, and the
//! figures of the tables: rates, medians, the ratio of each pair.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pglease::Error;

type BoxFut = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

/// One operation of a measure, given the number of the client running it.
pub(crate) type Op = Arc<dyn Fn(usize) -> BoxFut + Send + Sync>;

/// `f` as an [`Op`].
pub(crate) fn op<F, Fut>(f: F) -> Op
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Error>> + Send + 'static,
{
    Arc::new(move |c| Box::pin(f(c)) as BoxFut)
}

/// Operations per second of `op` run by `clients` concurrent loops.
pub(crate) async fn rate(clients: usize, secs: f64, op: Op) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let op = op.clone();
            let done = done.clone();
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    if let Err(e) = op(client).await {
                        panic!("benchmark operation failed: {e}");
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("benchmark task");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Mean ops/s of `a` and of `b`, each run `rounds` times for `secs` / 2,
/// alternately.
pub(crate) async fn alternate(clients: usize, secs: f64, rounds: u32, a: Op, b: Op) -> (f64, f64) {
    let mut x = 0.0;
    let mut y = 0.0;
    for _ in 0..rounds {
        x += rate(clients, secs / 2.0, a.clone()).await;
        y += rate(clients, secs / 2.0, b.clone()).await;
    }
    (x / f64::from(rounds), y / f64::from(rounds))
}

/// `BENCH_ROUNDS`, else `default`.
pub(crate) fn bench_rounds(default: usize) -> usize {
    std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The figures of one row of a pair table, pair by pair: the first
/// side's, the second's, and the second / first of each pair.
#[derive(Default)]
pub(crate) struct Pairs {
    first: Vec<f64>,
    second: Vec<f64>,
    ratios: Vec<f64>,
}

impl Pairs {
    /// One more pair, measured first then second.
    pub(crate) fn push(&mut self, first: f64, second: f64) {
        self.ratios.push(second / first);
        self.first.push(first);
        self.second.push(second);
    }

    /// The row's last cells: both medians, each pair's ratio and their
    /// median.
    pub(crate) fn cells(mut self) -> String {
        let each: Vec<String> = self.ratios.iter().map(|r| format!("{r:.2}")).collect();
        format!(
            "{:.0} | {:.0} | {} | {:.2}",
            median_f64(&mut self.first),
            median_f64(&mut self.second),
            each.join(", "),
            median_f64(&mut self.ratios)
        )
    }
}

/// One row of a pair table: `rounds` alternated runs of `first` then
/// `second`, printed as both medians, each pair's ratio (second / first)
/// and their median.
pub(crate) async fn pair_row(
    label: &str,
    clients: usize,
    names: usize,
    rounds: usize,
    secs: f64,
    first: Op,
    second: Op,
) {
    let mut pairs = Pairs::default();
    for _ in 0..rounds {
        let x = rate(clients, secs, first.clone()).await;
        let y = rate(clients, secs, second.clone()).await;
        pairs.push(x, y);
    }
    println!("| {label} | {clients} | {names} | {} |", pairs.cells());
}

/// The middle duration (the upper of the two middle ones for an even
/// count).
pub(crate) fn median(v: &[Duration]) -> Duration {
    percentile(v, 0.5)
}

/// The duration at fraction `p` (0 to 1) of `v` sorted, the nearest
/// rank.
pub(crate) fn percentile(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The middle value (the mean of the two middle ones for an even count).
pub(crate) fn median_f64(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Milliseconds, as the latency tables print them.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A name's number in 1..=`names` for the next operation, spread over
/// the names as pgbench's `random(1, :names)` spreads them.
pub(crate) fn pick(names: usize) -> usize {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // splitmix64's finaliser over a counter: cheap, and no dependency.
    let mut x = NEXT
        .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    1 + (x % names as u64) as usize
}

/// This process's CPU time (user + system) so far.
pub(crate) fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (in parentheses): utime and stime
    // are the 12th and 13th of them, in clock ticks (100 per second).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}
