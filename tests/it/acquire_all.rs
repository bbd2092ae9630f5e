//! Several leases at once through SQL (`pglease.acquire_all`), as any
//! language calls it: every lease of the set, each with its own token, or
//! none; taken in one canonical order, so that callers listing the same
//! names in opposite orders never deadlock and never get part of a set;
//! a name the caller may not use refuses the whole set; bad input is
//! refused before anything is written.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use sqlx::{PgConnection, Row};

use pglease::{AcquireOptions, Error};

use crate::common::{TestDb, sqlstate_of};

const TTL: Duration = Duration::from_secs(30);

/// One answer row: the name, and the token (`None`: not acquired).
type Answer = Vec<(String, Option<i64>, Option<String>)>;

async fn acquire_all(conn: &mut PgConnection, names: &[&str], holder: &str) -> Answer {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    sqlx::query("SELECT name, token, holder FROM pglease.acquire_all($1, $2, '30 s')")
        .bind(&names)
        .bind(holder)
        .fetch_all(conn)
        .await
        .expect("acquire_all answers")
        .into_iter()
        .map(|r| (r.get("name"), r.get("token"), r.get("holder")))
        .collect()
}

/// The schema's state but the fence sequence: a refused set may have
/// drawn tokens for the names before the one it could not take, which are
/// never issued (a sequence is not rolled back).
async fn state_but_tokens_drawn(db: &TestDb) -> String {
    let state = db.state().await;
    state
        .lines()
        .filter(|l| !l.starts_with("seq "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Who holds `name` now, by the status view.
async fn holder_of(db: &TestDb, name: &str) -> Option<String> {
    sqlx::query_scalar("SELECT holder FROM pglease.status WHERE name = $1 AND held")
        .bind(name)
        .fetch_optional(db.pool())
        .await
        .expect("read the status")
}

async fn every_lease_of_the_set_or_none() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    // X holds b.
    let x: i64 = sqlx::query_scalar("SELECT token FROM pglease.acquire('b', 'X', '30 s')")
        .fetch_one(&mut conn)
        .await
        .expect("X acquires b");
    let before = state_but_tokens_drawn(&db).await;
    // Y asks for c, b and a: refused for b, the first name it could not
    // take (a was taken first, in byte order, and undone), and nothing
    // was taken or recorded.
    let answer = acquire_all(&mut conn, &["c", "b", "a"], "Y").await;
    assert_eq!(answer, [("b".to_owned(), None, Some("X".to_owned()))]);
    assert_eq!(
        state_but_tokens_drawn(&db).await,
        before,
        "a refused set changed something"
    );
    assert_eq!(holder_of(&db, "a").await, None);
    // Once b is free, Y gets the three, in byte order, each with its own
    // token drawn after X's.
    sqlx::query("SELECT pglease.release('b', $1)")
        .bind(x)
        .execute(&mut conn)
        .await
        .expect("X releases b");
    let answer = acquire_all(&mut conn, &["c", "b", "a"], "Y").await;
    let names: Vec<&str> = answer.iter().map(|(n, ..)| n.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    let tokens: Vec<i64> = answer.iter().map(|(_, t, _)| t.expect("a token")).collect();
    // One expiry for the set, as the status view has it.
    let expiries: Vec<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "SELECT expires_at FROM pglease.status WHERE name IN ('a', 'b', 'c') ORDER BY name",
    )
    .fetch_all(&mut conn)
    .await
    .expect("read the expiries");
    assert!(expiries.windows(2).all(|w| w[0] == w[1]), "{expiries:?}");
    assert!(
        tokens[0] > x && tokens.windows(2).all(|w| w[0] < w[1]),
        "{tokens:?}"
    );
    for name in ["a", "b", "c"] {
        assert_eq!(holder_of(&db, name).await.as_deref(), Some("Y"), "{name}");
    }
    // Each is an ordinary lease: its history, its token for release.
    let acquired: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pglease.history WHERE holder = 'Y' AND event = 'acquired'",
    )
    .fetch_one(&mut conn)
    .await
    .expect("read the history");
    assert_eq!(acquired, 3);
    let released: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pglease.release(n, t)) FROM unnest($1::text[], $2::bigint[]) AS u(n, t)",
    )
    .bind(&["a", "b", "c"][..])
    .bind(&tokens)
    .fetch_one(&mut conn)
    .await
    .expect("release the set in one statement");
    assert_eq!(released, 3);
}

/// Four callers take {x, y, z}, each listing the names in its own order,
/// as fast as they can for 2 s, releasing each set they get. Safety: no
/// token is handed out twice, and a refused call leaves its caller holding
/// nothing. Liveness: sets are granted, and no call waits unboundedly (no
/// deadlock: every call answers, at most TAKEOVER_GRACE per name).
async fn opposite_orders_never_deadlock_nor_grant_part_of_a_set() {
    let db = TestDb::new().await;
    let orders: [&[&str]; 4] = [
        &["x", "y", "z"],
        &["z", "y", "x"],
        &["y", "z", "x"],
        &["x", "z", "y"],
    ];
    let mut tasks = Vec::new();
    for (i, order) in orders.into_iter().enumerate() {
        let mut conn = db.connect().await;
        tasks.push(tokio::spawn(async move {
            let holder = format!("T{i}");
            let (mut tokens, mut granted, mut refused) = (Vec::new(), 0, 0);
            let mut slowest = Duration::ZERO;
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(2) {
                let sent = Instant::now();
                let answer = acquire_all(&mut conn, order, &holder).await;
                slowest = slowest.max(sent.elapsed());
                if answer.iter().all(|(_, t, _)| t.is_some()) {
                    assert_eq!(answer.len(), 3, "{answer:?}");
                    granted += 1;
                    for (name, token, _) in &answer {
                        let released: bool = sqlx::query_scalar("SELECT pglease.release($1, $2)")
                            .bind(name)
                            .bind(token)
                            .fetch_one(&mut conn)
                            .await
                            .expect("release");
                        assert!(released, "{holder} lost {name} before releasing it");
                        tokens.push(token.expect("a token"));
                    }
                } else {
                    assert_eq!(answer.len(), 1, "{answer:?}");
                    refused += 1;
                    // The caller holds nothing after a refusal (it
                    // released every set it got).
                    let mine: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM pglease.status WHERE holder = $1 AND held",
                    )
                    .bind(&holder)
                    .fetch_one(&mut conn)
                    .await
                    .expect("read the status");
                    assert_eq!(mine, 0, "{holder} was left part of a set");
                }
            }
            (tokens, granted, refused, slowest)
        }));
    }
    let mut all = Vec::new();
    let mut report = Vec::new();
    for task in tasks {
        let (tokens, granted, refused, slowest) = task.await.expect("a caller panicked");
        report.push(format!(
            "{granted} sets granted, {refused} refused, slowest call {} ms",
            slowest.as_millis()
        ));
        all.extend(tokens);
    }
    println!("acquire_all over {{x, y, z}} in four orders for 2 s: {report:?}");
    let unique: BTreeSet<i64> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "a token was handed out twice");
    assert!(!all.is_empty(), "no set was granted in 2 s");
    for name in ["x", "y", "z"] {
        assert_eq!(holder_of(&db, name).await, None, "{name} left held");
    }
}

/// A name granted to another role refuses the whole set, before anything
/// is written; the grantee gets the same set.
async fn a_name_the_caller_may_not_use_refuses_the_set() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["app1", "app2"], &[]).await;
    let (app1, app2) = (&roles[0], &roles[1]);
    sqlx::query("SELECT pglease.grant_names('billing/', $1)")
        .bind(app1)
        .execute(db.pool())
        .await
        .expect("an administrator grants");
    let before = db.state().await;
    let mut c2 = db.connect_as(app2).await;
    // Before the names it may use, after them ("aaa" sorts before
    // "billing/"), alone: refused before anything is taken or drawn.
    for set in [
        "{open, billing/invoices}",
        "{aaa, billing/invoices}",
        "{billing/invoices}",
    ] {
        assert_eq!(
            sqlstate_of(
                &mut c2,
                &format!("SELECT * FROM pglease.acquire_all('{set}', 'app2', '30 s')")
            )
            .await
            .as_deref(),
            Some("42501"),
            "{set}"
        );
        assert_eq!(
            db.state().await,
            before,
            "{set}: a refused set changed something"
        );
    }
    let mut c1 = db.connect_as(app1).await;
    let answer = acquire_all(&mut c1, &["open", "billing/invoices"], "app1").await;
    assert!(answer.iter().all(|(_, t, _)| t.is_some()), "{answer:?}");
    // Held by the grantee: still refused to app2, not answered as held.
    let before = db.state().await;
    assert_eq!(
        sqlstate_of(
            &mut c2,
            "SELECT * FROM pglease.acquire_all('{aaa, billing/invoices}', 'app2', '30 s')"
        )
        .await
        .as_deref(),
        Some("42501")
    );
    assert_eq!(db.state().await, before, "a refused set changed something");
    // Held by app1's role: app2 cannot release them under their tokens.
    let token = answer[0].1.expect("a token");
    assert_eq!(
        sqlstate_of(
            &mut c2,
            &format!("SELECT pglease.release('{}', {token})", answer[0].0)
        )
        .await
        .as_deref(),
        Some("42501")
    );
}

async fn bad_sets_are_refused_before_anything_is_written() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let before = db.state().await;
    let too_many = format!(
        "ARRAY[{}]",
        (0..=pglease::limits::MAX_SET_NAMES)
            .map(|i| format!("'n{i}'"))
            .collect::<Vec<_>>()
            .join(",")
    );
    // A bad name that sorts after good ones is refused before they are
    // taken.
    let long_last = format!("ARRAY['a', '{}']", "z".repeat(300));
    for (set, said) in [
        ("NULL::text[]", "names must hold 1 to 100 names, got NULL"),
        ("'{}'::text[]", "names must hold 1 to 100 names, got 0"),
        (too_many.as_str(), "names must hold 1 to 100 names, got 101"),
        ("ARRAY['a', NULL]", "names must not contain NULL"),
        (
            "'{a, b, a}'::text[]",
            "names must differ, 'a' is there twice",
        ),
        ("'{a, \"\"}'::text[]", "name must not be empty"),
        (long_last.as_str(), "name is 300 bytes long"),
        (
            "ARRAY[['a', 'b'], ['c', 'd']]",
            "names must be a list (an array of one dimension), got 2 dimensions",
        ),
    ] {
        let failed = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT * FROM pglease.acquire_all({set}, 'X', '30 s')"
        )))
        .fetch_all(&mut conn)
        .await
        .expect_err(set);
        let e = failed.as_database_error().expect("a database error");
        assert_eq!(e.code().as_deref(), Some("22023"), "{set}");
        assert!(e.message().contains(said), "{set}: {}", e.message());
    }
    assert_eq!(db.state().await, before, "a refused set changed something");
}

/// The library's form: the set or the first name that could not be taken
/// (nothing taken); waiting, the set is granted once the blocker releases;
/// each lease of the set is an ordinary lease (fenced writes, release).
async fn the_library_takes_a_set_or_none_and_waits_for_the_blocker() {
    let db = TestDb::new().await;
    crate::common::create_data_table(&db).await;
    let (x, y) = (db.manager(), db.manager());
    let b = x
        .acquire("b", AcquireOptions::ttl(TTL).holder("X"))
        .await
        .expect("X acquires b");
    let before = state_but_tokens_drawn(&db).await;
    match y
        .acquire_all(&["c", "b", "a"], AcquireOptions::ttl(TTL).holder("Y"))
        .await
    {
        Err(Error::Held { name, holder, .. }) => {
            assert_eq!((name.as_str(), holder.as_str()), ("b", "X"))
        }
        other => panic!("the set while b is held: {other:?}"),
    }
    assert_eq!(
        state_but_tokens_drawn(&db).await,
        before,
        "a refused set changed something"
    );
    // Y waits for the set; X releases b once Y is waiting.
    let waiting = {
        let y = y.clone();
        tokio::spawn(async move {
            y.acquire_all(
                &["c", "b", "a"],
                AcquireOptions::ttl(TTL)
                    .holder("Y")
                    .wait(Duration::from_secs(20)),
            )
            .await
        })
    };
    pglease::testing::poll_until("Y waits for the set", Duration::from_secs(10), || async {
        // Waiting, after a first refused attempt of its own (the call
        // above made one).
        let stats = y.stats();
        stats.waiting == 1 && stats.acquire_attempts >= 2
    })
    .await;
    let released = Instant::now();
    assert!(x.release(&b).await.expect("X releases b"));
    let leases = waiting
        .await
        .expect("the waiter")
        .expect("the set, once b is free");
    println!(
        "the set granted {} ms after b's release",
        released.elapsed().as_millis()
    );
    let names: Vec<&str> = leases.iter().map(|l| l.name()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert!(
        leases
            .iter()
            .all(|l| l.holder() == "Y" && l.token() > b.token())
    );
    // Ordinary leases: b's old token is refused, the new ones write.
    assert!(matches!(
        crate::common::fenced_write(&x, "b", b.token(), "by X, stale").await,
        Err(Error::NotHeld { .. })
    ));
    for lease in &leases {
        crate::common::fenced_write(&y, lease.name(), lease.token(), lease.name())
            .await
            .expect("a fenced write under each lease of the set");
        assert!(y.release(lease).await.expect("release"));
    }
}

async fn the_library_refuses_a_bad_set_before_connecting() {
    let db = TestDb::new().await;
    let m = db.manager();
    let before = db.state().await;
    let ok = || AcquireOptions::ttl(TTL).holder("A");
    let too_many: Vec<String> = (0..=pglease::limits::MAX_SET_NAMES)
        .map(|i| format!("n{i}"))
        .collect();
    let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
    for (what, names, how, argument) in [
        ("no names", &[][..], ok(), "names"),
        ("101 names", &too_many[..], ok(), "names"),
        ("a name twice", &["a", "b", "a"][..], ok(), "names"),
        ("an empty name", &["a", ""][..], ok(), "name"),
        (
            "an empty holder",
            &["a"][..],
            AcquireOptions::ttl(TTL).holder(""),
            "holder",
        ),
        (
            "a TTL too short",
            &["a"][..],
            AcquireOptions::ttl(Duration::from_millis(1)),
            "ttl",
        ),
        ("a counted limit", &["a"][..], ok().limit(3), "limit"),
        ("a value", &["a"][..], ok().value("v"), "value"),
        (
            "session binding",
            &["a"][..],
            ok().session_bound(true),
            "session_bound",
        ),
    ] {
        match m.acquire_all(names, how).await {
            Err(Error::InvalidInput { argument: got, .. }) => {
                assert_eq!(got, argument, "{what}")
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    assert_eq!(db.state().await, before, "a refused set changed something");
    assert_eq!(m.stats().acquire_attempts, 0, "a bad set was sent");
}

/// A held set: every lease renewed past its TTL, each lost on its own (an
/// expired one is lost, the others stay held), released one by one.
async fn a_held_set_is_renewed_and_each_lease_lost_on_its_own() {
    let db = TestDb::new().await;
    let m = db.manager();
    let ttl = Duration::from_secs(1);
    let held = m
        .hold_all(&["p", "q", "r"], AcquireOptions::ttl(ttl).holder("H"))
        .await
        .expect("the set, held");
    let expiries: Vec<_> = held.iter().map(|h| h.expires_at()).collect();
    // Past every first expiry by the database clock, all are still held:
    // renewed.
    let first = *expiries.iter().max().expect("three leases");
    db.wait_until(first).await;
    for h in &held {
        assert!(!h.is_lost(), "{} lost: {:?}", h.name(), h.loss_reason());
        let status = m.inspect(h.name()).await.expect("inspect");
        assert!(
            status.held && status.expires_at.is_some_and(|e| e > first),
            "{status:?}"
        );
    }
    // One ends (expired at once, as a takeover would find it): that one is
    // lost, the others are not.
    assert!(
        pglease::testing::expire_now(db.pool(), "q")
            .await
            .expect("expire q")
    );
    tokio::time::timeout(Duration::from_secs(10), held[1].lost())
        .await
        .expect("q's loss is reported");
    assert!(!held[0].is_lost() && !held[2].is_lost());
    for h in [&held[0], &held[2]] {
        h.clone().release().await.expect("release");
    }
    assert!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pglease.status WHERE held")
            .fetch_one(db.pool())
            .await
            .expect("status")
            == 0
    );
}

/// A refused set keeps the server's timeline check (it is made before
/// the set, where the refusal does not undo it): after a crash or a
/// restore, refused sets neither move the fence again nor restart a grant
/// delay.
async fn a_refused_set_keeps_the_timeline_check() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    sqlx::query("SELECT pglease.acquire('b', 'X', '30 s')")
        .execute(&mut conn)
        .await
        .expect("X acquires b");
    // As after a crash: the unlogged check is gone.
    sqlx::query("DELETE FROM pglease._checked")
        .execute(&mut conn)
        .await
        .expect("forget the check");
    let answer = acquire_all(&mut conn, &["a", "b"], "Y").await;
    assert_eq!(answer, [("b".to_owned(), None, Some("X".to_owned()))]);
    let checked: i64 = sqlx::query_scalar("SELECT count(*) FROM pglease._checked")
        .fetch_one(&mut conn)
        .await
        .expect("read the check");
    assert_eq!(checked, 1, "the refusal undid the timeline check");
    let floor: i64 = sqlx::query_scalar("SELECT floor FROM pglease._checked")
        .fetch_one(&mut conn)
        .await
        .expect("read the floor");
    let again = acquire_all(&mut conn, &["a", "b"], "Y").await;
    assert_eq!(again.len(), 1);
    let still: i64 = sqlx::query_scalar("SELECT floor FROM pglease._checked")
        .fetch_one(&mut conn)
        .await
        .expect("read the floor");
    assert_eq!(still, floor, "a second refusal checked again");
}

pglease_formations::tests![
    a_refused_set_keeps_the_timeline_check,
    the_library_takes_a_set_or_none_and_waits_for_the_blocker,
    a_held_set_is_renewed_and_each_lease_lost_on_its_own,
    the_library_refuses_a_bad_set_before_connecting,
    every_lease_of_the_set_or_none,
    opposite_orders_never_deadlock_nor_grant_part_of_a_set(2),
    a_name_the_caller_may_not_use_refuses_the_set,
    bad_sets_are_refused_before_anything_is_written,
];
