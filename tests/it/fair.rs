//! First come, first served (`AcquireOptions::fair`, SQL `pglease.enqueue`
//! and acquisitions with a ticket): waiters are served in the order they
//! joined the line, nobody without a place overtakes them, a waiter whose
//! session is gone is skipped at once and a frozen one after its place's
//! TTL, the line is bounded and reports positions, a set waits in line
//! like a single lease (also on a name made fair), and only the role that joined acts with a ticket.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, Row};

use pglease::{AcquireOptions, Error, LeaseManager};

use crate::common::{TestDb, sqlstate_of};

const TTL: Duration = Duration::from_secs(30);

/// Waits until `n` acquirers wait in line for `name`.
async fn until_in_line(m: &LeaseManager, name: &str, n: usize) {
    pglease::testing::poll_until(&format!("{n} in line for {name}"), TTL, || async {
        m.line(name).await.expect("read the line").len() == n
    })
    .await;
}

/// Waits until a `pglease.enqueue` of `db` waits for a lock.
async fn until_join_waits(db: &TestDb, what: &str) {
    pglease::testing::poll_until(what, TTL, || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
              AND wait_event_type = 'Lock' AND query LIKE '%pglease.enqueue%')",
        )
        .fetch_one(db.pool())
        .await
        .expect("read pg_stat_activity")
    })
    .await;
}

/// `pglease.enqueue` on `conn`: (ticket, position, waiting).
async fn enqueue(
    conn: &mut PgConnection,
    names: &[&str],
    holder: &str,
    ttl: &str,
    max: Option<i32>,
) -> (Option<i64>, Option<i32>, i32) {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let row = sqlx::query(
        "SELECT ticket, position, waiting FROM pglease.enqueue($1, $2, $3::interval, $4)",
    )
    .bind(&names)
    .bind(holder)
    .bind(ttl)
    .bind(max)
    .fetch_one(conn)
    .await
    .expect("enqueue answers");
    (row.get("ticket"), row.get("position"), row.get("waiting"))
}

/// Four fair waiters, each joining once the one before is in line, are
/// served in that order when the holder lets go; meanwhile an acquisition
/// without a place is refused (held, then in line), and every token is
/// larger than the one before.
async fn waiters_are_served_in_the_order_they_joined() {
    let db = TestDb::new().await;
    let m = db.manager();
    let first = m
        .acquire("q", AcquireOptions::ttl(TTL).holder("H"))
        .await
        .expect("H acquires");
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..4 {
        let (m2, served) = (m.clone(), Arc::clone(&served));
        waiters.push(tokio::spawn(async move {
            let how = AcquireOptions::ttl(TTL)
                .holder(format!("W{i}"))
                .wait(TTL)
                .fair(true);
            let lease = m2.acquire("q", how).await.expect("a fair waiter acquires");
            served.lock().expect("lock").push((i, lease.token().get()));
            m2.release(&lease).await.expect("release");
        }));
        until_in_line(&m, "q", i + 1).await;
    }
    let line = m.line("q").await.expect("line");
    let holders: Vec<(&str, u32)> = line
        .iter()
        .map(|p| (p.holder.as_str(), p.position))
        .collect();
    assert_eq!(holders, [("W0", 1), ("W1", 2), ("W2", 3), ("W3", 4)]);
    // No overtaking: a plain acquisition is refused, held or not.
    match m.acquire("q", AcquireOptions::ttl(TTL).holder("P")).await {
        Err(Error::Held { .. }) => {}
        other => panic!("P acquired past the line: {other:?}"),
    }
    m.release(&first).await.expect("H releases");
    for waiter in waiters {
        tokio::time::timeout(TTL, waiter)
            .await
            .expect("the waiters are served within the TTL")
            .expect("a waiter panicked");
    }
    let served = served.lock().expect("lock").clone();
    println!("served (waiter, token): {served:?}");
    let order: Vec<usize> = served.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, [0, 1, 2, 3], "served out of turn");
    assert!(served.windows(2).all(|w| w[0].1 < w[1].1));
    assert!(m.line("q").await.expect("line").is_empty());
}

/// The first in line joined on a connection that then closed (its process
/// died): the next waiter is served as soon as the holder releases, not
/// after the dead waiter's place expires (its TTL is 10 min). A waiter
/// that is alive but never tries again (frozen) holds the line up for its
/// place's TTL (1 s here), then the lease goes to the next. Safety: each
/// token is new; liveness: both bounds are measured.
async fn a_dead_waiter_is_skipped_at_once_and_a_frozen_one_after_its_ttl() {
    let db = TestDb::new().await;
    let m = db.manager();
    let held = m
        .acquire("d", AcquireOptions::ttl(TTL).holder("H"))
        .await
        .expect("H acquires");
    let mut dead = db.connect().await;
    let (ticket, position, _) = enqueue(&mut dead, &["d"], "dead", "10 min", None).await;
    assert_eq!((ticket.is_some(), position), (true, Some(1)));
    dead.close()
        .await
        .expect("the dead waiter's connection closes");
    let m2 = m.clone();
    let next = tokio::spawn(async move {
        let how = AcquireOptions::ttl(TTL).holder("next").wait(TTL).fair(true);
        m2.acquire("d", how).await
    });
    until_in_line(&m, "d", 1).await;
    let released = Instant::now();
    m.release(&held).await.expect("H releases");
    let lease = tokio::time::timeout(TTL, next)
        .await
        .expect("bounded")
        .expect("join")
        .expect("the next waiter acquires");
    let took = released.elapsed();
    println!(
        "dead head of the line: next served {} ms after the release",
        took.as_millis()
    );
    assert!(lease.token() > held.token());
    assert!(
        took < Duration::from_secs(5),
        "held up by a dead waiter: {took:?}"
    );
    m.release(&lease).await.expect("release");

    // Frozen: alive, in line, never tries again.
    let mut frozen = db.connect().await;
    let (ticket, _, _) = enqueue(&mut frozen, &["d"], "frozen", "1 s", None).await;
    assert!(ticket.is_some());
    let joined = Instant::now();
    match m.acquire("d", AcquireOptions::ttl(TTL).holder("P")).await {
        Err(Error::InLine { name, ahead: 1 }) => assert_eq!(name, "d"),
        other => panic!("the free lease was taken past a live place: {other:?}"),
    }
    let how = AcquireOptions::ttl(TTL).holder("P").wait(TTL).fair(true);
    let lease = m
        .acquire("d", how)
        .await
        .expect("P acquires after the place expires");
    let waited = joined.elapsed();
    println!(
        "frozen head of the line (place TTL 1 s): next served {} ms after it joined",
        waited.as_millis()
    );
    assert!(
        waited >= Duration::from_secs(1),
        "served before the frozen place ended"
    );
    assert!(lease.token() > held.token());
    drop(frozen);
}

/// The line's length is bounded (SQL: a NULL ticket; library:
/// `Error::LineFull`), positions are reported, and `dequeue` leaves it.
async fn the_line_is_bounded_and_reports_positions() {
    let db = TestDb::new().await;
    let m = db.manager();
    let held = m
        .acquire("b", AcquireOptions::ttl(TTL).holder("H"))
        .await
        .expect("H acquires");
    let mut c = db.connect().await;
    let (t1, p1, w1) = enqueue(&mut c, &["b"], "one", "1 min", Some(2)).await;
    let (t2, p2, w2) = enqueue(&mut c, &["b"], "two", "1 min", Some(2)).await;
    assert_eq!((p1, w1, p2, w2), (Some(1), 1, Some(2), 2));
    let (t3, p3, w3) = enqueue(&mut c, &["b"], "three", "1 min", Some(2)).await;
    assert_eq!((t3, p3, w3), (None, None, 2), "joined a full line");
    let how = AcquireOptions::ttl(TTL)
        .holder("four")
        .wait(TTL)
        .fair(true)
        .max_waiting(2);
    match m.acquire("b", how).await {
        Err(Error::LineFull { name, waiting: 2 }) => assert_eq!(name, "b"),
        other => panic!("joined a full line: {other:?}"),
    }
    let left: i32 = sqlx::query_scalar("SELECT pglease.dequeue($1)")
        .bind(t1)
        .fetch_one(&mut c)
        .await
        .expect("dequeue");
    assert_eq!(left, 1);
    let line = m.line("b").await.expect("line");
    assert_eq!(line.len(), 1);
    assert_eq!(
        (line[0].ticket, line[0].position),
        (t2.expect("a ticket"), 1)
    );
    // Bad input: 22023 before anything.
    for sql in [
        "SELECT pglease.enqueue('{b}', 'x', '1 min', 0)",
        "SELECT pglease.enqueue('{b}', 'x', '1 min', 1001)",
        "SELECT pglease.enqueue('{}', 'x', '1 min')",
        "SELECT pglease.enqueue('{b,b}', 'x', '1 min')",
        "SELECT pglease.dequeue(NULL)",
    ] {
        assert_eq!(
            sqlstate_of(&mut c, sql).await.as_deref(),
            Some("22023"),
            "{sql}"
        );
    }
    // A ticket that has no place: LE003.
    assert_eq!(
        sqlstate_of(
            &mut c,
            "SELECT * FROM pglease.acquire('b', 'x', '1 min', false, 999999)"
        )
        .await
        .as_deref(),
        Some("LE003")
    );
    match m
        .acquire("b", AcquireOptions::ttl(TTL).fair(true).limit(2))
        .await
    {
        Err(Error::InvalidInput {
            argument: "fair", ..
        }) => {}
        other => panic!("a fair counted lease: {other:?}"),
    }
    m.release(&held).await.expect("release");
}

/// A set joins every line with one ticket: a set that joined first is
/// served before a single waiter that joined after it, and sets over
/// overlapping names served fairly never deadlock.
async fn a_set_waits_in_line_like_a_single_lease() {
    let db = TestDb::new().await;
    let m = db.manager();
    let held = m
        .acquire_all(&["x", "y"], AcquireOptions::ttl(TTL).holder("H"))
        .await
        .expect("H takes the set");
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (who, names) in [
        ("S1", vec!["y", "x"]),
        ("W", vec!["x"]),
        ("S2", vec!["x", "y"]),
    ] {
        let (m2, served) = (m.clone(), Arc::clone(&served));
        let n = m.line("x").await.expect("line").len();
        tasks.push(tokio::spawn(async move {
            let how = AcquireOptions::ttl(TTL).holder(who).wait(TTL).fair(true);
            let leases = m2.acquire_all(&names, how).await.expect("served");
            served.lock().expect("lock").push(who);
            for lease in &leases {
                m2.release(lease).await.expect("release");
            }
        }));
        until_in_line(&m, "x", n + 1).await;
    }
    for lease in &held {
        m.release(lease).await.expect("H releases");
    }
    for task in tasks {
        tokio::time::timeout(TTL, task)
            .await
            .expect("served within the TTL")
            .expect("a waiter panicked");
    }
    assert_eq!(*served.lock().expect("lock"), ["S1", "W", "S2"]);
}

/// A set refused on a name made fair joins the lines of all its names,
/// as a single plain waiter does: it is served after the waiter that
/// joined before it, and before one that joined after it.
async fn a_set_on_a_name_made_fair_waits_in_its_line() {
    let db = TestDb::new().await;
    let m = db.manager();
    m.admin()
        .set_fair("sf", true)
        .await
        .expect("an administrator makes sf fair");
    let h = m
        .acquire("sf", AcquireOptions::ttl(TTL).holder("H"))
        .await
        .expect("H acquires");
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (who, names) in [
        ("P", vec!["sf"]),
        ("S", vec!["sf", "sg"]),
        ("Q", vec!["sf"]),
    ] {
        let (m2, served) = (m.clone(), Arc::clone(&served));
        let n = m.line("sf").await.expect("line").len();
        waiters.push(tokio::spawn(async move {
            // No `fair`: only the name asks for the line.
            let how = AcquireOptions::ttl(TTL).holder(who).wait(TTL);
            let leases = m2.acquire_all(&names, how).await.expect("served");
            served.lock().expect("lock").push(who);
            for lease in &leases {
                m2.release(lease).await.expect("release");
            }
        }));
        until_in_line(&m, "sf", n + 1).await;
    }
    let set_in_sg: Vec<String> = m
        .line("sg")
        .await
        .expect("line")
        .into_iter()
        .map(|place| place.holder)
        .collect();
    assert_eq!(set_in_sg, ["S"], "the set holds a place on each name");
    m.release(&h).await.expect("H releases");
    for w in waiters {
        tokio::time::timeout(TTL, w)
            .await
            .expect("served within the TTL")
            .expect("a waiter panicked");
    }
    assert_eq!(*served.lock().expect("lock"), ["P", "S", "Q"]);
}

/// A waiter joining the line of a name while its first acquisition is
/// still committing: the join waits for it, the new row is marked, and
/// once that lease has expired a plain acquisition is refused (in line)
/// instead of overtaking the waiter.
async fn a_join_during_a_first_acquisition_is_not_overtaken() {
    let db = TestDb::new().await;
    let mut creator = db.connect().await;
    let mut tx = creator.begin().await.expect("begin");
    let token: Option<i64> =
        sqlx::query_scalar("SELECT token FROM pglease.acquire('new', 'A', '1 s')")
            .fetch_one(&mut *tx)
            .await
            .expect("A acquires, uncommitted");
    assert!(token.is_some());
    let mut waiter = db.connect().await;
    let joining = tokio::spawn(async move {
        let place = enqueue(&mut waiter, &["new"], "W", "1 min", None).await;
        (place, waiter)
    });
    until_join_waits(&db, "the join to wait for the creator").await;
    tx.commit().await.expect("A commits");
    let ((ticket, _, _), _waiter) = joining.await.expect("join");
    assert!(ticket.is_some());
    let m = db.manager();
    let how = AcquireOptions::ttl(TTL)
        .holder("P")
        .wait(Duration::from_secs(3));
    match m.acquire("new", how).await {
        Err(Error::InLine { ahead: 1, .. }) => {}
        other => panic!("P overtook the waiter: {other:?}"),
    }
}

/// Only the role that joined acts with its ticket: another role's attempt
/// with it, or its dequeue, is refused with 42501 and the place stays.
async fn only_the_role_that_joined_acts_with_its_ticket() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["app1", "app2"], &[]).await;
    let mut c1 = db.connect_as(&roles[0]).await;
    let mut c2 = db.connect_as(&roles[1]).await;
    let held = db
        .manager()
        .acquire("r", AcquireOptions::ttl(TTL).holder("H"))
        .await
        .expect("H acquires");
    let (ticket, _, _) = enqueue(&mut c1, &["r"], "app1", "1 min", None).await;
    let ticket = ticket.expect("a ticket");
    for sql in [
        format!("SELECT * FROM pglease.acquire('r', 'app2', '1 min', false, {ticket})"),
        format!("SELECT pglease.dequeue({ticket})"),
        format!("SELECT * FROM pglease.acquire_all('{{r}}', 'app2', '1 min', {ticket})"),
    ] {
        assert_eq!(
            sqlstate_of(&mut c2, &sql).await.as_deref(),
            Some("42501"),
            "{sql}"
        );
    }
    // The view is not granted to applications by default.
    assert_eq!(
        sqlstate_of(&mut c2, "SELECT * FROM pglease.line")
            .await
            .as_deref(),
        Some("42501")
    );
    let line = db.manager().line("r").await.expect("line");
    assert_eq!(line.len(), 1, "a refused role changed the line");
    db.manager().release(&held).await.expect("release");
}

/// Per name: once an administrator has made a name fair
/// (`Admin::set_fair`), plain waiters (no `fair`) join its line
/// and are served in the order they joined; only administrators may set
/// it (42501, `NotPermitted`); undone, a plain waiter waits outside the
/// line again.
async fn a_name_made_fair_serves_plain_waiters_in_turn() {
    let db = TestDb::new().await;
    let m = db.manager();
    m.admin()
        .set_fair("pf", true)
        .await
        .expect("an administrator makes pf fair");
    let h = m
        .acquire("pf", AcquireOptions::ttl(TTL).holder("H"))
        .await
        .expect("H acquires");
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let (m2, served) = (m.clone(), Arc::clone(&served));
        waiters.push(tokio::spawn(async move {
            let how = AcquireOptions::ttl(TTL).holder(format!("P{i}")).wait(TTL);
            let lease = m2
                .acquire("pf", how)
                .await
                .expect("a plain waiter acquires");
            served.lock().expect("lock").push(i);
            m2.release(&lease).await.expect("release");
        }));
        until_in_line(&m, "pf", i + 1).await;
    }
    m.release(&h).await.expect("H releases");
    for w in waiters {
        w.await.expect("waiter");
    }
    assert_eq!(
        *served.lock().expect("lock"),
        [0, 1, 2],
        "served in the order they joined"
    );

    // Authority: only administrators set it.
    let roles = db.login_roles(&["app"], &[]).await;
    let app = db.manager_as(&roles[0], Default::default()).await;
    match app.admin().set_fair("pf", false).await {
        Err(Error::NotPermitted { .. }) => {}
        other => panic!("an application role set a name's fairness: {other:?}"),
    }
    let mut conn = db.connect_as(&roles[0]).await;
    assert_eq!(
        sqlstate_of(&mut conn, "SELECT pglease.set_fair('pf', false)")
            .await
            .as_deref(),
        Some("42501")
    );

    // Undone: a plain waiter waits outside the line.
    m.admin().set_fair("pf", false).await.expect("undo");
    let h = m
        .acquire("pf", AcquireOptions::ttl(TTL).holder("H"))
        .await
        .expect("H acquires again");
    let waiter = {
        let m2 = m.clone();
        tokio::spawn(async move {
            m2.acquire("pf", AcquireOptions::ttl(TTL).holder("Q").wait(TTL))
                .await
        })
    };
    pglease::testing::poll_until("Q to wait", TTL, || async { m.stats().waiting > 0 }).await;
    assert!(
        m.line("pf").await.expect("line").is_empty(),
        "Q takes no place"
    );
    m.release(&h).await.expect("release");
    waiter.await.expect("task").expect("Q acquires");
}

/// A waiter whose connection closed between two attempts (a pool closes
/// idle connections) is skipped by the others meanwhile, and takes its
/// place up again with its next attempt on another connection: it is
/// not sent to the end of the line.
async fn a_waiter_back_on_another_connection_keeps_its_place() {
    let db = TestDb::new().await;
    let m = db.manager();
    let _h = m
        .acquire("rv", AcquireOptions::ttl(TTL).holder("H"))
        .await
        .expect("H acquires");
    let mut a_first = db.connect().await;
    let mut b = db.connect().await;
    let (ta, _, _) = enqueue(&mut a_first, &["rv"], "A", "10 min", None).await;
    let (tb, _, _) = enqueue(&mut b, &["rv"], "B", "10 min", None).await;
    let (ta, tb) = (ta.expect("A's ticket"), tb.expect("B's ticket"));
    let ahead = |ticket: i64, holder: &'static str| {
        sqlx::query_scalar::<_, Option<i32>>(
            "SELECT ahead FROM pglease.acquire('rv', $1, '10 min', false, $2)",
        )
        .bind(holder)
        .bind(ticket)
    };
    a_first.close().await.expect("A's connection closes");
    pglease::testing::poll_until("A's session to end", TTL, || async {
        ahead(tb, "B")
            .fetch_one(db.pool())
            .await
            .expect("B's attempt")
            == Some(0)
    })
    .await;
    // A comes back on another connection with its ticket: first again.
    let a_again = ahead(ta, "A")
        .fetch_one(db.pool())
        .await
        .expect("A's attempt");
    assert_eq!(a_again, Some(0), "A keeps its place");
    let b_now = ahead(tb, "B").fetch_one(&mut b).await.expect("B's attempt");
    assert_eq!(b_now, Some(1), "B is behind A again");
}

/// Every refusal of a fair name says so (`fair = true`), also under
/// contention, where refusals come from the paths after the row lock
/// (30 to 40 % of them once answered NULL): 4 clients
/// acquire and release one fair name for 1.5 s through the SQL.
async fn every_refusal_of_a_fair_name_says_it_is_fair() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    sqlx::query("SELECT pglease.set_fair('f', true)")
        .execute(&mut admin)
        .await
        .expect("set_fair");
    let until = Instant::now() + Duration::from_millis(1500);
    let mut clients = Vec::new();
    for c in 0..4 {
        let mut conn = db.connect().await;
        clients.push(tokio::spawn(async move {
            let (mut refused, mut unflagged, mut taken) = (0u32, 0u32, 0u32);
            while Instant::now() < until {
                let row = sqlx::query("SELECT token, fair FROM pglease.acquire('f', $1, '30 s')")
                    .bind(format!("c{c}"))
                    .fetch_one(&mut conn)
                    .await
                    .expect("acquire answers");
                match row.get::<Option<i64>, _>("token") {
                    Some(token) => {
                        taken += 1;
                        sqlx::query("SELECT pglease.release('f', $1)")
                            .bind(token)
                            .execute(&mut conn)
                            .await
                            .expect("release");
                    }
                    None => {
                        refused += 1;
                        if row.get::<Option<bool>, _>("fair") != Some(true) {
                            unflagged += 1;
                        }
                    }
                }
            }
            (refused, unflagged, taken)
        }));
    }
    let (mut refused, mut unflagged, mut taken) = (0, 0, 0);
    for client in clients {
        let (r, u, t) = client.await.expect("a client");
        refused += r;
        unflagged += u;
        taken += t;
    }
    println!(
        "fair name under contention: {taken} acquisitions, {refused} refusals, {unflagged} without fair = true"
    );
    assert!(
        taken > 0 && refused > 0,
        "contention: {taken} taken, {refused} refused"
    );
    assert_eq!(unflagged, 0, "every refusal says fair = true");
}

/// A join held up by a transaction holding the lease's row for longer
/// than the place's TTL: its place is made once the wait is over, so it
/// lives a whole TTL after the join answers, and the answer counts it
/// (the randomized test found `waiting` NULL: the place had ended inside
/// the join that made it).
async fn a_join_held_up_past_its_ttl_gets_a_whole_place() {
    let db = TestDb::new().await;
    let m = db.manager();
    let first = m
        .acquire("held-up", AcquireOptions::ttl(TTL).holder("H"))
        .await
        .expect("H acquires");
    m.release(&first).await.expect("H releases");
    let mut locker = db.connect().await;
    let mut tx = locker.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM pglease.leases WHERE name = 'held-up' FOR UPDATE")
        .execute(&mut *tx)
        .await
        .expect("lock the row");
    let mut waiter = db.connect().await;
    let joining = tokio::spawn(async move {
        let place = enqueue(&mut waiter, &["held-up"], "W", "1 s", None).await;
        (place, waiter)
    });
    until_join_waits(&db, "the join to wait for the row").await;
    // The fault: the row stays locked for longer than the place's TTL.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tx.commit().await.expect("release the row");
    let ((ticket, position, waiting), _waiter) = joining.await.expect("join");
    let answered = Instant::now();
    let ticket = ticket.expect("a ticket");
    let line = m.line("held-up").await.expect("read the line");
    let read_after = answered.elapsed();
    println!(
        "join held up 1.5 s with a 1 s TTL: position {position:?}, waiting {waiting}, line read {read_after:?} after"
    );
    assert_eq!(
        (position, waiting),
        (Some(1), 1),
        "the join counts its own place"
    );
    if read_after < Duration::from_millis(900) {
        assert_eq!(
            line.iter().map(|p| p.ticket).collect::<Vec<_>>(),
            vec![ticket],
            "the place lives after the join"
        );
    } else {
        println!("line read too late to judge the place's life ({read_after:?})");
    }
}

pglease_formations::tests![
    every_refusal_of_a_fair_name_says_it_is_fair(4),
    waiters_are_served_in_the_order_they_joined(4),
    a_dead_waiter_is_skipped_at_once_and_a_frozen_one_after_its_ttl(2),
    the_line_is_bounded_and_reports_positions,
    a_set_waits_in_line_like_a_single_lease(4),
    a_set_on_a_name_made_fair_waits_in_its_line(4),
    only_the_role_that_joined_acts_with_its_ticket,
    a_join_during_a_first_acquisition_is_not_overtaken(2),
    a_name_made_fair_serves_plain_waiters_in_turn(2),
    a_waiter_back_on_another_connection_keeps_its_place,
    a_join_held_up_past_its_ttl_gets_a_whole_place(2),
];
