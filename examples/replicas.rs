//! Five replicas of a service elect a leader; the leader writes, fenced by
//! its term's token; the followers know who leads and where. Then the
//! leader is restarted (it resigns), an operator asks the next one to step
//! down, and each handover is timed. Every change is printed as an
//! observer sees it.
//!
//! Run: `cargo run --example replicas` (on DATABASE_URL, else the
//! libpq defaults, else a throwaway cluster; it creates the pglease schema if needed and a table
//! `pglease_example_replicas`, dropped at the end).
//!
//! Each replica has a manager (and pool) of its own, as separate processes
//! would; `pglease elect NAME --ttl D -- CMD` does the same for any program.

use std::sync::Arc;
use std::time::Duration;

use pglease::elect::{Elector, Leadership};
use pglease::observe::Change;
use pglease::{AcquireOptions, HeldLease, LeaseManager};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::time::Instant;

const REPLICAS: usize = 5;
const NAME: &str = "example-scheduler";
const BOUND: Duration = Duration::from_secs(10);

/// The leader's work: a fenced write every 50 ms until the term ends,
/// or until it is asked to step down (then it hands over).
async fn lead(me: &Elector, term: HeldLease, replica: usize) {
    loop {
        tokio::select! {
            by = me.until_step_down_requested() => {
                println!("           replica-{replica}: {by} asked me to step down; handing over");
                me.step_down();
                return;
            }
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        let written = async {
            let mut tx = term.begin_fenced().await?;
            sqlx::query("INSERT INTO pglease_example_replicas (token, replica) VALUES ($1, $2)")
                .bind(term.token())
                .bind(replica as i32)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok::<_, pglease::Error>(())
        };
        if written.await.is_err() {
            return; // refused: the term is over
        }
    }
}

async fn replica(options: PgConnectOptions, i: usize) -> Result<Arc<Elector>, pglease::Error> {
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .connect_with(options)
        .await?;
    let how = AcquireOptions::ttl(Duration::from_secs(2))
        .holder(format!("replica-{i}"))
        .value(format!("10.0.0.{i}:8080"));
    Ok(Arc::new(LeaseManager::new(pool).elector(NAME, how)?))
}

/// Waits until a replica other than `not` leads and every running replica
/// sees it;
/// returns its index.
async fn next_leader(electors: &[Arc<Elector>], not: Option<usize>) -> usize {
    let deadline = Instant::now() + BOUND;
    loop {
        let leading: Vec<usize> = (0..electors.len())
            .filter(|&i| electors[i].is_leader() && Some(i) != not)
            .collect();
        if let [leader] = leading[..] {
            let holder = format!("replica-{leader}");
            if electors
                .iter()
                .filter(|e| e.leadership() != Leadership::Stopped)
                .all(|e| e.leader().is_some_and(|l| l.holder == holder))
            {
                return leader;
            }
        }
        assert!(Instant::now() < deadline, "no new leader within {BOUND:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // DATABASE_URL, else the libpq defaults, else a throwaway cluster.
    let options = pglease::provision::server().await?.options.clone();
    let admin = set_up(&options).await?;
    let printer = print_changes(&admin).await?;

    let mut electors = Vec::new();
    for i in 0..REPLICAS {
        electors.push(replica(options.clone(), i).await?);
    }
    let runs: Vec<_> = electors
        .iter()
        .enumerate()
        .map(|(i, elector)| {
            let elector = Arc::clone(elector);
            tokio::spawn(async move {
                let me = Arc::clone(&elector);
                elector
                    .run(async move |term| lead(&me, term, i).await)
                    .await
            })
        })
        .collect();

    let leaders = handovers(&admin, &electors).await?;
    for elector in &electors {
        elector.resign();
    }
    for run in runs {
        run.await??;
    }
    report(&admin, leaders).await?;
    sqlx::raw_sql("DROP TABLE pglease_example_replicas")
        .execute(admin.pool())
        .await?;
    admin.shutdown().await?;
    printer.abort();
    Ok(())
}

/// A manager for the example's own use, the schema created if needed, and
/// the table the leaders write, created afresh.
async fn set_up(options: &PgConnectOptions) -> Result<LeaseManager, pglease::Error> {
    let admin = LeaseManager::new(PgPoolOptions::new().connect_with(options.clone()).await?);
    admin.migrate().await?;
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS pglease_example_replicas; \
         CREATE TABLE pglease_example_replicas \
           (id bigserial PRIMARY KEY, token bigint NOT NULL, replica int NOT NULL)",
    )
    .execute(admin.pool())
    .await?;
    Ok(admin)
}

/// An observer that prints every change of the election, as it happens.
async fn print_changes(
    admin: &LeaseManager,
) -> Result<tokio::task::JoinHandle<()>, pglease::Error> {
    let start = Instant::now();
    let mut observer = admin.observe(NAME).await?;
    Ok(tokio::spawn(async move {
        while let Ok(change) = observer.next().await {
            let at = start.elapsed().as_secs_f64();
            match change {
                Change::Acquired { token, holder, .. } => {
                    println!("[{at:7.3}s] {holder} leads (token {token})")
                }
                Change::ValueChanged { value, .. } => {
                    println!(
                        "[{at:7.3}s]   its address: {}",
                        value.as_deref().unwrap_or("-")
                    )
                }
                Change::StepDownRequested { by, .. } => {
                    println!("[{at:7.3}s]   {by} asks the leader to step down")
                }
                Change::Released { token } => println!("[{at:7.3}s] term {token} released"),
                Change::Expired { token } => println!("[{at:7.3}s] term {token} expired"),
                Change::Current(_) => {}
                other => println!("[{at:7.3}s] {other:?}"),
            }
        }
    }))
}

/// The first leader, then a rolling restart of the leader (it resigns),
/// then an operator asking the new leader to step down, each handover
/// timed; returns the three leaders in turn.
async fn handovers(
    admin: &LeaseManager,
    electors: &[Arc<Elector>],
) -> Result<[usize; 3], pglease::Error> {
    let first = next_leader(electors, None).await;
    let seen = electors[(first + 1) % REPLICAS]
        .leader()
        .and_then(|l| l.value)
        .unwrap_or_default();
    println!("           every replica sees replica-{first} leading, at {seen}");
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A rolling restart of the leader: it resigns.
    let asked = Instant::now();
    electors[first].resign();
    let second = next_leader(electors, Some(first)).await;
    println!(
        "           handover on resign: {:.1} ms",
        asked.elapsed().as_secs_f64() * 1e3
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    // An operator asks the new leader to step down.
    let asked = Instant::now();
    admin.request_step_down(NAME, "operator").await?;
    let third = next_leader(electors, Some(second)).await;
    println!(
        "           handover on a step-down request: {:.1} ms",
        asked.elapsed().as_secs_f64() * 1e3
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok([first, second, third])
}

/// The writes, in commit order: each term's, and none after a later term
/// began.
async fn report(admin: &LeaseManager, leaders: [usize; 3]) -> Result<(), pglease::Error> {
    let terms: Vec<(i64, i32, i64)> = sqlx::query_as(
        "SELECT token, replica, count(*) FROM pglease_example_replicas \
          GROUP BY token, replica ORDER BY min(id)",
    )
    .fetch_all(admin.pool())
    .await?;
    let tokens: Vec<i64> =
        sqlx::query_scalar("SELECT token FROM pglease_example_replicas ORDER BY id")
            .fetch_all(admin.pool())
            .await?;
    println!("           fenced writes by term (token, replica, writes): {terms:?}");
    println!(
        "           no term wrote after a later one began: {}",
        tokens.windows(2).all(|w| w[0] <= w[1])
    );
    let [first, second, third] = leaders;
    println!("           leaders in turn: replica-{first}, replica-{second}, replica-{third}");
    Ok(())
}
