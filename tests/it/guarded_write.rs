//! Guarded writes: the database, not the client, rejects a write whose
//! token is stale or expired, at the moment the write is checked.

use std::time::Duration;

use crate::common::{TestDb, create_data_table, data_value, fenced_write};
use pglease::{AcquireOptions, Error, NotHeldReason, Token};
use sqlx::Connection;

const LONG: Duration = Duration::from_secs(600);
const SHORT: Duration = Duration::from_millis(300);

/// The reason the database gave (SQLSTATE LE001), as data: matched, never
/// parsed out of the message.
fn expect_not_held<T: std::fmt::Debug>(
    result: Result<T, Error>,
) -> (String, Option<Token>, NotHeldReason) {
    match result {
        Err(error @ Error::NotHeld { .. }) => {
            assert_eq!(error.sqlstate(), Some("LE001"));
            let Error::NotHeld {
                name,
                token,
                reason,
            } = error
            else {
                unreachable!()
            };
            (name, token, reason)
        }
        other => panic!("expected the database to reject with LE001, got {other:?}"),
    }
}

async fn guarded_write_commits_under_valid_lease() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let lease = m
        .acquire("data", AcquireOptions::ttl(LONG).holder("A"))
        .await
        .expect("acquire");
    fenced_write(&m, "data", lease.token(), "a-1")
        .await
        .expect("write");
    assert_eq!(data_value(&db).await, "a-1");
}

async fn guarded_write_rejected_after_expiry() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let lease = m
        .acquire("data", AcquireOptions::ttl(SHORT).holder("A"))
        .await
        .expect("acquire");
    db.wait_until(lease.expires_at()).await;
    let (name, token, reason) =
        expect_not_held(fenced_write(&m, "data", lease.token(), "late").await);
    assert_eq!(name, "data");
    assert_eq!(token, Some(lease.token()));
    assert!(
        matches!(reason, NotHeldReason::Expired { at } if at == lease.expires_at()),
        "{reason:?}"
    );
    assert_eq!(data_value(&db).await, "initial");
}

async fn guarded_write_rejected_after_takeover() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let old = m
        .acquire("data", AcquireOptions::ttl(SHORT).holder("A"))
        .await
        .expect("A acquires");
    db.wait_until(old.expires_at()).await;
    let new = m
        .acquire("data", AcquireOptions::ttl(LONG).holder("B"))
        .await
        .expect("B takes over");
    fenced_write(&m, "data", new.token(), "b-1")
        .await
        .expect("B writes");
    let (_, token, reason) = expect_not_held(fenced_write(&m, "data", old.token(), "stale").await);
    assert_eq!(token, Some(old.token()));
    assert_eq!(
        reason,
        NotHeldReason::Stale {
            current_token: new.token()
        }
    );
    let (_, _, reason) =
        expect_not_held(fenced_write(&m, "data", new.token().get() + 1, "future").await);
    assert_eq!(
        reason,
        NotHeldReason::NotIssued {
            current_token: new.token()
        }
    );
    assert_eq!(data_value(&db).await, "b-1");
}

async fn guarded_write_rejected_after_release() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let lease = m
        .acquire("data", AcquireOptions::ttl(LONG).holder("A"))
        .await
        .expect("acquire");
    assert!(
        m.release(&crate::common::fence("data", lease.token()))
            .await
            .expect("release")
    );
    let (_, _, reason) = expect_not_held(fenced_write(&m, "data", lease.token(), "late").await);
    assert!(
        matches!(reason, NotHeldReason::Released { .. }),
        "{reason:?}"
    );
    let (name, _, reason) = expect_not_held(fenced_write(&m, "never", 1, "x").await);
    assert_eq!(
        (name.as_str(), reason),
        ("never", NotHeldReason::NeverAcquired)
    );
    assert_eq!(data_value(&db).await, "initial");
}

/// `now()` is the transaction's start time: a check made late in a long
/// transaction must use the clock at the check, and so reject.
async fn transaction_begun_while_valid_is_rejected_when_it_checks_after_expiry() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let lease = m
        .acquire("data", AcquireOptions::ttl(SHORT).holder("A"))
        .await
        .expect("acquire");

    let mut conn = db.connect().await;
    let mut tx = conn.begin().await.expect("begin");
    let started: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *tx)
        .await
        .expect("transaction start time");
    assert!(
        started < lease.expires_at(),
        "the transaction began while valid"
    );
    db.wait_until(lease.expires_at()).await;
    let (_, _, reason) = expect_not_held(pglease::assert_held(&mut tx, &lease).await);
    assert!(
        matches!(reason, NotHeldReason::Expired { .. }),
        "{reason:?}"
    );
    drop(tx);
    assert_eq!(data_value(&db).await, "initial");
}

async fn fenced_transaction_recheck_rejects_after_expiry_and_nothing_commits() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let lease = m
        .acquire("data", AcquireOptions::ttl(SHORT).holder("A"))
        .await
        .expect("acquire");
    let mut tx = m
        .begin_fenced(&crate::common::fence("data", lease.token()))
        .await
        .expect("begin fenced");
    assert_eq!(tx.token(), lease.token());
    sqlx::query("UPDATE data SET value = 'first step' WHERE id = 1")
        .execute(&mut *tx)
        .await
        .expect("write while valid");
    db.wait_until(lease.expires_at()).await;
    expect_not_held(tx.recheck().await);
    // The failed check aborted the transaction: committing it is refused,
    // and its earlier write is lost.
    expect_not_held(tx.commit().await);
    assert_eq!(data_value(&db).await, "initial");
}

async fn fenced_closure_rolls_back_on_error() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let lease = m
        .acquire("data", AcquireOptions::ttl(LONG).holder("A"))
        .await
        .expect("acquire");
    let outcome: Result<(), Error> = m
        .fenced(&crate::common::fence("data", lease.token()), async |conn| {
            sqlx::query("UPDATE data SET value = 'rolled back' WHERE id = 1")
                .execute(&mut *conn)
                .await
                .map_err(Error::from)?;
            Err(Error::ShutDown)
        })
        .await;
    assert!(outcome.is_err());
    assert_eq!(data_value(&db).await, "initial");
}

/// The one-statement guarded write documented in docs/design.md ("SQL interface"): the check and
/// the write share one autocommit transaction.
async fn single_statement_guarded_write() {
    let db = TestDb::new().await;
    create_data_table(&db).await;
    let m = db.manager();
    let old = m
        .acquire("data", AcquireOptions::ttl(SHORT).holder("A"))
        .await
        .expect("A acquires");
    const GUARDED_UPDATE: &str = "WITH fence AS (SELECT pglease.assert_held($1, $2)) \
         UPDATE data SET value = $3 FROM fence WHERE id = 1";
    let write = |token: Token, value: &'static str| {
        sqlx::query(GUARDED_UPDATE)
            .bind("data")
            .bind(token)
            .bind(value)
            .execute(db.pool())
    };
    write(old.token(), "a-1")
        .await
        .expect("guarded update while valid");
    assert_eq!(data_value(&db).await, "a-1");
    db.wait_until(old.expires_at()).await;
    let new = m
        .acquire("data", AcquireOptions::ttl(LONG).holder("B"))
        .await
        .expect("B takes over");
    let err = write(old.token(), "stale")
        .await
        .expect_err("stale guarded update");
    expect_not_held::<()>(Err(Error::from(err)));
    write(new.token(), "b-1")
        .await
        .expect("guarded update by the new holder");
    assert_eq!(data_value(&db).await, "b-1");
}

pglease_formations::tests![
    guarded_write_commits_under_valid_lease,
    guarded_write_rejected_after_expiry,
    guarded_write_rejected_after_takeover,
    guarded_write_rejected_after_release,
    transaction_begun_while_valid_is_rejected_when_it_checks_after_expiry,
    fenced_transaction_recheck_rejects_after_expiry_and_nothing_commits,
    fenced_closure_rolls_back_on_error,
    single_statement_guarded_write,
];
