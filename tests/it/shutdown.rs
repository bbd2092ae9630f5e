//! Nothing held at exit: `shutdown()` waits for the background releases of
//! leases dropped before it, and a service stopped with SIGTERM through
//! `pglease::shutdown_signal()` hands its lease over in milliseconds, not a
//! TTL.

use std::time::Duration;

use crate::common::TestDb;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pglease::AcquireOptions;
use pglease::LeaseManager;

const BOUND: Duration = Duration::from_secs(30);
/// Far longer than the tests: a lease left held would still be held.
const TTL: Duration = Duration::from_secs(600);

/// Runs `service` on a runtime of its own, on a thread of its own: when it
/// returns, the runtime ends with every task it had not run, as when a
/// service's `main` returns.
fn on_own_runtime<F>(service: F) -> std::thread::JoinHandle<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(service);
    })
}

/// A service's last steps on a runtime of its own, as in a `main` that
/// returns right after `shutdown()`: the runtime, and every task still on
/// it, is gone afterwards.
async fn a_lease_dropped_before_shutdown_is_released_before_it_returns() {
    let db = TestDb::new().await;
    let pool_options = db.options();
    let service = on_own_runtime(async move {
        let m = LeaseManager::connect_with(pool_options, BOUND)
            .await
            .expect("connect");
        let held = m
            .hold("job", AcquireOptions::ttl(TTL).holder("svc"))
            .await
            .expect("hold");
        // As when the work future that held it is dropped.
        drop(held);
        m.shutdown().await.expect("shutdown");
    });
    service.join().expect("the service thread");

    let status = db.manager().inspect("job").await.expect("inspect");
    assert!(!status.held, "still held for {:?}", status.remaining);
}

/// A service in a process of its own (this test binary again, with only
/// this otherwise ignored test): the README's leader pattern, holding a lease
/// with a ten-minute TTL until SIGTERM or SIGINT.
async fn service_process() {
    let Ok(url) = std::env::var("PGLEASE_SERVICE_URL") else {
        return;
    };
    let stop = pglease::shutdown_signal().expect("install the signal handlers");
    let leases = LeaseManager::connect(&url).await.expect("connect");
    let work = leases.with_lease(
        "job",
        AcquireOptions::ttl(TTL).holder("svc"),
        async |held| {
            println!("ready {}", held.token());
            std::future::pending::<()>().await;
            Ok::<(), pglease::Error>(())
        },
    );
    tokio::select! {
        outcome = work => panic!("the work ended: {outcome:?}"),
        () = stop => {}
    }
    leases.shutdown().await.expect("shutdown");
    println!("stopped");
}

async fn a_service_stopped_by_sigterm_hands_its_lease_over_at_once() {
    let db = TestDb::new().await;
    let mut child = crate::common::child_test("shutdown::service_process")
        .env("PGLEASE_SERVICE_URL", db.url())
        .spawn()
        .expect("start the service");
    let lines = crate::common::stdout_lines(&mut child);
    let ready = tokio::task::spawn_blocking(move || {
        loop {
            match lines.recv_timeout(BOUND) {
                Ok(line) if line.contains("ready ") => return Some((line, lines)),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    })
    .await
    .expect("reader");
    let Some((_, lines)) = ready else {
        let _ = child.kill();
        panic!("the service did not start");
    };

    // A second instance waits for the lease (its TTL is ten minutes).
    let m = db.manager();
    let waiter = {
        let m = m.clone();
        tokio::spawn(async move {
            m.acquire("job", AcquireOptions::ttl(TTL).holder("B").wait(BOUND))
                .await
        })
    };
    crate::common::poll_until("the waiter to wait", BOUND, || async {
        m.stats().waiting == 1 && m.stats().acquire_attempts >= 1
    })
    .await;
    let signalled = tokio::time::Instant::now();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let b = waiter
        .await
        .expect("the waiter's task")
        .expect("B gets the lease well before its TTL");
    let handover = signalled.elapsed();
    println!("handed over {} ms after SIGTERM", handover.as_millis());

    let status = tokio::task::spawn_blocking(move || {
        let stopped = lines
            .recv_timeout(BOUND)
            .is_ok_and(|line| line.contains("stopped"));
        (stopped, child.wait())
    })
    .await
    .expect("reader");
    assert!(status.0, "the service did not finish its shutdown");
    assert!(
        status.1.expect("wait").success(),
        "the service exited with an error"
    );
    m.release(&crate::common::fence("job", b.token()))
        .await
        .expect("release");
}

/// `shutdown()` called while an acquisition is still in the database (the
/// work that asked for it was dropped) waits for it: what it acquires for
/// nobody is released before `shutdown()` returns, and the runtime may end
/// right after.
async fn shutdown_waits_for_an_acquisition_still_in_the_database() {
    let db = TestDb::new().await;
    let (_, blocker) = db.hold_up(&db.manager(), "job").await;
    let options = db.options().application_name("stopping");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (shutting_down, shutting) = tokio::sync::oneshot::channel::<()>();
    let service = on_own_runtime(async move {
        let m = LeaseManager::connect_with(options, BOUND)
            .await
            .expect("connect");
        tokio::select! {
            held = m.hold("job", AcquireOptions::ttl(TTL).holder("svc").wait(BOUND)) => panic!("acquired too early: {held:?}"),
            _ = stopped => {}
        }
        let _ = shutting_down.send(());
        m.shutdown().await.expect("shutdown");
    });
    db.until_acquiring(Some("stopping")).await;
    stop.send(()).expect("stop the service");
    shutting.await.expect("the service shuts down");
    // The attempt still in the database now goes through.
    blocker.rollback().await.expect("X gives up");
    tokio::task::spawn_blocking(move || service.join())
        .await
        .expect("join")
        .expect("the service thread");

    let status = db.manager().inspect("job").await.expect("inspect");
    assert_eq!(status.holder.as_deref(), None, "{status:?}");
    assert!(!status.held, "still held for {:?}", status.remaining);
}

pglease_formations::tests![
    a_lease_dropped_before_shutdown_is_released_before_it_returns,
    service_process ignored,
    a_service_stopped_by_sigterm_hands_its_lease_over_at_once,
    shutdown_waits_for_an_acquisition_still_in_the_database,
];
