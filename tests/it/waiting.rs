//! Waiting acquisition: woken by a release (not by the poll interval),
//! retried at expiry when the holder vanished, bounded, and cancel-safe.

use std::time::Duration;

use crate::common::{TestDb, poll_until};
use pglease::{AcquireOptions, Error, Lease, LeaseManager, ManagerOptions};

const BOUND: Duration = Duration::from_secs(30);
/// Longer than any of these tests may take: a waiter that only polled or
/// slept until expiry would still be asleep when the test looks.
const SLOW: Duration = Duration::from_secs(120);

/// Waits until `waiter` has made a failed attempt and sleeps.
async fn until_waiting(waiter: &LeaseManager) {
    poll_until("the waiter to sleep", BOUND, || async {
        let s = waiter.stats();
        s.waiting == 1 && s.acquire_attempts >= 1
    })
    .await;
}

/// B's acquisition of "job", waiting up to two minutes, on a task.
fn spawn_acquire(waiter: &LeaseManager) -> tokio::task::JoinHandle<pglease::Result<Lease>> {
    let waiter = waiter.clone();
    tokio::spawn(async move {
        waiter
            .acquire("job", AcquireOptions::ttl(SLOW).holder("B").wait(SLOW))
            .await
    })
}

/// A manager that polls at most every two minutes and whose release
/// listener is already connected: its one acquisition so far ("warm-up",
/// which had to wait) started the listener. Also returns how many attempts
/// that acquisition made.
async fn listening_waiter(db: &TestDb, app: &str) -> (LeaseManager, u64) {
    let waiter = db
        .manager_with(app, ManagerOptions::default().max_poll_interval(SLOW))
        .await;
    // The listener starts only when an acquisition has to wait: make one.
    let holder = db.manager();
    let warm_up = holder
        .acquire("warm-up", AcquireOptions::ttl(SLOW).holder("A"))
        .await
        .expect("warm-up lease");
    let waited = waiter
        .acquire(
            "warm-up",
            AcquireOptions::ttl(SLOW)
                .holder("B")
                .wait(Duration::from_millis(50)),
        )
        .await;
    assert!(
        matches!(waited, Err(pglease::Error::Held { .. })),
        "{waited:?}"
    );
    poll_until("the listener", BOUND, || async { waiter.stats().listening }).await;
    holder
        .release(&warm_up)
        .await
        .expect("release the warm-up lease");
    let attempts = waiter.stats().acquire_attempts;
    (waiter, attempts)
}

async fn a_waiter_is_woken_by_the_release_not_by_its_poll() {
    let db = TestDb::new().await;
    let holder = db.manager();
    let first = holder
        .acquire("job", AcquireOptions::ttl(SLOW).holder("A"))
        .await
        .expect("A acquires");
    // Once it listens, the waiter below makes exactly two attempts before
    // it sleeps: one, then one more once its listener watches "job" (a
    // release committed in between would have notified nobody). Attempts
    // are counted when answered.
    let (waiter, before) = listening_waiter(&db, "waiter").await;
    let waiting = spawn_acquire(&waiter);
    poll_until("the waiter to sleep", BOUND, || async {
        let s = waiter.stats();
        s.waiting == 1 && s.acquire_attempts == before + 2
    })
    .await;
    assert!(
        holder
            .release(&crate::common::fence("job", first.token()))
            .await
            .expect("release")
    );

    let second = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the waiter woke on the release")
        .expect("join")
        .expect("B acquires");
    assert_eq!(second.holder(), "B");
    assert!(second.token() > first.token());
    // Woken once, it needed one more attempt.
    assert_eq!(waiter.stats().acquire_attempts, before + 3);
    assert_eq!(waiter.stats().waiting, 0);
}

async fn a_waiter_takes_over_at_expiry_when_the_holder_vanished() {
    let db = TestDb::new().await;
    // Listening for releases, the waiter sleeps until the holder's expiry
    // (database time), then takes over: two failed attempts (before and
    // after its listener watches the name) and one that succeeds (a fourth
    // if it woke a hair early), where a poller backing off from 10 ms would
    // make about eight in the holder's second.
    let (waiter, before) = listening_waiter(&db, "expiry-waiter").await;

    // The holder acquires and disappears without releasing.
    let gone = db
        .manager()
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_secs(1)).holder("A"),
        )
        .await
        .expect("A acquires");
    let lease = tokio::time::timeout(
        BOUND,
        waiter.acquire("job", AcquireOptions::ttl(SLOW).holder("B").wait(SLOW)),
    )
    .await
    .expect("the waiter woke at the expiry")
    .expect("B acquires");
    assert!(lease.acquired_at() >= gone.expires_at());
    assert!(lease.token() > gone.token());
    let attempts = waiter.stats().acquire_attempts - before;
    assert!(
        (3..=4).contains(&attempts),
        "{attempts} attempts: the waiter did not sleep until the expiry"
    );
}

async fn a_polling_waiter_gets_the_lease_after_a_release() {
    let db = TestDb::new().await;
    let holder = db.manager();
    let first = holder
        .acquire("job", AcquireOptions::ttl(SLOW).holder("A"))
        .await
        .expect("A acquires");
    let waiter = db
        .manager_with("poller", ManagerOptions::default().notify(false))
        .await;
    let waiting = spawn_acquire(&waiter);
    until_waiting(&waiter).await;
    assert!(
        holder
            .release(&crate::common::fence("job", first.token()))
            .await
            .expect("release")
    );
    let second = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the poller found the lease free")
        .expect("join")
        .expect("B acquires");
    assert!(second.token() > first.token());
}

async fn waiting_is_bounded_by_max_wait() {
    let db = TestDb::new().await;
    db.manager()
        .acquire("job", AcquireOptions::ttl(SLOW).holder("A"))
        .await
        .expect("A acquires");
    let waiter = db.manager();
    match waiter
        .acquire(
            "job",
            AcquireOptions::ttl(SLOW)
                .holder("B")
                .wait(Duration::from_millis(300)),
        )
        .await
    {
        Err(Error::Held { holder, .. }) => assert_eq!(holder, "A"),
        other => panic!("expected Held, got {other:?}"),
    }
    let once = db.manager();
    assert!(matches!(
        once.acquire("job", AcquireOptions::ttl(SLOW).holder("B"))
            .await,
        Err(Error::Held { .. })
    ));
    assert_eq!(
        once.stats().acquire_attempts,
        1,
        "no wait means one attempt"
    );
}

/// The waiter gives up while its attempt is inside the database (held up
/// behind another acquisition that has not committed); the attempt then
/// succeeds, and what it acquired is released rather than left held.
async fn dropping_a_waiting_acquire_leaves_nothing_held() {
    let db = TestDb::new().await;
    let holder = db.manager();
    let (old, blocker) = db.hold_up(&holder, "job").await;

    let waiter = db.manager_with("dropped", ManagerOptions::default()).await;
    let waiting = spawn_acquire(&waiter);
    // B's attempt blocks.
    db.until_acquiring(Some("dropped")).await;
    waiting.abort();
    assert!(waiting.await.expect_err("aborted").is_cancelled());
    blocker.rollback().await.expect("X gives up");

    // The attempt went through after all, and was handed back.
    poll_until("the orphaned acquisition to be released", BOUND, || async {
        let status = holder.inspect("job").await.expect("inspect");
        status.token > Some(old.token()) && !status.held
    })
    .await;
}

/// An acquisition that waited in the database for longer than its TTL is
/// still a good one: it is confirmed with a renewal at once, and held (and
/// renewed) from there, not reported lost on arrival.
async fn an_acquisition_held_up_in_the_database_past_its_ttl_is_kept() {
    let db = TestDb::new().await;
    let (_, blocker) = db.hold_up(&db.manager(), "job").await;
    let b = db.manager_with("late", ManagerOptions::default()).await;
    let ttl = Duration::from_secs(1);
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move {
            b.hold("job", AcquireOptions::ttl(ttl).holder("B").wait(BOUND))
                .await
        })
    };
    db.until_acquiring(Some("late")).await;
    // Held up for longer than its TTL, on the database clock (and less
    // than the 2 s after which the attempt would give up).
    let since = db.now().await;
    db.wait_until(since + chrono::Duration::milliseconds(1200))
        .await;
    blocker.rollback().await.expect("X gives up");

    let held = waiting.await.expect("B's task").expect("B holds the lease");
    assert_eq!(b.stats().acquire_attempts, 1, "kept from its first attempt");
    assert!(!held.is_lost(), "lost on arrival: {:?}", held.loss_reason());
    assert!(!held.remaining().is_zero(), "its local deadline has passed");
    // Renewed from there on: still held a full TTL after its expiry at
    // the confirmation.
    let confirmed = held.expires_at();
    db.wait_until(confirmed + chrono::Duration::from_std(ttl).expect("ttl"))
        .await;
    assert!(!held.is_lost(), "{:?}", held.loss_reason());
    assert!(b.inspect("job").await.expect("inspect").held);
    assert!(held.release().await.expect("release"));
}

pglease_formations::tests![
    a_waiter_is_woken_by_the_release_not_by_its_poll,
    a_waiter_takes_over_at_expiry_when_the_holder_vanished,
    a_polling_waiter_gets_the_lease_after_a_release,
    waiting_is_bounded_by_max_wait,
    dropping_a_waiting_acquire_leaves_nothing_held,
    an_acquisition_held_up_in_the_database_past_its_ttl_is_kept,
];
