//! Every kind of bad input is rejected with a typed error (in Rust) or
//! SQLSTATE 22023 (in SQL), and leaves the database exactly as it was.

use std::time::Duration;

use crate::common::TestDb;
use pglease::limits::{MAX_NAME_BYTES, MAX_TTL, MIN_TTL};
use pglease::{AcquireOptions, Error, Fence, LossReason, NotHeldReason, Token};

const TTL: Duration = Duration::from_secs(60);

fn bad_names() -> Vec<(&'static str, String)> {
    vec![
        ("empty", String::new()),
        ("too long", "n".repeat(MAX_NAME_BYTES + 1)),
        (
            "too many bytes of UTF-8",
            "é".repeat(MAX_NAME_BYTES / 2 + 1),
        ),
        ("NUL byte", "a\0b".to_owned()),
    ]
}

fn assert_invalid<T: std::fmt::Debug>(what: &str, result: Result<T, Error>, argument: &str) {
    match result {
        Err(Error::InvalidInput { argument: got, .. }) => {
            assert_eq!(got, argument, "{what}: wrong argument named")
        }
        other => panic!("{what}: expected InvalidInput for {argument}, got {other:?}"),
    }
}

async fn library_rejects_bad_input_before_touching_the_database() {
    let db = TestDb::new().await;
    let m = db.manager();
    let lease = m
        .acquire("ok", AcquireOptions::ttl(TTL).holder("A"))
        .await
        .expect("acquire");
    m.admit("res", lease.token()).await.expect("admit");
    let before = db.state().await;

    for (what, bad) in bad_names() {
        assert_invalid(
            what,
            m.acquire(&bad, AcquireOptions::ttl(TTL).holder("A")).await,
            "name",
        );
        assert_invalid(
            what,
            m.acquire("ok2", AcquireOptions::ttl(TTL).holder(&bad))
                .await,
            "holder",
        );
        // A fence with a bad name cannot be built, so no operation on a
        // lease can be sent with one.
        assert_invalid(what, Fence::new(bad.as_str(), lease.token()), "name");
        assert_invalid(what, m.inspect(&bad).await, "name");
        assert_invalid(what, m.observe(&bad).await, "name");
        assert_invalid(what, m.request_step_down(&bad, "ops").await, "name");
        assert_invalid(what, m.request_step_down("ok", &bad).await, "requested_by");
        assert_invalid(
            what,
            m.admit(&bad, crate::common::token(6)).await,
            "resource",
        );
    }
    let bad_ttls = [
        ("zero", Duration::ZERO),
        ("a microsecond", Duration::from_micros(1)),
        ("5 ms", Duration::from_millis(5)),
        ("just under the minimum", MIN_TTL - Duration::from_nanos(1)),
        ("over the maximum", MAX_TTL + Duration::from_nanos(1)),
        ("overflowing", Duration::MAX),
    ];
    for (what, ttl) in bad_ttls {
        assert_invalid(
            what,
            m.acquire("ok2", AcquireOptions::ttl(ttl).holder("A")).await,
            "ttl",
        );
        assert_invalid(
            what,
            m.hold("ok2", AcquireOptions::ttl(ttl).holder("A")).await,
            "ttl",
        );
        assert_invalid(
            what,
            m.renew(&crate::common::fence("ok", lease.token()), ttl)
                .await,
            "ttl",
        );
    }
    // Token's own error (InvalidToken) becomes InvalidInput through `?`.
    assert_invalid("zero token", Token::new(0).map_err(Error::from), "token");
    assert_invalid(
        "negative token",
        Token::new(-1).map_err(Error::from),
        "token",
    );
    assert_invalid(
        "not a number",
        "12a".parse::<Token>().map_err(Error::from),
        "token",
    );

    assert_eq!(
        db.state().await,
        before,
        "a rejected call changed the database"
    );
    // The limits themselves are accepted.
    let longest = "n".repeat(MAX_NAME_BYTES);
    m.acquire(&longest, AcquireOptions::ttl(MAX_TTL).holder(&longest))
        .await
        .expect("limits are valid");
    m.acquire("shortest", AcquireOptions::ttl(MIN_TTL).holder("A"))
        .await
        .expect("the minimum TTL is valid");
}

/// A token this lease never had (larger than its latest, or any token of a
/// name never acquired) is the caller's mistake: renew, release and
/// set_value refuse it as not held (`NotIssued`, `NeverAcquired`), as
/// `begin_fenced` does, instead of calling it lost or released; nothing
/// changes. A stale token is still lost (renew) and not released (false).
async fn a_token_never_issued_is_refused_as_not_issued_not_lost() {
    let db = TestDb::new().await;
    let m = db.manager();
    let lease = m
        .acquire("job", AcquireOptions::ttl(TTL).holder("A"))
        .await
        .expect("acquire");
    let current = lease.token();
    let unissued = crate::common::fence("job", current.get() + 100);
    let before = db.state().await;
    let not_issued = |outcome: &str, error: Error| match error {
        Error::NotHeld {
            reason: NotHeldReason::NotIssued { current_token },
            ..
        } => assert_eq!(current_token, current, "{outcome}"),
        other => panic!("{outcome}: expected NotIssued, got {other:?}"),
    };
    not_issued("renew", m.renew(&unissued, TTL).await.expect_err("renew"));
    not_issued("release", m.release(&unissued).await.expect_err("release"));
    not_issued(
        "set_value",
        m.set_value(&unissued, Some("x"))
            .await
            .expect_err("set_value"),
    );
    match m.begin_fenced(&unissued).await {
        Err(error) => not_issued("begin_fenced", error),
        Ok(_) => panic!("begin_fenced accepted a token never issued"),
    }
    let never = crate::common::fence("never-acquired", 1);
    for outcome in [
        m.renew(&never, TTL).await.map(drop),
        m.release(&never).await.map(drop),
    ] {
        assert!(
            matches!(
                outcome,
                Err(Error::NotHeld {
                    reason: NotHeldReason::NeverAcquired,
                    ..
                })
            ),
            "{outcome:?}"
        );
    }
    assert_eq!(
        db.state().await,
        before,
        "a refused call changed the database"
    );
    // The lease is still held under its token; a stale token after a
    // release is lost for renew and not released (false).
    assert!(m.release(&lease).await.expect("release"));
    assert!(!m.release(&lease).await.expect("a second release"));
    assert!(matches!(
        m.renew(&lease, TTL).await,
        Err(Error::Lost {
            reason: LossReason::Released,
            ..
        })
    ));
}

/// Runs `sql` and returns its SQLSTATE.
async fn sqlstate(db: &TestDb, sql: &'static str) -> String {
    match sqlx::query(sql).execute(db.pool()).await {
        Ok(_) => panic!("{sql}: accepted"),
        Err(e) => e
            .as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned())
            .unwrap_or_else(|| panic!("{sql}: not a database error: {e}")),
    }
}

async fn sql_functions_reject_bad_input_with_22023() {
    let db = TestDb::new().await;
    let m = db.manager();
    let lease = m
        .acquire("ok", AcquireOptions::ttl(TTL).holder("A"))
        .await
        .expect("acquire");
    m.admit("res", lease.token()).await.expect("admit");
    let before = db.state().await;

    let calls = [
        "SELECT * FROM pglease.acquire(NULL, 'A', '1s')",
        "SELECT * FROM pglease.acquire('', 'A', '1s')",
        "SELECT * FROM pglease.acquire(repeat('n', 256), 'A', '1s')",
        "SELECT * FROM pglease.acquire(repeat('é', 128), 'A', '1s')",
        "SELECT * FROM pglease.acquire('x', NULL, '1s')",
        "SELECT * FROM pglease.acquire('x', '', '1s')",
        "SELECT * FROM pglease.acquire('x', repeat('h', 256), '1s')",
        "SELECT * FROM pglease.acquire('x', 'A', NULL)",
        "SELECT * FROM pglease.acquire('x', 'A', '0s')",
        "SELECT * FROM pglease.acquire('x', 'A', '-1s')",
        "SELECT * FROM pglease.acquire('x', 'A', '7 days 1 microsecond')",
        "SELECT * FROM pglease.acquire('x', 'A', '1 mon')",
        "SELECT * FROM pglease.acquire('x', 'A', '-1 day 23 hours')",
        "SELECT pglease.renew(NULL, 1, '1s')",
        "SELECT pglease.renew('ok', NULL, '1s')",
        "SELECT pglease.renew('ok', 1, NULL)",
        "SELECT pglease.renew('ok', 1, '0s')",
        "SELECT pglease.renew('ok', 1, '8 days')",
        "SELECT pglease.release(NULL, 1)",
        "SELECT pglease.release('', 1)",
        "SELECT pglease.release('ok', NULL)",
        "SELECT pglease.request_step_down(NULL, 'ops')",
        "SELECT pglease.request_step_down('ok', NULL)",
        "SELECT pglease.request_step_down('ok', '')",
        "SELECT pglease.request_step_down('ok', repeat('b', 256))",
        "SELECT pglease.observe(NULL)",
        "SELECT pglease.observe('')",
        "SELECT pglease.assert_held(NULL, 1)",
        "SELECT pglease.assert_held('ok', NULL)",
        "SELECT pglease.admit(NULL, 1)",
        "SELECT pglease.admit('', 1)",
        "SELECT pglease.admit(repeat('r', 256), 1)",
        "SELECT pglease.admit('res', NULL)",
        "SELECT pglease.admit('res', 0)",
        "SELECT pglease.admit('res', -7)",
        // A bad element anywhere rejects the whole batch, valid ones included.
        "SELECT * FROM pglease.renew_many(NULL, '{1}', '{1s}')",
        "SELECT * FROM pglease.renew_many('{ok}', NULL, '{1s}')",
        "SELECT * FROM pglease.renew_many('{ok}', '{1}', NULL)",
        "SELECT * FROM pglease.renew_many('{ok,ok}', '{1}', '{1s,1s}')",
        "SELECT * FROM pglease.renew_many('{ok,\"\"}', '{1,1}', '{1s,1s}')",
        "SELECT * FROM pglease.renew_many(ARRAY['ok', NULL], '{1,1}', '{1s,1s}')",
        "SELECT * FROM pglease.renew_many(ARRAY['ok', repeat('n', 256)], '{1,1}', '{1s,1s}')",
        "SELECT * FROM pglease.renew_many('{ok,x}', '{1,NULL}', '{1s,1s}')",
        "SELECT * FROM pglease.renew_many('{ok,x}', '{1,1}', '{1s,NULL}')",
        "SELECT * FROM pglease.renew_many('{ok,x}', '{1,1}', '{1s,0s}')",
        "SELECT * FROM pglease.renew_many('{ok,x}', '{1,1}', '{1s,8 days}')",
        // Arrays of more than one dimension.
        "SELECT * FROM pglease.renew_many('{{a},{b}}', '{{1},{2}}', '{{1s},{1s}}')",
        "SELECT * FROM pglease.acquire_all(ARRAY[['a','b'],['c','d']], 'h', '1 min')",
        "SELECT * FROM pglease.enqueue(ARRAY[['a','b'],['c','d']], 'h', '1 min')",
    ];
    for sql in calls {
        assert_eq!(sqlstate(&db, sql).await, "22023", "{sql}");
    }
    assert_eq!(
        db.state().await,
        before,
        "a rejected call changed the database"
    );
}

/// The SQL functions name the argument in the error's COLUMN field; the
/// library reads it from there, not from the message.
async fn database_errors_name_their_argument() {
    let db = TestDb::new().await;
    for (sql, argument) in [
        ("SELECT * FROM pglease.acquire('', 'A', '1s')", "name"),
        ("SELECT * FROM pglease.acquire('x', '', '1s')", "holder"),
        ("SELECT pglease.renew('x', NULL, '1s')", "token"),
        ("SELECT pglease.admit(repeat('r', 256), 1)", "resource"),
        ("SELECT pglease.admit('r', 0)", "token"),
        (
            "SELECT * FROM pglease.renew_many('{ok,x}', '{1,1}', '{1s,0s}')",
            "ttl",
        ),
        ("SELECT pglease.protect(NULL, 'x')", "tbl"),
    ] {
        let err = sqlx::query(sql).execute(db.pool()).await.expect_err(sql);
        match Error::from(err) {
            Error::InvalidInput { argument: got, .. } => assert_eq!(got, argument, "{sql}"),
            other => panic!("{sql}: expected InvalidInput, got {other:?}"),
        }
    }
}

async fn database_errors_for_bad_input_map_to_invalid_input() {
    let db = TestDb::new().await;
    let err = sqlx::query("SELECT * FROM pglease.acquire('x', 'A', '0s')")
        .execute(db.pool())
        .await
        .expect_err("zero ttl");
    match Error::from(err) {
        Error::InvalidInput { argument, reason } => {
            assert_eq!(argument, "ttl");
            assert!(reason.contains("ttl must be greater than zero"), "{reason}")
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

pglease_formations::tests![
    library_rejects_bad_input_before_touching_the_database,
    a_token_never_issued_is_refused_as_not_issued_not_lost,
    sql_functions_reject_bad_input_with_22023,
    database_errors_name_their_argument,
    database_errors_for_bad_input_map_to_invalid_input,
];
