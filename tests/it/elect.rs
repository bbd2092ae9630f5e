//! Leader election: candidates on separate managers lead one at a time
//! (no two terms' fenced writes interleave), a resignation hands over to a
//! waiting candidate at once (the time is printed, not asserted), and a
//! leader whose lease is lost has its work stopped, its writes refused,
//! and campaigns again while another candidate takes over (saying so at
//! `warn`, with the reason).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::{TestDb, poll_until};
use tracing::instrument::WithSubscriber;
use pglease::elect::{Elector, Leader, Leadership};
use pglease::{AcquireOptions, Error, HeldLease, ManagerOptions};

const BOUND: Duration = Duration::from_secs(10);

/// What the library logs, formatted: on this test's thread while the
/// guard of [`Logged::capture`] lives, and in the futures given it with
/// `with_current_subscriber` (the runtime has worker threads).
#[derive(Clone, Default)]
struct Logged(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logged {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logged {
    /// Captures every event at `warn` and above until the guard drops.
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let to = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || to.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

async fn create_log(db: &TestDb) {
    sqlx::query("CREATE TABLE log (id bigserial PRIMARY KEY, token bigint NOT NULL)")
        .execute(db.pool())
        .await
        .expect("create the log table");
}

/// The leader's work: append its token to the log, fenced, until stopped.
async fn lead(held: HeldLease) {
    loop {
        let written = async {
            let mut tx = held.begin_fenced().await?;
            sqlx::query("INSERT INTO log (token) VALUES ($1)")
                .bind(held.token())
                .execute(&mut *tx)
                .await?;
            tx.commit().await
        };
        if written.await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// [`lead`], setting `stopped` when the work is dropped or ends.
async fn lead_until_dropped(held: HeldLease, stopped: Arc<AtomicBool>) {
    struct Stopped(Arc<AtomicBool>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let _stopped = Stopped(stopped);
    lead(held).await;
}

/// Electors on managers of their own (pools of their own), as separate
/// replicas would be.
async fn candidates(db: &TestDb, count: usize, ttl: Duration) -> Vec<Arc<Elector>> {
    let mut electors = Vec::new();
    for i in 0..count {
        let manager = db
            .manager_with(&format!("candidate-{i}"), ManagerOptions::default())
            .await;
        let how = AcquireOptions::ttl(ttl)
            .holder(format!("candidate-{i}"))
            .value(format!("10.0.0.{i}:8080"));
        electors.push(Arc::new(manager.elector("leader", how).expect("elector")));
    }
    electors
}

/// Waits for every `run` to return (after its elector resigned).
async fn join(runs: Vec<tokio::task::JoinHandle<pglease::Result<()>>>) {
    for run in runs {
        tokio::time::timeout(BOUND, run)
            .await
            .expect("run returns")
            .expect("run task")
            .expect("run");
    }
}

/// In commit order (ids are taken inside the fenced transactions), tokens
/// never go back: no term wrote after a later one began. Returns them.
async fn assert_terms_in_order(db: &TestDb) -> Vec<i64> {
    let tokens: Vec<i64> = sqlx::query_scalar("SELECT token FROM log ORDER BY id")
        .fetch_all(db.pool())
        .await
        .expect("read the log");
    assert!(tokens.windows(2).all(|w| w[0] <= w[1]), "{tokens:?}");
    tokens
}

fn leaders(electors: &[Arc<Elector>]) -> Vec<usize> {
    (0..electors.len())
        .filter(|&i| electors[i].is_leader())
        .collect()
}

async fn candidates_lead_one_at_a_time_and_resigning_hands_over() {
    let db = TestDb::new().await;
    create_log(&db).await;
    let electors = candidates(&db, 4, Duration::from_secs(5)).await;
    let runs: Vec<_> = electors
        .iter()
        .map(|e| {
            let e = Arc::clone(e);
            tokio::spawn(async move { e.run(async |held| lead(held).await).await })
        })
        .collect();
    let mut handovers = Vec::new();
    for round in 0..electors.len() {
        poll_until("a leader", BOUND, || async {
            leaders(&electors).len() == 1
        })
        .await;
        let leader = leaders(&electors)[0];
        // The value published with the term is the leader's.
        let status = electors[leader].term().expect("the leader's term").token();
        let read = db.manager().inspect("leader").await.expect("inspect");
        assert_eq!(read.token, Some(status));
        assert_eq!(read.value, Some(format!("10.0.0.{leader}:8080")));
        poll_until("the leader's first write", BOUND, || async {
            sqlx::query_scalar::<_, bool>("SELECT EXISTS (SELECT 1 FROM log WHERE token = $1)")
                .bind(status)
                .fetch_one(db.pool())
                .await
                .expect("read the log")
        })
        .await;
        let resigned = Instant::now();
        electors[leader].resign();
        if round + 1 < electors.len() {
            poll_until("the next leader", BOUND, || async {
                leaders(&electors).iter().any(|&i| i != leader)
            })
            .await;
            handovers.push(resigned.elapsed());
        }
    }
    join(runs).await;
    eprintln!("handover on resign: {handovers:?}");
    for elector in &electors {
        assert_eq!(elector.terms(), 1);
        assert_eq!(elector.leadership(), Leadership::Stopped);
    }
    let tokens = assert_terms_in_order(&db).await;
    let mut terms = tokens.clone();
    terms.dedup();
    assert_eq!(terms.len(), electors.len(), "{terms:?}");
}

async fn a_lost_term_stops_the_work_and_the_campaign_goes_on() {
    let logged = Logged::default();
    let _capture = logged.capture();
    let db = TestDb::new().await;
    create_log(&db).await;
    let electors = candidates(&db, 2, Duration::from_secs(1)).await;
    let stopped = Arc::new(AtomicBool::new(false));
    let first = {
        let (e, stopped) = (Arc::clone(&electors[0]), Arc::clone(&stopped));
        tokio::spawn(
            async move {
                e.run(async move |held| lead_until_dropped(held, Arc::clone(&stopped)).await)
                    .await
            }
            .with_current_subscriber(),
        )
    };
    poll_until("the first leads", BOUND, || async {
        electors[0].is_leader()
    })
    .await;
    let old = electors[0].term().expect("a term").token();
    let second = {
        let e = Arc::clone(&electors[1]);
        tokio::spawn(async move { e.run(async |held| lead(held).await).await })
    };
    poll_until("the second campaigns", BOUND, || async {
        electors[1].leadership() == Leadership::Candidate
    })
    .await;

    // Someone ends the first leader's term (an operator releasing under
    // its token): its next renewal finds the lease gone.
    let ended = Instant::now();
    let released: bool = sqlx::query_scalar("SELECT pglease.release('leader', $1)")
        .bind(old)
        .fetch_one(db.pool())
        .await
        .expect("release the first leader's term");
    assert!(released);
    poll_until("the second leads", BOUND, || async {
        electors[1].is_leader()
    })
    .await;
    poll_until("the first's work stopped", BOUND, || async {
        stopped.load(Ordering::SeqCst)
    })
    .await;
    eprintln!("takeover after the term ended: {:?}", ended.elapsed());
    // The first learns of it from its observation of the name (or at its
    // next renewal, a third of the TTL, without notifications); its
    // writes were refused meanwhile.
    poll_until("the first knows it lost", BOUND, || async {
        !electors[0].is_leader() && electors[0].leadership() == Leadership::Candidate
    })
    .await;
    eprintln!("the first knew after: {:?}", ended.elapsed());
    // ... and said so, at warn, with the token and how the term ended (its
    // renewal found the lease gone, or it observed the release first).
    let said = logged.text();
    let line = said
        .lines()
        .find(|l| l.contains("the leader's work was dropped"))
        .unwrap_or_else(|| panic!("no warning of the dropped work in: {said}"));
    assert!(line.contains("WARN") && line.contains(&format!("token={old}")), "{line}");
    assert!(
        line.contains("leadership lost") || line.contains("ended by another session"),
        "{line}"
    );
    // The old term's token fences nothing any more.
    let manager = db.manager();
    assert!(matches!(
        manager
            .begin_fenced(&crate::common::fence("leader", old))
            .await,
        Err(Error::NotHeld { .. })
    ));

    // The first is still a candidate: it leads again once the second
    // resigns.
    electors[1].resign();
    poll_until("the first leads again", BOUND, || async {
        electors[0].is_leader()
    })
    .await;
    assert_eq!(electors[0].terms(), 2);
    electors[0].resign();
    join(vec![first, second]).await;
    assert_terms_in_order(&db).await;
}

/// The leader as `elector` last observed it: (holder, value).
fn observed(elector: &Elector) -> Option<(String, Option<String>)> {
    elector
        .leader()
        .map(|Leader { holder, value, .. }| (holder, value))
}

async fn followers_see_the_leader_and_a_step_down_request_is_honoured() {
    let db = TestDb::new().await;
    create_log(&db).await;
    let electors = candidates(&db, 3, Duration::from_secs(5)).await;
    // The work leads until asked to step down, then steps down.
    let runs: Vec<_> = electors
        .iter()
        .map(|e| {
            let e = Arc::clone(e);
            tokio::spawn(async move {
                let me = Arc::clone(&e);
                e.run(async move |held| {
                    tokio::select! {
                        () = lead(held) => {}
                        _ = me.until_step_down_requested() => me.step_down(),
                    }
                })
                .await
            })
        })
        .collect();
    poll_until("a leader", BOUND, || async {
        leaders(&electors).len() == 1
    })
    .await;
    let first = leaders(&electors)[0];
    let expected = Some((
        format!("candidate-{first}"),
        Some(format!("10.0.0.{first}:8080")),
    ));
    poll_until("every candidate sees the leader", BOUND, || async {
        electors.iter().all(|e| observed(e) == expected)
    })
    .await;
    let token = electors[first].term().expect("a term").token();

    // An operator asks; the leader hears it, steps down, and another
    // candidate leads.
    let manager = db.manager();
    let asked = Instant::now();
    assert_eq!(
        manager.request_step_down("leader", "deploy").await.unwrap(),
        Some(token)
    );
    poll_until("another leader", BOUND, || async {
        leaders(&electors).iter().any(|&i| i != first)
    })
    .await;
    eprintln!("handover on a step-down request: {:?}", asked.elapsed());
    let second = leaders(&electors)[0];
    poll_until("every candidate sees the new leader", BOUND, || async {
        electors
            .iter()
            .all(|e| observed(e).is_some_and(|(holder, _)| holder == format!("candidate-{second}")))
    })
    .await;
    // The new term starts without the request.
    let status = manager.inspect("leader").await.expect("inspect");
    assert_eq!(status.step_down_requested_by, None);
    assert!(status.token > Some(token));
    // The one that stepped down is a candidate again.
    assert_eq!(electors[first].leadership(), Leadership::Candidate);
    for elector in &electors {
        elector.resign();
    }
    join(runs).await;
    assert_terms_in_order(&db).await;
}

async fn a_leader_that_ignores_a_step_down_request_keeps_its_lease() {
    let db = TestDb::new().await;
    let electors = candidates(&db, 2, Duration::from_millis(600)).await;
    let runs: Vec<_> = electors
        .iter()
        .map(|e| {
            let e = Arc::clone(e);
            tokio::spawn(async move { e.run(async |_held| {}).await })
        })
        .collect();
    poll_until("a leader", BOUND, || async {
        leaders(&electors).len() == 1
    })
    .await;
    let leader = leaders(&electors)[0];
    let token = electors[leader].term().expect("a term").token();
    let manager = db.manager();
    manager
        .request_step_down("leader", "candidate-x")
        .await
        .expect("request");
    poll_until("the leader hears the request", BOUND, || async {
        electors[leader].step_down_requested().as_deref() == Some("candidate-x")
    })
    .await;
    // Two TTLs later (renewed all along), it still leads the same term.
    let until = db.now().await + chrono::Duration::milliseconds(1200);
    db.wait_until(until).await;
    let status = manager.inspect("leader").await.expect("inspect");
    assert!(status.held);
    assert_eq!(status.token, Some(token));
    assert_eq!(
        status.step_down_requested_by.as_deref(),
        Some("candidate-x")
    );
    assert!(electors[leader].is_leader());
    for elector in &electors {
        elector.resign();
    }
    join(runs).await;
}

async fn a_campaign_without_the_schema_fails_at_once() {
    let db = TestDb::empty().await;
    let elector = db
        .manager()
        .elector("leader", AcquireOptions::ttl(Duration::from_secs(5)))
        .expect("elector");
    let ran = tokio::time::timeout(BOUND, elector.run(async |_held| {}))
        .await
        .expect("run returns instead of retrying");
    match ran {
        Err(error) => {
            assert!(matches!(error, Error::SchemaMissing(_)), "{error:?}");
            assert_eq!(error.sqlstate(), Some("3F000"), "{error}");
        }
        Ok(()) => panic!("a campaign without the schema succeeded"),
    }
    assert_eq!(elector.leadership(), Leadership::Stopped);
}

/// A preferred candidate: the leader ("candidate-0") is told, stops its
/// work and hands its term over within about a second of the preferred
/// one ("candidate-1") joining the campaign; its writes are refused from
/// the move on; when the preferred leader resigns, the first leads again.
async fn the_leader_hands_over_to_the_preferred_candidate_when_it_campaigns() {
    let db = TestDb::new().await;
    create_log(&db).await;
    let electors: Vec<Arc<Elector>> = candidates(&db, 2, Duration::from_secs(5))
        .await
        .into_iter()
        .map(|e| Arc::new(Arc::into_inner(e).expect("one owner").prefer("candidate-1")))
        .collect();
    let stopped = Arc::new(AtomicBool::new(false));
    // candidate-0's work finishes when told that the term moves.
    let first = {
        let (e, stopped) = (Arc::clone(&electors[0]), Arc::clone(&stopped));
        let me = Arc::clone(&e);
        tokio::spawn(async move {
            e.run(async move |held| {
                tokio::select! {
                    () = lead_until_dropped(held, Arc::clone(&stopped)) => {}
                    () = me.until_handover_due() => {}
                }
            })
            .await
        })
    };
    poll_until("candidate-0 to lead", BOUND, || async {
        electors[0].is_leader()
    })
    .await;
    let old = electors[0].term().expect("candidate-0's term").token();
    let joined = Instant::now();
    let second = {
        let e = Arc::clone(&electors[1]);
        tokio::spawn(async move { e.run(async |held| lead(held).await).await })
    };
    poll_until("the preferred candidate to lead", BOUND, || async {
        electors[1].is_leader()
    })
    .await;
    let took = joined.elapsed();
    eprintln!("the preferred candidate led {took:?} after it began to campaign");
    assert!(took < Duration::from_secs(5), "liveness: {took:?}");
    let new = electors[1].term().expect("the preferred term").token();
    assert!(new > old, "a new token");
    poll_until("candidate-0's work to stop", BOUND, || async {
        stopped.load(Ordering::SeqCst)
    })
    .await;
    assert!(!electors[0].is_leader());
    // Safety: candidate-0's token is refused from the move on.
    let stale = crate::common::fence("leader", old.get());
    assert!(db.manager().begin_fenced(&stale).await.is_err());
    // When the preferred leader resigns, candidate-0 (campaigning again)
    // leads.
    electors[1].resign();
    poll_until("candidate-0 to lead again", BOUND, || async {
        electors[0].is_leader()
    })
    .await;
    electors[0].resign();
    join(vec![first, second]).await;
    assert_terms_in_order(&db).await;
    let events: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT detail FROM pglease.history WHERE name = 'leader' AND event = 'acquired' \
          ORDER BY id",
    )
    .fetch_all(db.pool())
    .await
    .expect("history");
    assert!(
        events.contains(&Some("handed over by candidate-0".to_owned())),
        "{events:?}"
    );
}

pglease_formations::tests![
    candidates_lead_one_at_a_time_and_resigning_hands_over(4),
    a_lost_term_stops_the_work_and_the_campaign_goes_on(4),
    followers_see_the_leader_and_a_step_down_request_is_honoured(4),
    a_leader_that_ignores_a_step_down_request_keeps_its_lease(4),
    a_campaign_without_the_schema_fails_at_once,
    the_leader_hands_over_to_the_preferred_candidate_when_it_campaigns(4),
];
