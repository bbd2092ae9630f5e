//! Handover to a named successor (`LeaseManager::hand_over`,
//! `HeldLease::hand_over`, SQL `pglease.hand_over`): a successor waiting in
//! line gets the lease at once with a new token, the old holder's token is
//! refused from the move on and its fenced transaction still open is
//! ended (its commit fails), a successor that does not wait means a
//! release, the successor's role acts under the new term, and only the
//! holder's role hands over.

use std::time::{Duration, Instant};

use sqlx::Row;

use pglease::{AcquireOptions, Error, LeaseManager};

use crate::common::{TestDb, create_data_table, data_value, fenced_write, sqlstate_of};

const TTL: Duration = Duration::from_secs(30);

/// Waits until `holder` waits in line for `name`.
async fn until_waiting(m: &LeaseManager, name: &str, holder: &str) {
    pglease::testing::poll_until(&format!("{holder} in line for {name}"), TTL, || async {
        m.line(name)
            .await
            .expect("read the line")
            .iter()
            .any(|p| p.holder == holder)
    })
    .await;
}

/// A holds the lease and has a fenced write open; B waits in line. A
/// hands over to B: B's acquisition returns at once with the new token,
/// A's open transaction cannot commit (its session was ended), A's token
/// is refused for writes and renewal, B writes, and the history names
/// both.
async fn a_waiting_successor_gets_the_lease_at_once_and_the_old_holder_is_fenced() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let a = m
        .acquire("deploy", AcquireOptions::ttl(TTL).holder("A"))
        .await
        .expect("A acquires");
    let successor = {
        let m = m.clone();
        tokio::spawn(async move {
            let how = AcquireOptions::ttl(TTL).holder("B").fair(true).wait(TTL);
            let lease = m.acquire("deploy", how).await.expect("B gets the lease");
            (lease, Instant::now())
        })
    };
    until_waiting(&m, "deploy", "B").await;
    // A's write in flight: checked, not committed.
    let mut in_flight = db.connect().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT pglease.assert_held('deploy', {}); \
         UPDATE data SET value = 'A, late' WHERE id = 1",
        a.token()
    )))
    .execute(&mut in_flight)
    .await
    .expect("A's fenced write, open");

    let handed = Instant::now();
    let token = m
        .hand_over(&a, "B", TTL, pglease::WithoutSuccessor::Release)
        .await
        .expect("the handover")
        .expect("B waited: handed over, not released");
    let (b, served) = successor.await.expect("the successor task");
    let took = served.duration_since(handed);
    println!("successor served {took:?} after the handover began");
    assert!(took < Duration::from_secs(2), "liveness: {took:?}");
    assert_eq!(b.token(), token, "B's acquisition returns the handed term");
    assert!(token > a.token(), "a new token");
    assert_eq!(b.holder(), "B");
    // The same TTL: the handed term lacks only the milliseconds since the
    // handover, counted off B's local deadline, so B's acquisition
    // returned without a confirming renewal (a round trip).
    let renewals = m.inspect("deploy").await.expect("inspect").renewals;
    assert_eq!(renewals, 0, "no confirming renewal of B's term");

    // Safety: A's open transaction cannot commit; A's token is refused.
    assert!(
        sqlx::raw_sql("COMMIT")
            .execute(&mut in_flight)
            .await
            .is_err(),
        "A's fenced transaction was ended"
    );
    assert_eq!(
        data_value(&db).await,
        "initial",
        "A's in-flight write never lands"
    );
    assert!(
        fenced_write(&m, "deploy", a.token().get(), "A, after")
            .await
            .is_err()
    );
    assert!(m.renew(&a, TTL).await.is_err(), "A's renewal is refused");
    fenced_write(&m, "deploy", b.token().get(), "B")
        .await
        .expect("B writes under the new token");
    assert_eq!(data_value(&db).await, "B");

    let details: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT event::text, holder, detail FROM pglease.history \
          WHERE name = 'deploy' ORDER BY id",
    )
    .fetch_all(db.pool())
    .await
    .expect("history");
    assert!(
        details.contains(&(
            "released".into(),
            "A".into(),
            Some("handed over to B".into())
        )) && details.contains(&(
            "acquired".into(),
            "B".into(),
            Some("handed over by A".into())
        )),
        "{details:?}"
    );
    assert!(
        m.line("deploy").await.expect("line").is_empty(),
        "B's place ended"
    );
}

/// A successor that does not wait in line: the lease is released instead
/// (the handover answers `None`), and anyone acquires it.
async fn a_handover_to_a_successor_not_waiting_releases() {
    let db = TestDb::new().await;
    let m = db.manager();
    let held = m
        .hold("batch", AcquireOptions::ttl(TTL).holder("A"))
        .await
        .expect("A holds");
    let old = held.token();
    assert_eq!(held.hand_over("C", TTL).await.expect("the handover"), None);
    let status = m.inspect("batch").await.expect("inspect");
    assert!(
        !status.held && status.holder.is_none(),
        "released: {status:?}"
    );
    let next = m
        .acquire("batch", AcquireOptions::ttl(TTL).holder("D"))
        .await
        .expect("anyone acquires it");
    assert!(next.token() > old);
}

/// `hand_over` with `WithoutSuccessor::Keep` to a successor that does not
/// wait (a mistyped name): `None`, and nothing changed: the lease is still
/// held under its token, the holder's fenced transaction left open commits
/// its write, and no history row is added. Then `hand_over` with
/// `WithoutSuccessor::Release` releases.
async fn a_handover_or_keep_to_a_successor_not_waiting_changes_nothing() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let a = m
        .acquire("batch", AcquireOptions::ttl(TTL).holder("A"))
        .await
        .expect("A acquires");
    let history = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pglease.history")
            .fetch_one(db.pool())
            .await
            .expect("count the history")
    };
    let rows = history().await;
    let mut in_flight = db.connect().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT pglease.assert_held('batch', {}); \
         UPDATE data SET value = 'A, open' WHERE id = 1",
        a.token()
    )))
    .execute(&mut in_flight)
    .await
    .expect("A's fenced write, open");
    assert_eq!(
        m.hand_over(&a, "typo", TTL, pglease::WithoutSuccessor::Keep)
            .await
            .expect("the call"),
        None,
        "nobody named typo waits"
    );
    sqlx::raw_sql("COMMIT")
        .execute(&mut in_flight)
        .await
        .expect("A's open transaction was not ended: it commits");
    assert_eq!(data_value(&db).await, "A, open");
    assert_eq!(history().await, rows, "no history row");
    let status = m.inspect("batch").await.expect("inspect");
    assert!(
        status.held && status.token == Some(a.token()),
        "kept: {status:?}"
    );
    m.renew(&a, TTL)
        .await
        .expect("still renewable under its token");
    // The other call, for contrast: released.
    assert_eq!(
        m.hand_over(&a, "typo", TTL, pglease::WithoutSuccessor::Release)
            .await
            .expect("the call"),
        None
    );
    assert!(!m.inspect("batch").await.expect("inspect").held, "released");
}

/// Authority: the successor's role holds the new term (it renews; the old
/// holder's role cannot act under the new token); another role cannot hand
/// over a lease it does not hold; a stale token is refused (LE001); bad
/// input is refused before anything is sent (library) or with 22023 (SQL).
async fn only_the_holders_role_hands_over_and_the_successors_role_holds() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["app1", "app2", "app3"], &[]).await;
    db.execute(
        &roles
            .iter()
            .map(|r| format!("GRANT SELECT ON pglease.line TO {r}"))
            .collect::<Vec<_>>(),
    )
    .await;
    let m1 = db.manager_as(&roles[0], Default::default()).await;
    let m2 = db.manager_as(&roles[1], Default::default()).await;
    let mut c3 = db.connect_as(&roles[2]).await;
    let a = m1
        .acquire("vault", AcquireOptions::ttl(TTL).holder("A"))
        .await
        .expect("app1 acquires");
    let successor = {
        let m2 = m2.clone();
        tokio::spawn(async move {
            m2.acquire(
                "vault",
                AcquireOptions::ttl(TTL).holder("B").fair(true).wait(TTL),
            )
            .await
        })
    };
    until_waiting(&m1, "vault", "B").await;
    // Another role may not hand A's lease over.
    let sql = format!(
        "SELECT pglease.hand_over('vault', {}, 'B', '1 min')",
        a.token()
    );
    assert_eq!(sqlstate_of(&mut c3, &sql).await.as_deref(), Some("42501"));
    assert_eq!(
        m1.inspect("vault").await.expect("inspect").token,
        Some(a.token())
    );

    let token = m1
        .hand_over(&a, "B", TTL, pglease::WithoutSuccessor::Release)
        .await
        .expect("app1 hands over")
        .expect("to the waiting B");
    let b = successor.await.expect("task").expect("B gets it");
    assert_eq!(b.token(), token);
    m2.renew(&b, TTL)
        .await
        .expect("the successor's role renews");
    let refused = m1.renew(&b, TTL).await;
    assert!(
        matches!(&refused, Err(Error::NotPermitted { .. })),
        "app1 may not act under app2's term: {refused:?}"
    );
    match m1
        .hand_over(&a, "B", TTL, pglease::WithoutSuccessor::Release)
        .await
    {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("a handover under a stale token: {other:?}"),
    }
    match m1
        .hand_over(&a, "", TTL, pglease::WithoutSuccessor::Release)
        .await
    {
        Err(Error::InvalidInput {
            argument: "successor",
            ..
        }) => {}
        other => panic!("an empty successor: {other:?}"),
    }
    let mut conn = db.connect().await;
    for sql in [
        "SELECT pglease.hand_over('vault', 1, '', '1 min')",
        "SELECT pglease.hand_over('vault', 1, 'B', '0 s')",
        "SELECT pglease.hand_over('vault', NULL, 'B', '1 min')",
    ] {
        assert_eq!(
            sqlstate_of(&mut conn, sql).await.as_deref(),
            Some("22023"),
            "{sql}"
        );
    }
    let row = sqlx::query("SELECT holder, token FROM pglease.leases WHERE name = 'vault'")
        .fetch_one(&mut conn)
        .await
        .expect("the row");
    assert_eq!(row.get::<String, _>("holder"), "B");
    assert_eq!(row.get::<i64, _>("token"), token.get(), "nothing changed");
}

/// A term handed over with a shorter TTL than the successor asked for
/// is confirmed by a renewal before the successor's acquisition returns:
/// the successor's local deadline is never later than the database's
/// expiry.
async fn a_short_handed_over_term_is_renewed_to_the_successors_ttl() {
    let db = TestDb::new().await;
    let m = db.manager();
    let a = m
        .acquire("relay", AcquireOptions::ttl(TTL).holder("A"))
        .await
        .expect("A acquires");
    let successor = {
        let m = m.clone();
        tokio::spawn(async move {
            m.acquire(
                "relay",
                AcquireOptions::ttl(TTL).holder("B").fair(true).wait(TTL),
            )
            .await
        })
    };
    until_waiting(&m, "relay", "B").await;
    m.hand_over(
        &a,
        "B",
        Duration::from_secs(2),
        pglease::WithoutSuccessor::Release,
    )
    .await
    .expect("the handover")
    .expect("B waited");
    let b = successor.await.expect("task").expect("B gets the lease");
    let left = m
        .inspect("relay")
        .await
        .expect("inspect")
        .remaining
        .expect("held");
    assert!(
        left > Duration::from_secs(20),
        "renewed to B's TTL: {left:?} left"
    );
    assert!(b.expires_at() - b.acquired_at() > chrono::Duration::seconds(20));
}

/// A handover that commits while the successor's attempt is running: the
/// attempt read the row before the commit, and its place is gone after
/// it. Over 150 rounds, the successor retries without pause (as a waiter
/// woken by some other release would) while the holder hands over after
/// a varying delay: every attempt either sees the old term or returns the
/// handed one; none finds its place gone (LE003, which made the waiter
/// join the line again and lose the term for a TTL). Safety: B's token is
/// the handover's, and greater than A's.
async fn a_handover_committing_during_the_successors_attempt_is_not_lost() {
    const ROUNDS: usize = 150;
    let db = TestDb::new().await;
    let mut holder = db.connect().await;
    let mut successor = db.connect().await;
    let mut caught = 0;
    for round in 0..ROUNDS {
        let a: i64 = sqlx::query_scalar("SELECT token FROM pglease.acquire('relay', 'A', '30 s')")
            .fetch_one(&mut holder)
            .await
            .expect("A acquires");
        let ticket: i64 =
            sqlx::query_scalar("SELECT ticket FROM pglease.enqueue(ARRAY['relay'], 'B', '30 s')")
                .fetch_one(&mut successor)
                .await
                .expect("B joins the line");
        let attempts = tokio::spawn(async move {
            let started = Instant::now();
            let mut tries = 0u32;
            loop {
                tries += 1;
                let got: Option<i64> = sqlx::query_scalar(
                    "SELECT token FROM pglease.acquire('relay', 'B', '30 s', false, $1)",
                )
                .bind(ticket)
                .fetch_one(&mut successor)
                .await
                .unwrap_or_else(|e| panic!("B's attempt {tries} with ticket {ticket}: {e}"));
                if let Some(token) = got {
                    return (successor, token, tries);
                }
                assert!(started.elapsed() < TTL, "B never got the handed term");
            }
        });
        // Let B's attempts run for 0 to 2 ms before the handover.
        tokio::time::sleep(Duration::from_micros((round as u64 * 137) % 2000)).await;
        let handed: Option<i64> =
            sqlx::query_scalar("SELECT pglease.hand_over('relay', $1, 'B', '30 s')")
                .bind(a)
                .fetch_one(&mut holder)
                .await
                .expect("the handover");
        let handed = handed.expect("B waits: handed over");
        let (back, b, tries) = attempts.await.expect("B's attempts");
        successor = back;
        assert_eq!(b, handed, "B's attempt returns the handed term");
        assert!(b > a, "a new token");
        if tries > 1 {
            caught += 1;
        }
        sqlx::query("SELECT pglease.release('relay', $1)")
            .bind(b)
            .execute(&mut successor)
            .await
            .expect("B releases");
    }
    println!("{caught} of {ROUNDS} handovers committed while B was retrying");
    assert!(
        caught > 0,
        "no round overlapped B's attempts: the test saw nothing"
    );
}

pglease_formations::tests![
    a_waiting_successor_gets_the_lease_at_once_and_the_old_holder_is_fenced(2),
    a_handover_to_a_successor_not_waiting_releases,
    a_handover_or_keep_to_a_successor_not_waiting_changes_nothing,
    a_short_handed_over_term_is_renewed_to_the_successors_ttl(2),
    only_the_holders_role_hands_over_and_the_successors_role_holds(2),
    a_handover_committing_during_the_successors_attempt_is_not_lost(2),
];
