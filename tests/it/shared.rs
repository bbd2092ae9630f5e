//! Shared leases (`AcquireOptions::shared`, SQL `pglease.acquire_shared`
//! and `pglease.assert_shared`): shared holders hold a name together, each
//! with a token of its own, and an exclusive holder alone; a waiting
//! exclusive acquirer keeps new shared holders out; a shared holder frozen
//! inside its checked transaction is ended once its lease has, and so is
//! a stale exclusive holder's transaction before the first shared holder
//! reads; shared tokens never write; only the role that acquired acts
//! under a shared token.

use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, Row};

use pglease::{AcquireOptions, Error, NotHeldReason};

use crate::common::{TestDb, create_data_table, data_value, fenced_write, sqlstate_of};

const TTL: Duration = Duration::from_secs(30);

fn shared(holder: &str) -> AcquireOptions {
    AcquireOptions::ttl(TTL).holder(holder).shared(true)
}

/// `pglease.acquire_shared` on `conn`: the token, or `None` when refused.
async fn acquire_shared(
    conn: &mut PgConnection,
    name: &str,
    holder: &str,
    ttl: &str,
) -> Option<i64> {
    sqlx::query_scalar("SELECT token FROM pglease.acquire_shared($1, $2, $3::interval)")
        .bind(name)
        .bind(holder)
        .bind(ttl)
        .fetch_one(conn)
        .await
        .expect("acquire_shared answers")
}

/// The exclusive acquirer that keeps new shared holders of `name` out,
/// as the name's row says.
async fn writer_waiting(db: &TestDb, name: &str) -> Option<String> {
    sqlx::query_scalar(
        "SELECT writer_waiting FROM pglease.leases \
          WHERE name = $1 AND writer_waits_until > clock_timestamp()",
    )
    .bind(name)
    .fetch_optional(db.pool())
    .await
    .expect("read the lease row")
    .flatten()
}

/// Two shared holders hold the name at once with tokens of their own; an
/// exclusive acquisition is refused while either is valid, and gets it at
/// once when both have released; then a shared acquisition is refused
/// while the exclusive holder holds it. Checked transactions under a
/// shared token open, and a write under it is refused (reason: shared).
async fn shared_holders_hold_together_and_exclude_an_exclusive_one() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let r1 = m
        .acquire("doc", shared("R1"))
        .await
        .expect("R1 acquires shared");
    let r2 = m
        .acquire("doc", shared("R2"))
        .await
        .expect("R2 acquires shared");
    assert!(r1.is_shared() && r2.is_shared());
    assert!(
        r2.token() > r1.token(),
        "each shared holder has its own, later token"
    );

    match m.acquire("doc", AcquireOptions::ttl(TTL).holder("W")).await {
        Err(Error::Held { holder, .. }) => assert!(holder == "R1" || holder == "R2", "{holder}"),
        other => panic!("an exclusive acquisition beside shared holders: {other:?}"),
    }
    // A shared holder's checked transaction opens; it reads, never writes.
    let mut tx = m.begin_fenced(&r1).await.expect("R1's checked transaction");
    let value: String = sqlx::query_scalar("SELECT value FROM data WHERE id = 1")
        .fetch_one(&mut *tx)
        .await
        .expect("read");
    assert_eq!(value, "initial");
    tx.commit().await.expect("commit a read");
    match fenced_write(&m, "doc", r2.token().get(), "by a reader").await {
        Err(Error::NotHeld {
            reason: NotHeldReason::Shared,
            ..
        }) => {}
        other => panic!("a write under a shared token: {other:?}"),
    }
    assert_eq!(
        data_value(&db).await,
        "initial",
        "no write under a shared token"
    );

    m.release(&r1).await.expect("R1 releases");
    assert!(
        m.acquire("doc", AcquireOptions::ttl(TTL).holder("W"))
            .await
            .is_err(),
        "R2 still holds it shared"
    );
    m.release(&r2).await.expect("R2 releases");
    let w = m
        .acquire("doc", AcquireOptions::ttl(TTL).holder("W"))
        .await
        .expect("W acquires once no shared holder is left");
    assert!(w.token() > r2.token());
    match m.acquire("doc", shared("R3")).await {
        Err(Error::Held { holder, .. }) => assert_eq!(holder, "W"),
        other => panic!("a shared acquisition beside an exclusive holder: {other:?}"),
    }
    fenced_write(&m, "doc", w.token().get(), "by the writer")
        .await
        .expect("the exclusive holder writes");
    m.release(&w).await.expect("W releases");
    let r3 = m
        .acquire("doc", shared("R3"))
        .await
        .expect("R3 acquires shared");
    assert!(r3.token() > w.token(), "no token is handed out twice");

    // History and the view of shared holders.
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT event::text, holder, detail FROM pglease.history WHERE name = 'doc' ORDER BY id",
    )
    .fetch_all(db.pool())
    .await
    .expect("history");
    let shared_rows = rows
        .iter()
        .filter(|(_, _, d)| d.as_deref() == Some("shared"))
        .count();
    assert_eq!(
        shared_rows, 5,
        "R1, R2, R3 acquired, R1 and R2 released: {rows:?}"
    );
    let holders: Vec<String> =
        sqlx::query_scalar("SELECT holder FROM pglease.shared WHERE name = 'doc'")
            .fetch_all(db.pool())
            .await
            .expect("the shared view");
    assert_eq!(holders, ["R3"]);
}

/// Writer preference: while an exclusive acquirer waits for a shared
/// holder, a new shared acquisition is refused (held by the waiting
/// acquirer); the shared holder's release hands the lease to the waiting
/// acquirer at once (its notification), and the refused shared acquirer
/// gets it when the exclusive holder releases.
async fn a_waiting_exclusive_acquirer_keeps_new_shared_holders_out() {
    let db = TestDb::new().await;
    let m = db.manager();
    let r1 = m
        .acquire("cache", shared("R1"))
        .await
        .expect("R1 acquires shared");
    let writer = {
        let m = m.clone();
        tokio::spawn(async move {
            let lease = m
                .acquire("cache", AcquireOptions::ttl(TTL).holder("W").wait(TTL))
                .await
                .expect("W acquires after R1");
            (lease, Instant::now())
        })
    };
    pglease::testing::poll_until("W to wait for R1", TTL, || async {
        writer_waiting(&db, "cache").await.as_deref() == Some("W")
    })
    .await;
    match m.acquire("cache", shared("R2")).await {
        Err(Error::Held { holder, .. }) => assert_eq!(holder, "W", "R2 waits behind W"),
        other => panic!("a shared acquisition while an exclusive one waits: {other:?}"),
    }
    // The waiting acquirer comes back within 2 s and so renews its mark
    // (5 s) before it ends.
    let mark = || async {
        sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>(
            "SELECT writer_waits_until FROM pglease.leases WHERE name = 'cache'",
        )
        .fetch_one(db.pool())
        .await
        .expect("the mark")
    };
    let first = mark().await;
    pglease::testing::poll_until("W to renew its mark", TTL, || async {
        mark().await > first + chrono::Duration::seconds(1)
    })
    .await;
    assert_eq!(writer_waiting(&db, "cache").await.as_deref(), Some("W"));
    let reader = {
        let m = m.clone();
        tokio::spawn(async move { m.acquire("cache", shared("R2").wait(TTL)).await })
    };
    let released = Instant::now();
    m.release(&r1).await.expect("R1 releases");
    let (w, acquired) = writer.await.expect("the writer task");
    let handover = acquired.duration_since(released);
    println!("exclusive acquirer served {handover:?} after the last shared holder released");
    assert!(handover < Duration::from_secs(5), "liveness: {handover:?}");
    assert!(w.token() > r1.token());
    assert!(!reader.is_finished(), "R2 does not overtake W");
    m.release(&w).await.expect("W releases");
    let r2 = reader
        .await
        .expect("the reader task")
        .expect("R2 acquires after W");
    assert!(r2.token() > w.token(), "no token is handed out twice");
}

/// Liveness for shared acquirers: an exclusive acquirer that waited and
/// gave up (or died) keeps new shared holders out for 5 s at most after
/// its first refusal; a waiting shared acquirer then gets the lease.
async fn an_exclusive_acquirer_that_gives_up_keeps_shared_ones_out_5_s_at_most() {
    let db = TestDb::new().await;
    let m = db.manager();
    let _r1 = m
        .acquire("wiki", shared("R1"))
        .await
        .expect("R1 acquires shared");
    let refused = Instant::now();
    assert!(
        m.acquire(
            "wiki",
            AcquireOptions::ttl(TTL)
                .holder("W")
                .wait(Duration::from_millis(300))
        )
        .await
        .is_err(),
        "W waits 300 ms and gives up"
    );
    let r2 = m
        .acquire("wiki", shared("R2").wait(TTL))
        .await
        .expect("R2 acquires shared once W's mark has ended");
    let took = refused.elapsed();
    println!("shared acquirer served {took:?} after an exclusive acquirer gave up");
    assert!(
        took >= Duration::from_secs(2),
        "W's mark held R2 back: {took:?}"
    );
    assert!(
        took < Duration::from_secs(7),
        "liveness: 5 s and an attempt: {took:?}"
    );
    assert!(r2.is_shared());
}

/// An exclusive acquisition that will not wait keeps nobody out: refused
/// once without a wait (the library's, or a bare SQL call), it leaves no
/// mark, and a new shared acquisition is granted at once. A bare SQL
/// acquirer that comes back within 5 s is taken to wait: its second
/// refusal marks the name, and says so to shared acquirers.
async fn an_exclusive_acquirer_that_will_not_wait_keeps_nobody_out() {
    let db = TestDb::new().await;
    let m = db.manager();
    let _r1 = m
        .acquire("doc", shared("R1"))
        .await
        .expect("R1 acquires shared");
    match m.acquire("doc", AcquireOptions::ttl(TTL).holder("W")).await {
        Err(Error::Held { holder, .. }) => assert_eq!(holder, "R1"),
        other => panic!("W refused while R1 holds it shared: {other:?}"),
    }
    assert_eq!(writer_waiting(&db, "doc").await, None, "no mark for W");
    let r2 = m
        .acquire("doc", shared("R2"))
        .await
        .expect("R2 is granted at once: nobody waits");
    assert!(r2.is_shared());

    let mut conn = db.connect().await;
    let sql_acquire = "SELECT token, holder, note FROM pglease.acquire('doc', 'S', '30 s')";
    for attempt in 1..=2 {
        let row = sqlx::query(sql_acquire)
            .fetch_one(&mut conn)
            .await
            .expect("acquire answers");
        assert_eq!(
            row.get::<Option<i64>, _>("token"),
            None,
            "attempt {attempt}"
        );
        assert!(
            row.get::<Option<String>, _>("holder")
                .is_some_and(|h| h == "R1" || h == "R2"),
            "attempt {attempt}: held by a shared holder"
        );
        let marked = writer_waiting(&db, "doc").await;
        let expected = (attempt == 2).then(|| "S".to_owned());
        assert_eq!(marked, expected, "attempt {attempt}: the mark");
    }
    let row =
        sqlx::query("SELECT token, holder, note FROM pglease.acquire_shared('doc', 'R3', '30 s')")
            .fetch_one(&mut conn)
            .await
            .expect("acquire_shared answers");
    assert_eq!(row.get::<Option<i64>, _>("token"), None);
    assert_eq!(row.get::<Option<String>, _>("holder").as_deref(), Some("S"));
    assert!(
        row.get::<Option<String>, _>("note")
            .is_some_and(|n| n.contains("writer preference")),
        "the refusal says why"
    );
}

/// Liveness with nobody holding: a shared holder that renews shorter and
/// expires leaves the name free. The sequence: `acquire_shared`
/// for 30 s, `renew` to 1 s; an exclusive acquisition (one attempt each
/// time, no wait: nothing marks the name) is granted within 1 s of the
/// shorter expiry, not 30 s later; the same after a release.
async fn a_shared_holder_that_renews_shorter_frees_the_name_when_it_expires() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let token = acquire_shared(&mut conn, "n", "r", "30 s")
        .await
        .expect("the shared holder acquires");
    let expiry: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT pglease.renew('n', $1, '1 s')")
            .bind(token)
            .fetch_one(&mut conn)
            .await
            .expect("renew answers");
    let until: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT readers_until FROM pglease.leases WHERE name = 'n'")
            .fetch_one(&mut conn)
            .await
            .expect("readers_until");
    assert_eq!(until, expiry, "readers_until follows the shortened lease");
    let (taken, at): (Option<i64>, chrono::DateTime<chrono::Utc>) = loop {
        let row = sqlx::query("SELECT token, checked_at FROM pglease.acquire('n', 'w', '30 s')")
            .fetch_one(&mut conn)
            .await
            .expect("acquire answers");
        let got: Option<i64> = row.get("token");
        let at: chrono::DateTime<chrono::Utc> = row.get("checked_at");
        if got.is_some() || at > expiry + chrono::Duration::seconds(2) {
            break (got, at);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let late = at - expiry;
    println!("exclusive acquisition {late} after the shortened shared lease expired");
    let taken = taken.expect("liveness: the writer acquires once the reader expired");
    assert!(late < chrono::Duration::seconds(1), "within 1 s: {late}");
    assert!(taken > token, "a new token");
    assert_eq!(
        writer_waiting(&db, "n").await,
        None,
        "the acquisition cleared any mark"
    );

    // A release recomputes it too (already so before): the next shared
    // holder, shortened then released, leaves nothing behind.
    assert!(
        sqlx::query_scalar::<_, bool>("SELECT pglease.release('n', $1)")
            .bind(taken)
            .fetch_one(&mut conn)
            .await
            .expect("release")
    );
    let second = acquire_shared(&mut conn, "n", "r", "30 s")
        .await
        .expect("acquired shared again");
    let _: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT pglease.renew('n', $1, '1 s')")
            .bind(second)
            .fetch_one(&mut conn)
            .await
            .expect("renew");
    assert!(
        sqlx::query_scalar::<_, bool>("SELECT pglease.release('n', $1)")
            .bind(second)
            .fetch_one(&mut conn)
            .await
            .expect("release shared")
    );
    let again: Option<i64> =
        sqlx::query_scalar("SELECT token FROM pglease.acquire('n', 'w', '30 s')")
            .fetch_one(&mut conn)
            .await
            .expect("acquire");
    assert!(
        again.is_some(),
        "granted at once after the last shared holder released"
    );
}

/// A shared holder frozen inside its checked transaction: while its lease
/// is valid an exclusive acquisition is refused; once it has expired the
/// waiting exclusive acquirer takes the lease within about a second, and
/// the frozen transaction's session is ended (its commit fails).
async fn a_frozen_shared_holder_is_ended_once_its_lease_has() {
    let db = TestDb::new().await;
    let m = db.manager();
    let mut frozen = db.connect().await;
    let token = acquire_shared(&mut frozen, "book", "R", "1 s")
        .await
        .expect("R acquires shared");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT pglease.assert_shared('book', {token})"
    )))
    .execute(&mut frozen)
    .await
    .expect("R's checked transaction");
    // R stops here: no renewal, no commit.
    let started = Instant::now();
    let w = m
        .acquire("book", AcquireOptions::ttl(TTL).holder("W").wait(TTL))
        .await
        .expect("W takes over from the frozen shared holder");
    let took = started.elapsed();
    println!("exclusive acquisition {took:?} after a 1 s shared holder froze");
    assert!(
        took >= Duration::from_millis(900),
        "not before R's expiry: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "liveness: {took:?}");
    assert!(w.token().get() > token);
    // Safety: the frozen transaction cannot commit.
    let commit = sqlx::raw_sql("COMMIT").execute(&mut frozen).await;
    assert!(
        commit.is_err(),
        "the frozen shared holder's session was ended: {commit:?}"
    );
    let evicted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pglease.history WHERE name = 'book' AND event = 'evicted'",
    )
    .fetch_one(db.pool())
    .await
    .expect("history");
    assert_eq!(evicted, 1);
}

/// An exclusive holder frozen inside its fenced transaction with an
/// uncommitted write: the first shared acquisition after its lease has
/// expired ends that transaction before it grants, so no shared holder
/// reads beside a stale writer; the write never lands.
async fn a_stale_exclusive_transaction_ends_before_a_shared_holder_reads() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let mut frozen = db.connect().await;
    let token: i64 = sqlx::query_scalar("SELECT token FROM pglease.acquire('page', 'W', '1 s')")
        .fetch_one(&mut frozen)
        .await
        .expect("W acquires");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT pglease.assert_held('page', {token}); \
         UPDATE data SET value = 'stale write' WHERE id = 1"
    )))
    .execute(&mut frozen)
    .await
    .expect("W's fenced write, not committed");
    let started = Instant::now();
    let r = m
        .acquire("page", shared("R").wait(TTL))
        .await
        .expect("R acquires shared after W's expiry");
    let took = started.elapsed();
    println!("shared acquisition {took:?} after a 1 s exclusive holder froze");
    assert!(
        took >= Duration::from_millis(900),
        "not before W's expiry: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "liveness: {took:?}");
    assert!(r.token().get() > token);
    assert!(sqlx::raw_sql("COMMIT").execute(&mut frozen).await.is_err());
    assert_eq!(
        data_value(&db).await,
        "initial",
        "the stale write never commits"
    );
    // Later shared holders do not end anyone again.
    let r2 = m
        .acquire("page", shared("R2"))
        .await
        .expect("R2 acquires shared");
    assert!(r2.token() > r.token());
}

/// A shared holder is kept by a manager's renewals past its TTL, and its
/// handle's checked transactions use its token; releasing the handle lets
/// the exclusive acquirer in.
async fn a_held_shared_lease_is_renewed_and_released() {
    let db = TestDb::new().await;
    let m = db.manager();
    // 2 s: a 1 s lease's renewal times out after about 0.6 s, which a
    // commit flush stalled by a busy disk has exceeded here.
    let how = AcquireOptions::ttl(Duration::from_secs(2))
        .holder("R")
        .shared(true);
    let held = m.hold("feed", how).await.expect("R holds shared");
    tokio::time::sleep(Duration::from_millis(5000)).await;
    let mut tx = held
        .begin_fenced()
        .await
        .expect("still held after 2.5 TTLs");
    tx.recheck().await.expect("re-check");
    tx.commit().await.expect("commit");
    assert!(
        m.acquire("feed", AcquireOptions::ttl(TTL).holder("W"))
            .await
            .is_err(),
        "held shared"
    );
    held.release().await.expect("R releases");
    m.acquire("feed", AcquireOptions::ttl(TTL).holder("W"))
        .await
        .expect("W acquires after the release");
}

/// Only the role that acquired a shared lease (or an administrator) acts
/// under its token: another role's renew, release and check are refused
/// with 42501 and change nothing.
async fn only_the_acquiring_role_acts_under_a_shared_token() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["app1", "app2"], &[]).await;
    let mut c1 = db.connect_as(&roles[0]).await;
    let mut c2 = db.connect_as(&roles[1]).await;
    let token = acquire_shared(&mut c1, "ledger", "app1", "1 min")
        .await
        .expect("app1 acquires shared");
    for sql in [
        format!("SELECT pglease.renew('ledger', {token}, '1 h')"),
        format!("SELECT pglease.release('ledger', {token})"),
        format!(
            "SELECT * FROM pglease.renew_many(ARRAY['ledger'], ARRAY[{token}::bigint], ARRAY['1 h'::interval])"
        ),
        format!("BEGIN; SELECT pglease.assert_shared('ledger', {token})"),
    ] {
        assert_eq!(
            sqlstate_of(&mut c2, &sql).await.as_deref(),
            Some("42501"),
            "{sql}"
        );
        let _ = sqlx::raw_sql("ROLLBACK").execute(&mut c2).await;
    }
    let left: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM expires_at - clock_timestamp())::float8 \
           FROM pglease._shared WHERE token = $1",
    )
    .bind(token)
    .fetch_one(db.pool())
    .await
    .expect("the shared holder's row");
    assert!(
        left > 0.0 && left <= 60.0,
        "not renewed by another role: {left}"
    );
    // Its own role renews and releases it.
    let renewed: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT pglease.renew('ledger', $1, '1 min')")
            .bind(token)
            .fetch_one(&mut c1)
            .await
            .expect("renew");
    assert!(renewed.is_some());
    let released: bool = sqlx::query_scalar("SELECT pglease.release('ledger', $1)")
        .bind(token)
        .fetch_one(&mut c1)
        .await
        .expect("release");
    assert!(released);
    // A role that may not use a name marks nothing: refused (42501)
    // before the writer-preference mark is written.
    db.execute(&[format!("SELECT pglease.grant_names('g/', '{}')", roles[0])])
        .await;
    let token = acquire_shared(&mut c1, "g/x", "app1", "1 min")
        .await
        .expect("app1 acquires g/x shared");
    assert_eq!(
        sqlstate_of(
            &mut c2,
            "SELECT * FROM pglease.acquire('g/x', 'evil', '1 min')"
        )
        .await
        .as_deref(),
        Some("42501")
    );
    assert_eq!(
        writer_waiting(&db, "g/x").await,
        None,
        "no mark by a role without the name"
    );
    // Another role's renewal of an ended shared token takes no lock.
    let released: bool = sqlx::query_scalar("SELECT pglease.release('g/x', $1)")
        .bind(token)
        .fetch_one(&mut c1)
        .await
        .expect("release");
    assert!(released);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT pglease.renew('g/x', {token}, '1 min')"
    )))
    .execute(&mut c2)
    .await
    .expect("a renewal of an ended token answers NULL");
    let started = Instant::now();
    acquire_shared(&mut c1, "g/x", "app1", "1 min")
        .await
        .expect("app1 acquires again beside the open transaction");
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "not blocked"
    );
    let _ = sqlx::raw_sql("ROLLBACK").execute(&mut c2).await;
    c1.close().await.expect("close");
    c2.close().await.expect("close");
}

/// Under load: tasks acquiring the same name shared or exclusive at
/// random, each reading (shared) or writing (exclusive) in a checked
/// transaction, for a few seconds. A monitor reading the committed state
/// never sees an exclusive holder beside a valid shared holder, no token
/// is handed out twice, every write lands under the token it was made
/// under, and both kinds get the lease.
async fn shared_and_exclusive_acquirers_under_load_never_overlap() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let until = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for i in 0..6_u32 {
        let m = m.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            let mut n = 0_u32;
            while Instant::now() < until {
                n += 1;
                let exclusive = (i + n).is_multiple_of(3);
                let how = AcquireOptions::ttl(TTL)
                    .holder(format!("T{i}"))
                    .shared(!exclusive)
                    .wait(Duration::from_secs(10));
                let lease = m.acquire("hot", how).await.expect("acquired within 10 s");
                let mut tx = m.begin_fenced(&lease).await.expect("checked transaction");
                if exclusive {
                    sqlx::query("UPDATE data SET value = $1, token = $2 WHERE id = 1")
                        .bind(format!("T{i}"))
                        .bind(lease.token().get())
                        .execute(&mut *tx)
                        .await
                        .expect("write");
                } else {
                    let _: String = sqlx::query_scalar("SELECT value FROM data WHERE id = 1")
                        .fetch_one(&mut *tx)
                        .await
                        .expect("read");
                }
                tx.commit().await.expect("commit");
                m.release(&lease).await.expect("release");
                got.push((exclusive, lease.token().get()));
            }
            got
        }));
    }
    let mut monitor = db.connect().await;
    let mut looks = 0_u32;
    while Instant::now() < until {
        let both: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pglease.status WHERE name = 'hot' AND held) \
                AND EXISTS (SELECT 1 FROM pglease.shared WHERE name = 'hot')",
        )
        .fetch_one(&mut monitor)
        .await
        .expect("monitor");
        assert!(!both, "an exclusive holder beside a valid shared holder");
        looks += 1;
    }
    let mut tokens = Vec::new();
    for task in tasks {
        tokens.extend(task.await.expect("an acquirer task"));
    }
    let exclusive = tokens.iter().filter(|(e, _)| *e).count();
    println!(
        "{} acquisitions ({exclusive} exclusive) in 3 s, {looks} looks by the monitor",
        tokens.len()
    );
    assert!(
        exclusive > 0 && exclusive < tokens.len(),
        "both kinds were served"
    );
    let mut all: Vec<i64> = tokens.iter().map(|(_, t)| *t).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), tokens.len(), "no token handed out twice");
    let last_write: Option<i64> = sqlx::query_scalar("SELECT token FROM data WHERE id = 1")
        .fetch_one(db.pool())
        .await
        .expect("data");
    let last_exclusive = tokens.iter().filter(|(e, _)| *e).map(|(_, t)| *t).max();
    assert_eq!(
        last_write, last_exclusive,
        "the last write is the last exclusive holder's"
    );
}

/// Bad input: the SQL function's arguments (22023, nothing written) and
/// the options a shared acquisition cannot have, refused before anything
/// is sent.
async fn bad_input_to_a_shared_acquisition_is_refused() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    for sql in [
        "SELECT * FROM pglease.acquire_shared(NULL, 'h', '1 min')",
        "SELECT * FROM pglease.acquire_shared('n', '', '1 min')",
        "SELECT * FROM pglease.acquire_shared('n', 'h', '0 s')",
        "SELECT * FROM pglease.acquire_shared('n', 'h', '8 days')",
        "SELECT pglease.assert_shared('n', NULL)",
    ] {
        assert_eq!(
            sqlstate_of(&mut conn, sql).await.as_deref(),
            Some("22023"),
            "{sql}"
        );
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM pglease.leases")
        .fetch_one(&mut conn)
        .await
        .expect("count");
    assert_eq!(rows, 0, "nothing written");
    let m = db.manager();
    for how in [
        shared("h").limit(3),
        shared("h").fair(true),
        shared("h").session_bound(true),
        shared("h").value("v"),
    ] {
        match m.acquire("n", how).await {
            Err(Error::InvalidInput {
                argument: "shared", ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }
    match m.acquire_all(&["a", "b"], shared("h")).await {
        Err(Error::InvalidInput {
            argument: "shared", ..
        }) => {}
        other => panic!("{other:?}"),
    }
    match m.elector("n", shared("h")) {
        Err(Error::InvalidInput {
            argument: "shared", ..
        }) => {}
        other => panic!("an election of shared holders: {other:?}"),
    }
    let row = sqlx::query("SELECT count(*) AS n FROM pglease.leases")
        .fetch_one(&mut conn)
        .await
        .expect("count");
    assert_eq!(row.get::<i64, _>("n"), 0);
}

pglease_formations::tests![
    shared_holders_hold_together_and_exclude_an_exclusive_one,
    a_waiting_exclusive_acquirer_keeps_new_shared_holders_out(2),
    an_exclusive_acquirer_that_gives_up_keeps_shared_ones_out_5_s_at_most,
    an_exclusive_acquirer_that_will_not_wait_keeps_nobody_out,
    a_shared_holder_that_renews_shorter_frees_the_name_when_it_expires,
    a_frozen_shared_holder_is_ended_once_its_lease_has,
    a_stale_exclusive_transaction_ends_before_a_shared_holder_reads,
    a_held_shared_lease_is_renewed_and_released,
    only_the_acquiring_role_acts_under_a_shared_token,
    bad_input_to_a_shared_acquisition_is_refused,
    shared_and_exclusive_acquirers_under_load_never_overlap(2),
];
