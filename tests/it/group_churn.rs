//! A lease group under churn: five member processes share 16 partitions,
//! each writing fenced rows per partition it owns, while members join,
//! leave gracefully, are killed (SIGKILL) and are frozen past their TTL
//! (SIGSTOP, then SIGCONT), in an order drawn from a seed (reproducible:
//! the seed is printed, and `GROUP_CHURN_SEEDS=7,8` runs those seeds).
//!
//! After each step the test waits for the group to settle and checks:
//!
//! - **safety**: every committed write was made inside its token's term
//!   (after that token's acquisition, before the next one of the
//!   partition), no token was issued twice, and each partition's tokens
//!   grow;
//! - **liveness**: after a death (a kill, or a freeze past the TTL) every
//!   partition is owned by a live member within TTL + 1 s, and the group
//!   is balanced within [`SETTLE`];
//! - **minimal movement**: a join moves at most ceil(M / N) partitions,
//!   all to the newcomer; a leave or a death moves only the leaver's;
//! - **handoff**: a revoked owner's write in flight either commits before
//!   the handover or is refused (the term check above covers both).
//!
//! The figures (partitions moved per step against the minimum, time to
//! balance, writes refused) are printed.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sqlx::Row;
use tokio::time::Instant;

use pglease::{GroupEvent, GroupOptions, LeaseManager};

use crate::common::TestDb;

const GROUP: &str = "churn";
const PARTITIONS: usize = 16;
const TTL: Duration = Duration::from_secs(2);
const GRACE: Duration = Duration::from_millis(500);
/// The longest a step may take to settle: a death's TTL, a second for the
/// takeover, and a second more for the handovers that follow.
const SETTLE: Duration = Duration::from_secs(5);
/// How long a write's transaction stays open (in flight) before it
/// commits, and the pause between writes.
const WORK: Duration = Duration::from_millis(100);

/// One member process: joins, writes under each partition it owns, and
/// leaves when told (a line on stdin). Prints what happens.
/// A line on stdout, after the wall-clock time (ms of the second) it
/// was said at, for reading a member's story.
macro_rules! say {
    ($($arg:tt)*) => {{
        let now = chrono::Utc::now();
        println!("{} {}", now.format("%S%.3f"), format!($($arg)*));
    }};
}

async fn member_process() {
    let Ok(url) = std::env::var("PGLEASE_CHILD_URL") else {
        return;
    };
    let member = std::env::var("PGLEASE_CHILD_MEMBER").expect("PGLEASE_CHILD_MEMBER");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect(&url)
        .await
        .expect("connect");
    let m = LeaseManager::new(pool);
    let options = GroupOptions::partitions(PARTITIONS as u32)
        .ttl(TTL)
        .grace(GRACE)
        .member(&member);
    let mut joined = m.join(GROUP, options).await.expect("join");
    say!("joined");
    let leave = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    });
    let mut leave = Some(leave);
    let mut workers: BTreeMap<u32, (tokio_util::sync::CancellationToken, tokio::task::JoinHandle<()>)> =
        BTreeMap::new();
    loop {
        let event = tokio::select! {
            event = joined.next_event() => event,
            _ = async { leave.as_mut().expect("armed").await }, if leave.is_some() => {
                leave = None;
                joined.begin_leave();
                continue;
            }
        };
        let Some(event) = event else { break };
        match event {
            GroupEvent::Assigned { partition, lease } => {
                say!("assigned {partition} {}", lease.token());
                let stop = tokio_util::sync::CancellationToken::new();
                let worker = tokio::spawn(work(m.clone(), partition, lease, stop.clone()));
                workers.insert(partition, (stop, worker));
            }
            GroupEvent::Revoking(revoke) => {
                say!("revoking {}", revoke.partition());
                if let Some((stop, worker)) = workers.remove(&revoke.partition()) {
                    // The write in flight finishes, then the partition goes.
                    stop.cancel();
                    tokio::spawn(async move {
                        let _ = worker.await;
                        revoke.done();
                    });
                }
            }
            GroupEvent::Lost { partition, reason } => {
                say!("lost {partition} {reason}");
                // The write in flight tries to commit (and is refused).
                if let Some((stop, _)) = workers.remove(&partition) {
                    stop.cancel();
                }
            }
            _ => {}
        }
    }
    say!("left");
}

/// Writes under `lease` until stopped: each write's transaction stays
/// open for [`WORK`], so that revokes and takeovers find writes in flight.
async fn work(
    m: LeaseManager,
    partition: u32,
    lease: pglease::HeldLease,
    stop: tokio_util::sync::CancellationToken,
) {
    let _ = &m;
    while !stop.is_cancelled() && !lease.is_lost() {
        let outcome: Result<(), pglease::Error> = async {
            let mut tx = lease.begin_fenced().await?;
            sqlx::query(
                "INSERT INTO writes (partition, token, at) VALUES ($1, $2, clock_timestamp())",
            )
            .bind(partition as i32)
            .bind(lease.token())
            .execute(&mut *tx)
            .await
            .map_err(pglease::Error::from)?;
            tokio::time::sleep(WORK).await;
            tx.commit().await?;
            Ok(())
        }
        .await;
        if let Err(error) = outcome {
            say!("refused {partition} {} {error}", lease.token());
        }
        tokio::time::sleep(WORK).await;
    }
}

/// A member process and what it prints.
struct Member {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Member {
    fn start(db: &TestDb, name: &str) -> Member {
        let mut child = crate::common::child_test("group_churn::member_process")
            .env("PGLEASE_CHILD_URL", db.url())
            .env("PGLEASE_CHILD_MEMBER", name)
            .env("RUST_LOG", "off")
            .stdin(Stdio::piped())
            .spawn()
            .expect("start a member process");
        let lines = crate::common::stdout_lines(&mut child);
        Member {
            name: name.to_owned(),
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Reads what it printed so far.
    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }

    /// Waits until it printed a line containing `what`.
    async fn printed(&mut self, what: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            self.drain();
            if self.seen.iter().any(|l| l.contains(what)) {
                return;
            }
            assert!(Instant::now() < deadline, "{} did not print {what:?}: {:?}", self.name, self.seen);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn refused(&mut self) -> usize {
        self.drain();
        self.seen.iter().filter(|l| l.contains("refused ")).count()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = kill(self.pid(), Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Who owns each partition now: valid leases, picked up by their member
/// (a partition handed over and not picked up yet is in transit: its new
/// owner may not have heard of it, and may be frozen before it does).
async fn owners(m: &LeaseManager) -> Vec<Option<String>> {
    m.group(GROUP)
        .await
        .expect("read the group")
        .owners
        .into_iter()
        .map(|o| o.filter(|o| !o.handed).map(|o| o.member))
        .collect()
}

/// Whether `owners` is balanced among `live`: every partition owned by a
/// live member, each owning M / N rounded down or up.
fn balanced(owners: &[Option<String>], live: &[String]) -> bool {
    let n = live.len();
    let mut counts: BTreeMap<&str, usize> = live.iter().map(|m| (m.as_str(), 0)).collect();
    for owner in owners {
        match owner.as_deref().and_then(|o| counts.get_mut(o)) {
            Some(count) => *count += 1,
            None => return false,
        }
    }
    counts
        .values()
        .all(|&c| c == PARTITIONS / n || c == PARTITIONS.div_ceil(n))
}

/// Every partition owned by one of `live` (not necessarily balanced).
fn all_owned_by(owners: &[Option<String>], live: &[String]) -> bool {
    owners
        .iter()
        .all(|o| o.as_ref().is_some_and(|o| live.contains(o)))
}

/// The names of `members`.
fn names(members: &[Member]) -> Vec<String> {
    members.iter().map(|m| m.name.clone()).collect()
}

/// Polls until `done(owners)`; how long it took from `since`.
async fn until(
    m: &LeaseManager,
    what: &str,
    since: Instant,
    limit: Duration,
    done: impl Fn(&[Option<String>]) -> bool,
) -> (Duration, Vec<Option<String>>) {
    match within(m, since, limit, done).await {
        Ok(found) => found,
        Err(now) => panic!("{what}: not within {limit:?}: {now:?}"),
    }
}

/// Polls until `done(owners)`: how long it took from `since`, or the
/// owners at `limit`.
async fn within(
    m: &LeaseManager,
    since: Instant,
    limit: Duration,
    done: impl Fn(&[Option<String>]) -> bool,
) -> Result<(Duration, Vec<Option<String>>), Vec<Option<String>>> {
    loop {
        let now = owners(m).await;
        if done(&now) {
            return Ok((since.elapsed(), now));
        }
        if since.elapsed() >= limit {
            return Err(now);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn moved(before: &[Option<String>], after: &[Option<String>]) -> Vec<(usize, Option<String>, Option<String>)> {
    before
        .iter()
        .zip(after)
        .enumerate()
        .filter(|(_, (b, a))| b != a)
        .map(|(k, (b, a))| (k, b.clone(), a.clone()))
        .collect()
}

/// A small, seeded generator (xorshift64*): the same steps for a seed on
/// every machine.
struct Steps(u64);

impl Steps {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

#[derive(Default)]
struct Figures {
    /// (step kind, moved, minimum, time to balance)
    steps: Vec<(&'static str, usize, usize, Duration)>,
    /// After a death: time until every partition had a live owner.
    owned_after_death: Vec<Duration>,
    refused: usize,
}

/// Checks the writes and the tokens against the history: no write
/// outside its token's term, no token twice, tokens growing per
/// partition.
async fn check_safety(db: &TestDb) -> usize {
    let terms = sqlx::query(
        "SELECT name, token, at FROM pglease.history \
         WHERE event = 'acquired' AND name LIKE 'churn/%' AND name NOT LIKE 'churn/members/%' \
         ORDER BY id",
    )
    .fetch_all(db.pool())
    .await
    .expect("read the history");
    let mut by_partition: BTreeMap<i32, Vec<(i64, chrono::DateTime<chrono::Utc>)>> = BTreeMap::new();
    let mut tokens = std::collections::BTreeSet::new();
    for row in &terms {
        let name: String = row.get("name");
        let k: i32 = name["churn/".len()..].parse().expect("a partition number");
        let token: i64 = row.get("token");
        assert!(tokens.insert(token), "token {token} issued twice");
        let list = by_partition.entry(k).or_default();
        if let Some((last, _)) = list.last() {
            assert!(token > *last, "partition {k}: token {token} after {last}");
        }
        list.push((token, row.get("at")));
    }
    let writes = sqlx::query("SELECT partition, token, at FROM writes")
        .fetch_all(db.pool())
        .await
        .expect("read the writes");
    for row in &writes {
        let k: i32 = row.get("partition");
        let token: i64 = row.get("token");
        let at: chrono::DateTime<chrono::Utc> = row.get("at");
        let list = &by_partition[&k];
        let i = list
            .iter()
            .position(|(t, _)| *t == token)
            .unwrap_or_else(|| panic!("partition {k}: a write under token {token}, never issued"));
        assert!(at >= list[i].1, "partition {k}: a write under {token} before its term");
        if let Some((next, start)) = list.get(i + 1) {
            assert!(
                at < *start,
                "safety: partition {k}: a write under {token} committed at {at}, in token {next}'s \
                 term (from {start})"
            );
        }
    }
    writes.len()
}

async fn run_seed(seed: u64, figures: &mut Figures) {
    println!("seed {seed}");
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "CREATE TABLE writes (partition integer NOT NULL, token bigint NOT NULL, \
         at timestamptz NOT NULL)",
    )
    .execute(db.pool())
    .await
    .expect("create the writes table");
    let m = db.manager();
    let mut members: Vec<Member> = Vec::new();
    let mut next_name = 0;
    let mut new_name = || {
        next_name += 1;
        format!("m{next_name}")
    };
    for _ in 0..5 {
        let mut member = Member::start(&db, &new_name());
        member.printed("joined", SETTLE).await;
        members.push(member);
    }
    let live = names(&members);
    until(&m, "the first balance", Instant::now(), SETTLE * 2, |o| balanced(o, &live)).await;

    let mut steps = Steps(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    for _ in 0..6 {
        let n = members.len();
        let kind = match steps.next(4) {
            0 if n < 6 => "join",
            _ if n <= 3 => "join",
            0 | 1 => "leave",
            2 => "kill",
            _ => "freeze",
        };
        let before = owners(&m).await;
        let started = Instant::now();
        match kind {
            "join" => {
                let mut member = Member::start(&db, &new_name());
                member.printed("joined", SETTLE).await;
                let newcomer = member.name.clone();
                members.push(member);
                let live = names(&members);
                let (took, after) =
                    until(&m, "balance after a join", started, SETTLE, |o| balanced(o, &live)).await;
                let moves = moved(&before, &after);
                let bound = PARTITIONS.div_ceil(live.len());
                assert!(moves.len() <= bound, "a join moved {moves:?}, more than {bound}");
                for (k, _, to) in &moves {
                    assert_eq!(to.as_deref(), Some(newcomer.as_str()), "partition {k} moved to another");
                }
                figures.steps.push(("join", moves.len(), PARTITIONS / live.len(), took));
            }
            "leave" => {
                let i = steps.next(n as u64) as usize;
                let mut leaver = members.remove(i);
                let owned = before.iter().filter(|o| o.as_deref() == Some(leaver.name.as_str())).count();
                let _ = leaver.stdin.take().map(|mut s| s.write_all(b"leave\n"));
                leaver.printed("left", SETTLE).await;
                figures.refused += leaver.refused();
                let live = names(&members);
                let (took, after) =
                    until(&m, "balance after a leave", started, SETTLE, |o| balanced(o, &live)).await;
                let moves = moved(&before, &after);
                for (k, from, _) in &moves {
                    assert_eq!(from.as_deref(), Some(leaver.name.as_str()), "partition {k} moved from a stayer");
                }
                figures.steps.push(("leave", moves.len(), owned, took));
            }
            _ => {
                let i = steps.next(n as u64) as usize;
                let mut gone = members.remove(i);
                let owned = before.iter().filter(|o| o.as_deref() == Some(gone.name.as_str())).count();
                let signal = if kind == "kill" { Signal::SIGKILL } else { Signal::SIGSTOP };
                kill(gone.pid(), signal).expect("signal the member");
                let died = Instant::now();
                let live = names(&members);
                let (owned_in, _) =
                    match within(&m, died, TTL + Duration::from_secs(1), |o| all_owned_by(o, &live))
                        .await
                    {
                        Ok(found) => found,
                        Err(now) => {
                            // What each live member said last, for the story.
                            for member in &mut members {
                                member.drain();
                                let from = member.seen.len().saturating_sub(12);
                                println!("{} said: {:?}", member.name, &member.seen[from..]);
                            }
                            panic!(
                                "liveness: seed {seed}: every partition owned after a death: not \
                                 within TTL + 1 s: {now:?} (died at {})",
                                chrono::Utc::now().format("%S%.3f")
                            );
                        }
                    };
                figures.owned_after_death.push(owned_in);
                let (took, after) =
                    until(&m, "balance after a death", died, SETTLE, |o| balanced(o, &live)).await;
                let moves = moved(&before, &after);
                for (k, from, _) in &moves {
                    assert_eq!(from.as_deref(), Some(gone.name.as_str()), "partition {k} moved from a live member");
                }
                figures.steps.push((if kind == "kill" { "kill" } else { "freeze" }, moves.len(), owned, took));
                if kind == "freeze" {
                    // It wakes up: its writes in flight are refused, it
                    // hears of its losses, and it joins again.
                    let before = after;
                    kill(gone.pid(), Signal::SIGCONT).expect("resume the member");
                    if std::env::var("GROUP_CHURN_DEBUG").is_ok() {
                        println!("DEBUG resumed at {}", chrono::Utc::now().format("%S%.3f"));
                    }
                    let resumed = Instant::now();
                    gone.printed("lost ", SETTLE).await;
                    let newcomer = gone.name.clone();
                    members.push(gone);
                    let live = names(&members);
                    if std::env::var("GROUP_CHURN_DEBUG").is_ok() {
                        tokio::time::sleep(Duration::from_secs(6)).await;
                        let back = members.last_mut().expect("pushed");
                        back.drain();
                        println!("DEBUG {}: {:?}", back.name, back.seen);
                        let rows = sqlx::query(
                            "SELECT name, token, event, holder, to_char(at, 'SS.MS') AS t, detail \
                             FROM pglease.history WHERE at > now() - interval '9 s' ORDER BY id",
                        )
                        .fetch_all(db.pool())
                        .await
                        .expect("history");
                        for r in rows {
                            println!(
                                "DEBUG h {} {} {} {:?} {} {:?}",
                                r.get::<String, _>("t"),
                                r.get::<String, _>("name"),
                                r.get::<i64, _>("token"),
                                r.get::<Option<String>, _>("holder"),
                                r.get::<String, _>("event"),
                                r.get::<Option<String>, _>("detail")
                            );
                        }
                    }
                    let (took, after) = until(&m, "balance after a frozen member came back", resumed,
                                              SETTLE, |o| balanced(o, &live)).await;
                    let moves = moved(&before, &after);
                    let bound = PARTITIONS.div_ceil(live.len());
                    assert!(moves.len() <= bound, "a rejoin moved {moves:?}, more than {bound}");
                    for (k, _, to) in &moves {
                        assert_eq!(to.as_deref(), Some(newcomer.as_str()), "partition {k} moved to another");
                    }
                    figures.steps.push(("rejoin", moves.len(), PARTITIONS / live.len(), took));
                } else {
                    let _ = gone.child.wait();
                }
            }
        }
        let writes = check_safety(&db).await;
        println!("seed {seed}: {kind} settled; {writes} writes so far, all inside their terms");
    }
    for member in &mut members {
        figures.refused += member.refused();
    }
}

/// The seeds to run: `GROUP_CHURN_SEEDS` (comma-separated) or `default`.
fn seeds(default: &[u64]) -> Vec<u64> {
    match std::env::var("GROUP_CHURN_SEEDS") {
        Ok(list) => list.split(',').filter_map(|s| s.trim().parse().ok()).collect(),
        Err(_) => default.to_vec(),
    }
}

async fn churn(default: &[u64]) {
    let mut figures = Figures::default();
    for seed in seeds(default) {
        run_seed(seed, &mut figures).await;
    }
    for kind in ["join", "rejoin", "leave", "kill", "freeze"] {
        let mut rows: Vec<_> = figures.steps.iter().filter(|s| s.0 == kind).collect();
        if rows.is_empty() {
            continue;
        }
        rows.sort_by_key(|s| s.3);
        let moved: usize = rows.iter().map(|s| s.1).sum();
        let minimum: usize = rows.iter().map(|s| s.2).sum();
        println!(
            "figures: {kind}: {} steps, {moved} partitions moved against a minimum of {minimum}; \
             balanced after {:?} median, {:?} worst",
            rows.len(),
            rows[rows.len() / 2].3,
            rows[rows.len() - 1].3
        );
    }
    figures.owned_after_death.sort();
    if let (Some(median), Some(worst)) = (
        figures.owned_after_death.get(figures.owned_after_death.len() / 2),
        figures.owned_after_death.last(),
    ) {
        println!("figures: every partition owned {median:?} (median), {worst:?} (worst) after a death");
    }
    println!("figures: {} writes refused", figures.refused);
}

async fn five_members_under_churn_seeds_1_to_5() {
    churn(&[1, 2, 3, 4, 5]).await;
}

async fn five_members_under_churn_seeds_6_to_10() {
    churn(&[6, 7, 8, 9, 10]).await;
}

pglease_formations::tests![
    member_process ignored,
    five_members_under_churn_seeds_1_to_5,
    five_members_under_churn_seeds_6_to_10,
];
