//! `BENCH_ONLY=groups`, P7: lease groups (`LeaseManager::join`), every
//! member on a manager and a pool of its own unless said otherwise (as
//! separate processes would run), TTL 10 s, every revoke answered at once
//! (no work to finish), in a database of its own (`pglease_bench_p7`).
//! The first member of each group joins alone and takes every partition
//! before the others join. `BENCH_GROUPS=1,3` runs only those parts.
//!
//! 1. A graceful leave beside P3: one of 4 members on 40 partitions calls
//!    `leave()`; from the call to each of its partitions' `Assigned` event
//!    at the new owner; per partition handed = the time to the last of
//!    them / the partitions moved. Against P3 measured alternately in the
//!    same run: an explicit release to a waiting acquirer (LISTEN/NOTIFY),
//!    from the release call to the waiter holding the lease.
//! 2. A sixth member joins 5 members sharing 1,000 partitions: from the
//!    `join` call until settled (every partition owned, each member
//!    owning 166 or 167), and how many partitions moved, to whom.
//! 3. Stable cost: 10 members on 1,000 partitions beside one manager
//!    holding 1,000 leases (`hold_all`, the same TTL) in a database of
//!    its own, both running in the same windows: statements and their
//!    time per renewal period, on the server (pg_stat_user_functions,
//!    `track_functions = 'pl'`) and on the client (sqlx's statement log,
//!    counted by pool: [`crate::shared::statements`]).
//! 4. 100 members on 10,000 partitions, 99 joining at once after the
//!    first took every partition: time to settle (or the state at 60 s);
//!    statements of one member (on its own manager) and of the group
//!    while settling and while stable; server time and this process's CPU
//!    per renewal period. The 99 other members run 11 to a manager (9
//!    managers): 100 managers would need 200 connections (a pool and a
//!    listening connection each), more than the server's 100.

mod members;

use std::time::{Duration, Instant};

use pglease::{AcquireOptions, Error, HeldLease, LeaseManager};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

use crate::shared::Bench;
use crate::shared::database::{drop_database, fresh_database, server};
use crate::shared::statements::{self, Class, Count};
use crate::shared::timing::{bench_rounds, median, median_f64, ms, percentile, process_cpu};
use crate::shared::waiters::waiting_acquirer;
use members::Group;

const DB: &str = "pglease_bench_p7";
/// The baseline of (3): one manager's leases, alone in this database.
const ONE_DB: &str = "pglease_bench_p7_one";
const TTL: Duration = Duration::from_secs(10);
/// The renewal period at the default renewal fraction (a third of the TTL).
const PERIOD: Duration = Duration::from_millis(3333);
/// The longest any settling may take before the measure fails.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// The functions a client calls (the others run inside them): their
/// server time is the statements' server time.
const CALLED: &[&str] = &[
    "renew_many",
    "group_state",
    "take_partitions",
    "hand_over_partition",
    "join_group",
    "leave_group",
    "acquire",
    "release",
];

pub(crate) async fn run(_: &Bench) -> Result<(), Error> {
    statements::install();
    open(DB).await?;
    open(ONE_DB).await?;
    println!("\nLease groups (P7), TTL 10 s (renewed every 3.3 s), revokes answered at once");
    println!("{}", statement_stats().await?);
    // BENCH_GROUPS=1,3: only those of the four.
    let only = std::env::var("BENCH_GROUPS").unwrap_or_else(|_| "1,2,3,4".to_owned());
    let picked = |n: &str| only.split(',').any(|p| p.trim() == n);
    let outcome = async {
        if picked("1") {
            leave_beside_release().await?;
        }
        if picked("2") {
            sixth_member().await?;
        }
        if picked("3") {
            stable_cost().await?;
        }
        if picked("4") {
            hundred_members().await?;
        }
        Ok(())
    }
    .await;
    drop_database(DB).await?;
    drop_database(ONE_DB).await?;
    outcome
}

/// Database `name`, fresh, with the schema and its functions' server
/// time tracked.
async fn open(name: &str) -> Result<(), Error> {
    let pool = fresh_database(name, 2).await?;
    LeaseManager::new(pool.clone()).migrate().await?;
    sqlx::query(AssertSqlSafe(format!(
        "ALTER DATABASE {name} SET track_functions = 'pl'"
    )))
    .execute(&pool)
    .await?;
    pool.close().await;
    Ok(())
}

/// Whether pg_stat_statements can be read here, said in a line.
async fn statement_stats() -> Result<String, Error> {
    let pool = pool(DB, 1, None).await?;
    let created = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&pool)
        .await;
    let read = match created {
        Ok(_) => sqlx::query("SELECT count(*) FROM pg_stat_statements")
            .execute(&pool)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    pool.close().await;
    Ok(match read {
        Ok(()) => "pg_stat_statements can be read; the server time below is \
                   pg_stat_user_functions' all the same (the same in every run)"
            .to_owned(),
        Err(e) => format!(
            "pg_stat_statements: {e}; the server time below is pg_stat_user_functions' \
             (track_functions = pl): the functions the clients call"
        ),
    })
}

/// A pool of `connections` on database `db`, its statements counted as
/// `class`'s.
async fn pool(db: &str, connections: u32, class: Option<Class>) -> Result<PgPool, Error> {
    let mut options = server().await?.database(db);
    if let Some(class) = class {
        options = class.options(options);
    }
    Ok(PgPoolOptions::new()
        .max_connections(connections)
        .connect_with(options)
        .await?)
}

/// `count` managers on `DB`, each with a pool of `connections`.
async fn managers(
    count: usize,
    connections: u32,
    class: Class,
) -> Result<Vec<LeaseManager>, Error> {
    let mut all = Vec::new();
    for _ in 0..count {
        all.push(LeaseManager::new(pool(DB, connections, Some(class)).await?));
    }
    Ok(all)
}

/// Shuts every manager down and closes its pool.
async fn shut_down(managers: Vec<LeaseManager>) -> Result<(), Error> {
    for m in managers {
        // A release that fails ends at the lease's expiry: said, not fatal.
        if let Err(e) = m.shutdown().await {
            println!("(a shutdown's release failed: {e})");
        }
        m.pool().close().await;
    }
    Ok(())
}

/// (1): a graceful leave, beside a release to a waiting acquirer.
async fn leave_beside_release() -> Result<(), Error> {
    const MEMBERS: usize = 4;
    const PARTITIONS: u32 = 40;
    const RELEASES: usize = 10;
    let rounds = bench_rounds(5);
    println!(
        "\n(1) A graceful leave: one of {MEMBERS} members on {PARTITIONS} partitions calls \
         leave(); beside P3, a release to a waiting acquirer (LISTEN/NOTIFY); {rounds} rounds, \
         each a leave then {RELEASES} releases"
    );
    let ms_all = managers(MEMBERS, 2, Class::Members).await?;
    let p3 = managers(2, 2, Class::Baseline).await?;
    let mut group = Group::new("leave", PARTITIONS, TTL);
    let mut leaver = 0;
    for (i, m) in ms_all.iter().enumerate() {
        leaver = group.join(m, &format!("member-{i}"));
        first_alone(&group, i).await;
    }
    group.settle(SETTLE_LIMIT).await;
    let (mut totals, mut per_partition, mut latencies, mut firsts) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut moved, mut releases, mut round_ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut owning = Vec::new();
    for round in 0..rounds {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let owned = group.owned_by(leaver);
        let mark = group.mark();
        let called = group.leave(leaver).await?;
        group.settle(SETTLE_LIMIT).await;
        let moves = group.since(mark);
        let times: Vec<Duration> = owned
            .iter()
            .map(|k| {
                moves
                    .assigned
                    .iter()
                    .filter(|a| a.1 == *k)
                    .map(|a| a.2 - called)
                    .max()
                    .expect("every partition of the leaver assigned")
            })
            .collect();
        let total = *times.iter().max().expect("partitions");
        totals.push(total);
        per_partition.push(total / owned.len() as u32);
        firsts.push(*times.iter().min().expect("partitions"));
        latencies.extend(times);
        moved.push(moves.assigned.len());
        owning.push(owned.len());
        // Back to four members.
        leaver = group.join(&ms_all[MEMBERS - 1], &format!("member-{}", MEMBERS - 1));
        group.settle(SETTLE_LIMIT).await;
        let mut these = Vec::new();
        for j in 0..RELEASES {
            these.push(release_to_waiter(&p3[0], &p3[1], &format!("p3-{round}-{j}")).await?);
        }
        round_ratios
            .push((total / owned.len() as u32).as_secs_f64() / median(&these).as_secs_f64());
        releases.extend(these);
    }
    let p3_median = median(&releases);
    println!(
        "| way | moved per leave | to the last Assigned, ms (median) | per partition ms \
         (last / moved, median) | each partition's latency ms p50 / p99 | first partition ms \
         (median) |\n|---|---:|---:|---:|---:|---:|"
    );
    println!(
        "| leave() of a member owning {} partitions | {} | {:.1} | {:.2} | {:.1} / {:.1} | {:.1} |",
        owning
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        moved
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        ms(median(&totals)),
        ms(median(&per_partition)),
        ms(median(&latencies)),
        ms(percentile(&latencies, 0.99)),
        ms(median(&firsts)),
    );
    println!(
        "| P3: release to a waiting acquirer ({} handovers) | 1 | {:.2} (p99 {:.2}) | {:.2} | | |",
        releases.len(),
        ms(p3_median),
        ms(percentile(&releases, 0.99)),
        ms(p3_median),
    );
    let each: Vec<String> = round_ratios.iter().map(|r| format!("{r:.2}")).collect();
    println!(
        "per partition handed / P3 p50: {:.2} (each round, against its own releases: {}; \
         target at most 2)",
        ms(median(&per_partition)) / ms(p3_median),
        each.join(", ")
    );
    // Shut down first: a member whose driver goes would leave.
    shut_down(ms_all).await?;
    drop(group);
    shut_down(p3).await
}

/// The first member (`index` 0) joins alone and takes every partition
/// before the others join: the first take of a partition creates its
/// lease row, and takes that create rows at once stall each other (see
/// docs/benchmark.md, "Lease groups").
async fn first_alone(group: &Group, index: usize) {
    if index == 0 {
        group.settle(SETTLE_LIMIT).await;
    }
}

/// One P3 handover: `holder` holds `name`, a waiter on `waiter` waits for
/// it; from the release call to the waiter holding it.
async fn release_to_waiter(
    holder: &LeaseManager,
    waiter: &LeaseManager,
    name: &str,
) -> Result<Duration, Error> {
    let held = holder
        .acquire(name, AcquireOptions::ttl(TTL).holder("holder"))
        .await?;
    let (task, _) = waiting_acquirer(waiter, name).await;
    let released = Instant::now();
    holder.release(&held).await?;
    let (got, at) = task.await.expect("waiter task");
    waiter.release(&got?).await?;
    Ok(at - released)
}

/// (2): a sixth member joins five on 1,000 partitions.
async fn sixth_member() -> Result<(), Error> {
    const PARTITIONS: u32 = 1000;
    let rounds = bench_rounds(3);
    println!(
        "\n(2) A sixth member joins 5 members sharing {PARTITIONS} partitions ({rounds} rounds; \
         it leaves between them)"
    );
    let ms_all = managers(6, 2, Class::Members).await?;
    let mut group = Group::new("join", PARTITIONS, TTL);
    for (i, m) in ms_all[..5].iter().enumerate() {
        group.join(m, &format!("member-{i}"));
        first_alone(&group, i).await;
    }
    group.settle(SETTLE_LIMIT).await;
    println!(
        "| round | join to settled ms | partitions moved | to the newcomer | revokes answered | \
         lost | statements while settling (all members) |\n|---:|---:|---:|---:|---:|---:|---:|"
    );
    let mut times = Vec::new();
    for round in 0..rounds {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (mark, before) = (group.mark(), Class::Members.count());
        let started = Instant::now();
        let newcomer = group.join(&ms_all[5], "member-5");
        let settled = group.settle(SETTLE_LIMIT).await;
        let took = settled - started;
        let statements = Class::Members.count() - before;
        let moves = group.since(mark);
        let to_newcomer = moves.assigned.iter().filter(|a| a.0 == newcomer).count();
        println!(
            "| {} | {:.0} | {} | {to_newcomer} | {} | {} | {} |",
            round + 1,
            ms(took),
            moves.assigned.len(),
            moves.revoked,
            moves.lost,
            statements.statements
        );
        times.push(took);
        group.leave(newcomer).await?;
        group.settle(SETTLE_LIMIT).await;
    }
    println!(
        "join to settled: median {:.0} ms (target within 1 s)",
        ms(median(&times))
    );
    shut_down(ms_all).await?;
    drop(group);
    Ok(())
}

/// The server time of the functions clients call, by function: calls and
/// milliseconds, in the database `pool` is on.
async fn function_times(pool: &PgPool) -> Result<Vec<(String, i64, f64)>, Error> {
    let names: Vec<String> = CALLED.iter().map(|s| (*s).to_owned()).collect();
    Ok(sqlx::query_as(
        "SELECT funcname::text, calls, total_time FROM pg_stat_user_functions \
          WHERE schemaname = 'pglease' AND funcname = ANY($1) ORDER BY funcname",
    )
    .bind(&names)
    .fetch_all(pool)
    .await?)
}

/// What one window cost one side, read before and after.
struct Window {
    /// Client: statements and their time.
    client: Count,
    /// Server: the called functions' calls and milliseconds, by function.
    server: Vec<(String, i64, f64)>,
    took: Duration,
}

impl Window {
    fn server_ms(&self) -> f64 {
        self.server.iter().map(|f| f.2).sum()
    }

    fn periods(&self) -> f64 {
        self.took.as_secs_f64() / PERIOD.as_secs_f64()
    }

    /// Calls per period of each function, as `name n`.
    fn calls(&self) -> String {
        self.server
            .iter()
            .filter(|f| f.1 > 0)
            .map(|f| format!("{} {:.1}", f.0, f.1 as f64 / self.periods()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The difference of two reads of [`function_times`].
fn function_delta(
    before: &[(String, i64, f64)],
    after: &[(String, i64, f64)],
) -> Vec<(String, i64, f64)> {
    after
        .iter()
        .map(|(name, calls, time)| {
            let (c0, t0) = before
                .iter()
                .find(|b| &b.0 == name)
                .map_or((0, 0.0), |b| (b.1, b.2));
            (name.clone(), calls - c0, time - t0)
        })
        .collect()
}

/// Windows of `secs` each, measured on every side at once: for each
/// window, each side's cost (sides: the database its functions are
/// tracked in, and the classes its statements are counted under).
async fn windows(
    sides: &[(&PgPool, &[Class])],
    count: usize,
    secs: Duration,
) -> Result<Vec<(Vec<Window>, Duration)>, Error> {
    let mut all = Vec::new();
    for _ in 0..count {
        let mut before = Vec::new();
        for (pool, classes) in sides {
            let client = classes
                .iter()
                .map(|c| c.count())
                .fold(Count::default(), |a, b| a + b);
            before.push((client, function_times(pool).await?));
        }
        let (started, cpu) = (Instant::now(), process_cpu());
        tokio::time::sleep(secs).await;
        let (took, cpu) = (started.elapsed(), process_cpu() - cpu);
        let mut window = Vec::new();
        for ((pool, classes), (client, server)) in sides.iter().zip(before) {
            let now = classes
                .iter()
                .map(|c| c.count())
                .fold(Count::default(), |a, b| a + b);
            window.push(Window {
                client: now - client,
                server: function_delta(&server, &function_times(pool).await?),
                took,
            });
        }
        all.push((window, cpu));
    }
    Ok(all)
}

/// (3): 10 members on 1,000 partitions, stable, beside one manager
/// holding 1,000 leases.
async fn stable_cost() -> Result<(), Error> {
    const MEMBERS: usize = 10;
    const PARTITIONS: u32 = 1000;
    const WINDOWS: usize = 3;
    const WINDOW: Duration = Duration::from_secs(10);
    println!(
        "\n(3) Stable: {MEMBERS} members (a manager each) on {PARTITIONS} partitions, beside one \
         manager holding {PARTITIONS} leases (hold_all, TTL 10 s) in a database of its own; \
         {WINDOWS} windows of {} s, both sides in the same windows",
        WINDOW.as_secs()
    );
    let ms_all = managers(MEMBERS, 2, Class::Members).await?;
    let one = LeaseManager::new(pool(ONE_DB, 2, Some(Class::Baseline)).await?);
    let mut held: Vec<HeldLease> = Vec::new();
    for chunk in 0..10 {
        let names: Vec<String> = (0..100).map(|i| format!("one-{chunk}-{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        held.extend(
            one.hold_all(&names, AcquireOptions::ttl(TTL).holder("one"))
                .await?,
        );
    }
    let mut group = Group::new("stable", PARTITIONS, TTL);
    for (i, m) in ms_all.iter().enumerate() {
        group.join(m, &format!("member-{i}"));
        first_alone(&group, i).await;
    }
    group.settle(SETTLE_LIMIT).await;
    // The joins' reads and takes behind them.
    tokio::time::sleep(TTL).await;
    let reader = pool(DB, 1, None).await?;
    let one_reader = pool(ONE_DB, 1, None).await?;
    let measured = windows(
        &[
            (&reader, &[Class::Members]),
            (&one_reader, &[Class::Baseline]),
        ],
        WINDOWS,
        WINDOW,
    )
    .await?;
    println!(
        "| window | side | statements per period | per member per second | server ms per period \
         | client ms per period | server calls per period |\n|---:|---|---:|---:|---:|---:|---|"
    );
    let (mut server_ratios, mut statement_ratios, mut client_ratios) =
        (Vec::new(), Vec::new(), Vec::new());
    for (w, (sides, _)) in measured.iter().enumerate() {
        let (g, o) = (&sides[0], &sides[1]);
        for (label, side, members) in [("10 members", g, MEMBERS as f64), ("one manager", o, 1.0)] {
            println!(
                "| {} | {label} | {:.1} | {:.2} | {:.1} | {:.1} | {} |",
                w + 1,
                side.client.statements as f64 / side.periods(),
                side.client.statements as f64 / side.took.as_secs_f64() / members,
                side.server_ms() / side.periods(),
                ms(side.client.time) / side.periods(),
                side.calls(),
            );
        }
        server_ratios.push(g.server_ms() / o.server_ms());
        statement_ratios.push(g.client.statements as f64 / o.client.statements as f64);
        client_ratios.push(g.client.time.as_secs_f64() / o.client.time.as_secs_f64());
    }
    let list = |v: &[f64]| {
        v.iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "10 members / one manager: server time {:.2} ({}), client statement time {:.2} ({}), \
         statements {:.2} ({}); target at most 2 (server time)",
        median_f64(&mut server_ratios.clone()),
        list(&server_ratios),
        median_f64(&mut client_ratios.clone()),
        list(&client_ratios),
        median_f64(&mut statement_ratios.clone()),
        list(&statement_ratios),
    );
    let lost = held.iter().filter(|h| h.is_lost()).count();
    println!("baseline leases lost: {lost}");
    shut_down(ms_all).await?;
    drop(group);
    drop(held);
    reader.close().await;
    one_reader.close().await;
    shut_down(vec![one]).await
}

/// (4): 100 members on 10,000 partitions.
async fn hundred_members() -> Result<(), Error> {
    const PARTITIONS: u32 = 10_000;
    const OTHERS: usize = 99;
    const PER_MANAGER: usize = 11;
    const WINDOWS: usize = 2;
    const WINDOW: Duration = Duration::from_secs(10);
    println!(
        "\n(4) 100 members on {PARTITIONS} partitions: the first alone (it takes every \
         partition), then 99 joining at once; one member on a manager of its own (watched), \
         the other {OTHERS} {PER_MANAGER} to a manager"
    );
    let watched_m = managers(1, 2, Class::Watched).await?;
    let others = managers(OTHERS / PER_MANAGER, 4, Class::Members).await?;
    let mut group = Group::new("hundred", PARTITIONS, TTL);
    let reader = pool(DB, 1, None).await?;
    group.join(&others[0], "member-0");
    first_alone(&group, 0).await;
    let (watched0, members0, cpu0) = (
        Class::Watched.count(),
        Class::Members.count(),
        process_cpu(),
    );
    let functions0 = function_times(&reader).await?;
    let started = Instant::now();
    let mark = group.mark();
    group.join(&watched_m[0], "watched");
    for i in 1..OTHERS {
        group.join(&others[i / PER_MANAGER], &format!("member-{i}"));
    }
    let settled = group.settled(SETTLE_LIMIT).await;
    let (watched1, members1, cpu1) = (
        Class::Watched.count() - watched0,
        Class::Members.count() - members0,
        process_cpu() - cpu0,
    );
    let elapsed = started.elapsed();
    let moves = group.since(mark);
    let functions = function_delta(&functions0, &function_times(&reader).await?);
    let settling_server: f64 = functions.iter().map(|f| f.2).sum();
    match &settled {
        Ok(at) => println!(
            "settled {:.2} s after the 99 joins began: {} partitions assigned (the first \
             member owned all {PARTITIONS}; {} to move), {} revokes answered, {} lost",
            (*at - started).as_secs_f64(),
            moves.assigned.len(),
            PARTITIONS as usize - PARTITIONS as usize / 100,
            moves.revoked,
            moves.lost
        ),
        Err(counts) => println!(
            "NOT settled {:.0} s after the 99 joins began: {} of 100 members own their share \
             (99 or 100), {} own none, {} partitions owned; {} assignments, {} revokes \
             answered, {} lost meanwhile",
            SETTLE_LIMIT.as_secs(),
            counts.iter().filter(|&&c| c == 100 || c == 99).count(),
            counts.iter().filter(|&&c| c == 0).count(),
            counts.iter().sum::<usize>(),
            moves.assigned.len(),
            moves.revoked,
            moves.lost
        ),
    }
    let secs = elapsed.as_secs_f64();
    println!(
        "| while | statements/s, the watched member | statements/s, the whole group | client \
         statement ms/s, whole group | server ms/s | client CPU ms/s (this process) |\n\
         |---|---:|---:|---:|---:|---:|"
    );
    println!(
        "| settling ({:.1} s, to the settle check or its limit) | {:.1} | {:.0} | {:.0} | {:.0} (the stats of the last second may be missing) | {:.0} |",
        secs,
        watched1.statements as f64 / secs,
        (watched1 + members1).statements as f64 / secs,
        ms(watched1.time + members1.time) / secs,
        settling_server / secs,
        ms(cpu1) / secs,
    );
    let settle_calls: Vec<String> = functions
        .iter()
        .filter(|f| f.1 > 0)
        .map(|f| format!("{} {}", f.0, f.1))
        .collect();
    println!("calls while settling: {}", settle_calls.join(", "));
    tokio::time::sleep(TTL).await;
    let measured = windows(
        &[
            (&reader, &[Class::Watched]),
            (&reader, &[Class::Watched, Class::Members]),
        ],
        WINDOWS,
        WINDOW,
    )
    .await?;
    println!(
        "| stable window | statements/s, the watched member | statements/s, the whole group | \
         statements per period, whole group | server ms per period | client statement ms per \
         period | client CPU ms per period | server calls per period |\n\
         |---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for (w, (sides, cpu)) in measured.iter().enumerate() {
        let (watched, side) = (&sides[0], &sides[1]);
        println!(
            "| {} | {:.2} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
            w + 1,
            watched.client.statements as f64 / watched.took.as_secs_f64(),
            side.client.statements as f64 / side.took.as_secs_f64(),
            side.client.statements as f64 / side.periods(),
            side.server_ms() / side.periods(),
            ms(side.client.time) / side.periods(),
            ms(*cpu) / side.periods(),
            side.calls(),
        );
    }
    shut_down(watched_m).await?;
    shut_down(others).await?;
    drop(group);
    reader.close().await;
    Ok(())
}
