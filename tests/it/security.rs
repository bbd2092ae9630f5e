//! Authority: what a role can do to leases is what it was granted,
//! enforced by PostgreSQL. Each test is one finding of the security review
//! (docs/design.md, "Roles and grants"), with the documented roles: two
//! application roles (`app1`, `app2`, USAGE on the schema), a role with
//! CONNECT only (`nopriv`), an administrator (a member of `pglease_admin`),
//! the schema migrated by a superuser. Each checks safety (nothing stale
//! or foreign commits), liveness (the lease still changes hands) and
//! authority (only the acquiring role, its members or an administrator
//! acts under a token).

use std::time::{Duration, Instant};

use crate::common::{TestDb, poll_until, sqlstate_of};
use pglease::observe::Change;
use pglease::{AcquireOptions, Error, ManagerOptions};
use pglease_formations::{PgBouncer, SetupError};
use sqlx::{AssertSqlSafe, Connection};

const TTL: Duration = Duration::from_secs(30);
const BOUND: Duration = Duration::from_secs(10);

fn not_permitted<T: std::fmt::Debug>(what: &str, got: pglease::Result<T>) {
    match got {
        Err(Error::NotPermitted { message }) => {
            assert!(message.contains("may not"), "{what}: {message}");
        }
        other => panic!("{what}: expected NotPermitted, got {other:?}"),
    }
}

/// Finding 1: a forged NOTIFY, from a role that may not even use the
/// schema, changes nothing an observer or an elector reports.
async fn a_forged_notification_changes_nothing_an_observer_or_elector_reports() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["nopriv"], &["nopriv"]).await;
    let m = db.manager();
    let mut observer = m.observe("svc").await.expect("observe");
    assert!(matches!(
        tokio::time::timeout(BOUND, observer.next()).await,
        Ok(Ok(Change::Current(_)))
    ));
    let elector = std::sync::Arc::new(
        m.elector(
            "svc",
            AcquireOptions::ttl(TTL).holder("real").value("10.0.0.1:80"),
        )
        .expect("elector"),
    );
    let campaign = tokio::spawn({
        let elector = std::sync::Arc::clone(&elector);
        async move { elector.run(async |_term| {}).await }
    });
    let real = loop {
        match tokio::time::timeout(BOUND, observer.next()).await {
            Ok(Ok(Change::Acquired { token, holder, .. })) if holder == "real" => break token,
            Ok(Ok(_)) => {}
            other => panic!("the elector's term: {other:?}"),
        }
    };
    let published = tokio::time::timeout(BOUND, observer.next())
        .await
        .expect("its value")
        .expect("observer");
    assert_eq!(
        published,
        Change::ValueChanged {
            token: real,
            value: Some("10.0.0.1:80".to_owned())
        }
    );
    let key: String = sqlx::query_scalar("SELECT hashtext('svc')::text")
        .fetch_one(db.pool())
        .await
        .expect("key");

    // The payloads of the old format, and the real key, from nopriv.
    let mut nopriv = db.connect_as(&roles[0]).await;
    let n = "svc".len();
    for payload in [
        format!("v {real} {n} svc= evil.attacker:6666"),
        format!("a 999999999 {n} svc1700000000000000 attacker"),
        format!("r {real} {n} svc"),
        key.clone(),
        key.clone(),
    ] {
        sqlx::query("SELECT pg_notify('pglease_change', $1), pg_notify('pglease_release', $1)")
            .bind(&payload)
            .execute(&mut nopriv)
            .await
            .expect("anyone may NOTIFY");
    }
    // A real change after the forgeries: it is the next thing reported,
    // so the forgeries produced nothing.
    m.request_step_down("svc", "ops").await.expect("ask");
    let next = tokio::time::timeout(BOUND, observer.next())
        .await
        .expect("a change")
        .expect("observer");
    assert_eq!(
        next,
        Change::StepDownRequested {
            token: real,
            by: "ops".to_owned()
        }
    );
    let asked = tokio::time::timeout(BOUND, elector.until_step_down_requested())
        .await
        .expect("the elector hears the real request");
    assert_eq!(asked, "ops");
    // The elector still leads its one term, with its own value.
    assert!(elector.is_leader());
    assert_eq!(elector.terms(), 1);
    let status = m.inspect("svc").await.expect("inspect");
    assert_eq!(
        (
            status.token,
            status.holder.as_deref(),
            status.value.as_deref()
        ),
        (Some(real), Some("real"), Some("10.0.0.1:80"))
    );
    elector.resign();
    tokio::time::timeout(BOUND, campaign)
        .await
        .expect("resigned")
        .expect("joined")
        .expect("campaign");
}

/// Finding 2: what anyone who can connect hears on the channels: a key
/// per change, never a token, holder, value or name.
async fn a_listener_learns_no_token_holder_value_or_name() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["nopriv"], &["nopriv"]).await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(db.options().username(&roles[0]))
        .await
        .expect("nopriv connects");
    let mut eavesdropper = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .expect("nopriv listens");
    eavesdropper
        .listen_all(["pglease_change", "pglease_release"])
        .await
        .expect("anyone may LISTEN");
    let m = db.manager();
    let _observer = m.observe("vault").await.expect("observe");
    let mut watcher = db.connect().await;
    let watched: bool = sqlx::query_scalar("SELECT pglease.watch('vault')")
        .fetch_one(&mut watcher)
        .await
        .expect("watch");
    assert!(watched);
    let lease = m
        .acquire(
            "vault",
            AcquireOptions::ttl(TTL)
                .holder("billing-7")
                .value("db-password=hunter2"),
        )
        .await
        .expect("acquire");
    m.request_step_down("vault", "ops").await.expect("ask");
    assert!(m.release(&lease).await.expect("release"));
    let key: String = sqlx::query_scalar("SELECT hashtext('vault')::text")
        .fetch_one(db.pool())
        .await
        .expect("key");
    let mut channels = Vec::new();
    while channels.len() < 2 || !channels.contains(&"pglease_release".to_owned()) {
        let heard = tokio::time::timeout(BOUND, eavesdropper.recv())
            .await
            .expect("a notification for each channel")
            .expect("recv");
        let payload = heard.payload();
        // Only the name's key, in decimal.
        assert_eq!(payload, key, "on {}", heard.channel());
        assert_ne!(payload, lease.token().to_string());
        for secret in ["billing-7", "hunter2", "vault"] {
            assert!(!payload.contains(secret), "{payload} reveals {secret}");
        }
        channels.push(heard.channel().to_owned());
    }
}

/// Whether table `ledger`'s guard triggers are as `protect` made them.
async fn ledger_intact(db: &TestDb) -> bool {
    sqlx::query_scalar("SELECT intact FROM pglease.protected WHERE tbl = 'ledger'::regclass")
        .fetch_one(db.pool())
        .await
        .expect("protected")
}

/// Reads `observer` until it reports the acquisition under `token`.
async fn until_acquired(observer: &mut pglease::observe::Observer, token: pglease::Token) {
    loop {
        match tokio::time::timeout(BOUND, observer.next()).await {
            Ok(Ok(Change::Acquired { token: t, .. })) if t == token => return,
            Ok(Ok(_)) => {}
            other => panic!("the acquisition under {token}: {other:?}"),
        }
    }
}

/// Finding 3: a role granted ALL (TRIGGER included) on a protected table
/// cannot re-point it at a lease it controls; where PostgreSQL lets it
/// remove the guard, the view and `doctor` say so.
async fn a_role_with_trigger_cannot_repoint_a_protected_table() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["app1", "app2"], &[]).await;
    let (app1, app2) = (&roles[0], &roles[1]);
    db.execute(&[
        "CREATE TABLE ledger (v text)".to_owned(),
        format!("ALTER TABLE ledger OWNER TO {app1}"),
        format!("GRANT ALL ON ledger TO {app2}"),
    ])
    .await;
    let mut owner = db.connect_as(app1).await;
    sqlx::query("SELECT pglease.protect('ledger', 'ledger-lease')")
        .execute(&mut owner)
        .await
        .expect("the owner protects");
    let mut attacker = db.connect_as(app2).await;
    assert_eq!(
        sqlstate_of(
            &mut attacker,
            "CREATE OR REPLACE TRIGGER pglease_protect BEFORE INSERT OR UPDATE OR DELETE ON ledger \
             FOR EACH STATEMENT EXECUTE FUNCTION pglease._guard('app2-lease')"
        )
        .await,
        None,
        "PostgreSQL lets a role with TRIGGER replace the trigger"
    );
    // It controls app2-lease, declares it, and writes: refused, because
    // the guard reads its lease from the binding.
    let mut tx = attacker.begin().await.expect("begin");
    sqlx::query("SELECT pglease.assert_held('app2-lease', (SELECT token FROM pglease.acquire('app2-lease', 'x', '1 min')))")
        .execute(&mut *tx)
        .await
        .expect("app2 holds its own lease");
    let refused = sqlx::query("INSERT INTO ledger VALUES ('forged')")
        .execute(&mut *tx)
        .await
        .expect_err("a write under another lease");
    assert_eq!(
        refused
            .as_database_error()
            .and_then(|d| d.code())
            .as_deref(),
        Some("LE002"),
        "{refused}"
    );
    drop(tx);
    let (name, intact): (String, bool) =
        sqlx::query_as("SELECT name, intact FROM pglease.protected WHERE tbl = 'ledger'::regclass")
            .fetch_one(db.pool())
            .await
            .expect("protected");
    assert_eq!((name.as_str(), intact), ("ledger-lease", true));
    // Replaced by a function of its own, the guard is gone: PostgreSQL
    // allows it, and the view and doctor name it.
    db.execute(&[
        "CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'",
    ])
    .await;
    assert_eq!(
        sqlstate_of(
            &mut attacker,
            "CREATE OR REPLACE TRIGGER pglease_protect BEFORE INSERT OR UPDATE OR DELETE ON ledger \
             FOR EACH STATEMENT EXECUTE FUNCTION noop()"
        )
        .await,
        None
    );
    let intact = ledger_intact(&db).await;
    assert!(!intact);
    let diagnosis = db
        .manager()
        .admin()
        .doctor(&pglease::doctor::DoctorOptions::default())
        .await
        .expect("doctor");
    let warnings: Vec<&str> = diagnosis
        .checks
        .iter()
        .filter(|c| c.name == "security" && c.verdict == pglease::doctor::Verdict::Warning)
        .map(|c| c.detail.as_str())
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("table public.ledger is NOT protected")),
        "{warnings:?}"
    );
    assert!(
        warnings.iter().any(|w| w.contains(&format!(
            "role {app2} holds TRIGGER on protected table public.ledger"
        ))),
        "{warnings:?}"
    );
    // The owner protects it again.
    sqlx::query("SELECT pglease.protect('ledger', 'ledger-lease')")
        .execute(&mut owner)
        .await
        .expect("protect again");
    let intact = ledger_intact(&db).await;
    assert!(intact);
}

/// Finding 4: tokens are public, authority is not. Another application
/// role cannot renew, release, publish under, check or write under a
/// lease app1 acquired, nor force it; a member of app1 and an
/// administrator can; the history names the role of each transition.
async fn only_the_acquiring_role_acts_under_a_token() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["app1", "app2", "svc", "ops"], &[]).await;
    let (app1, app2, svc, ops) = (&roles[0], &roles[1], &roles[2], &roles[3]);
    db.execute(&[
        format!("GRANT {app1} TO {svc}"),
        format!("GRANT pglease_admin TO {ops}"),
        "CREATE TABLE ledger (v text)".to_owned(),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON ledger TO {app1}, {app2}"),
        "SELECT pglease.protect('ledger', 'job')".to_owned(),
    ])
    .await;
    let m1 = db.manager_as(app1, ManagerOptions::default()).await;
    let m2 = db.manager_as(app2, ManagerOptions::default()).await;
    let lease = m1
        .acquire(
            "job",
            AcquireOptions::ttl(TTL).holder("worker-1").value("v1"),
        )
        .await
        .expect("app1 acquires");
    let fence = lease.fence().clone();
    let before = db.state().await;

    not_permitted("renew", m2.renew(&fence, TTL).await);
    not_permitted(
        "renew to 1 ms",
        m2.renew(&fence, Duration::from_millis(100)).await,
    );
    not_permitted("release", m2.release(&fence).await);
    not_permitted("set_value", m2.set_value(&fence, Some("evil")).await);
    not_permitted("begin_fenced", m2.begin_fenced(&fence).await.map(|_| ()));
    let mut c2 = db.connect_as(app2).await;
    let t = fence.token().get();
    for sql in [
        format!(
            "SELECT * FROM pglease.renew_many(ARRAY['job'], ARRAY[{t}::bigint], ARRAY['7 days'::interval])"
        ),
        format!(
            "BEGIN; SELECT pglease.assert_held('job', {t}); INSERT INTO ledger VALUES ('app2'); COMMIT"
        ),
        "SELECT pglease.force_release('job', 'not mine')".to_owned(),
    ] {
        assert_eq!(
            sqlstate_of(&mut c2, &sql).await.as_deref(),
            Some("42501"),
            "{sql}"
        );
        let _ = sqlstate_of(&mut c2, "ROLLBACK").await;
    }
    // Refused, nothing changed; the lease is still app1's.
    assert_eq!(db.state().await, before);
    assert!(m1.renew(&fence, TTL).await.is_ok(), "app1 renews");
    // A member of app1 acts under app1's token (here: publishes a value).
    let ms = db.manager_as(svc, ManagerOptions::default()).await;
    ms.set_value(&fence, Some("v2"))
        .await
        .expect("a member of app1");
    // A fenced write by app1 commits.
    let mut c1 = db.connect_as(app1).await;
    let mut tx = c1.begin().await.expect("begin");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT pglease.assert_held('job', {t}); INSERT INTO ledger VALUES ('app1')"
    )))
    .execute(&mut *tx)
    .await
    .expect("app1 writes under its lease");
    tx.commit().await.expect("commit");
    // An administrator forces it.
    let mo = db.manager_as(ops, ManagerOptions::default()).await;
    assert_eq!(
        mo.admin()
            .force_release("job", "INC-7")
            .await
            .expect("an administrator"),
        Some(fence.token())
    );
    let history = db.manager().history("job", None).await.expect("history");
    let who: Vec<(&str, Option<&str>)> = history
        .iter()
        .map(|t| (t.event.as_str(), t.role.as_deref()))
        .collect();
    assert_eq!(
        who,
        [
            ("acquired", Some(app1.as_str())),
            ("value", Some(app1.as_str())),
            ("value", Some(svc.as_str())),
            ("force_released", Some(ops.as_str())),
        ]
    );
    let rows: Vec<String> = sqlx::query_scalar("SELECT v FROM ledger")
        .fetch_all(db.pool())
        .await
        .expect("ledger");
    assert_eq!(rows, ["app1"]);
}

/// Finding 4, the principal: the login role counts. SET ROLE does not
/// change it (a session can always RESET ROLE), and through PgBouncer,
/// which logs in as each client's role, the roles stay apart.
async fn the_login_role_counts_also_through_a_pooler() -> Result<(), SetupError> {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["app1", "app2"], &[]).await;
    let (app1, app2) = (&roles[0], &roles[1]);
    // app2 cannot become app1; a superuser that SETs ROLE is still one.
    let mut c2 = db.connect_as(app2).await;
    assert_eq!(
        sqlstate_of(&mut c2, &format!("SET ROLE {app1}"))
            .await
            .as_deref(),
        Some("42501")
    );
    let mut admin = db.connect().await;
    sqlx::query(AssertSqlSafe(format!("SET ROLE {app2}")))
        .execute(&mut admin)
        .await
        .expect("set role");
    let token: i64 =
        sqlx::query_scalar("SELECT token FROM pglease.acquire('set-role', 'h', '1 min')")
            .fetch_one(&mut admin)
            .await
            .expect("acquire after SET ROLE");
    let role: String =
        sqlx::query_scalar("SELECT role::text FROM pglease.history WHERE name = 'set-role'")
            .fetch_one(db.pool())
            .await
            .expect("its history");
    assert_eq!(
        role,
        db.options().get_username(),
        "the login role is recorded, not the SET one"
    );
    assert_eq!(
        sqlstate_of(
            &mut c2,
            &format!("SELECT pglease.release('set-role', {token})")
        )
        .await
        .as_deref(),
        Some("42501"),
        "app2 may not release what a superuser acquired as app2"
    );

    let bouncer = PgBouncer::builder()
        .user(app1)
        .user(app2)
        .start(&db.options())?;
    let through = |role: &str| bouncer.options(&db.options()).username(role);
    let p1 = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(through(app1))
        .await
        .expect("app1 through pgbouncer");
    let p2 = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(through(app2))
        .await
        .expect("app2 through pgbouncer");
    let m1 = pglease::LeaseManager::with_options(p1, ManagerOptions::default().notify(false))
        .expect("manager");
    let m2 = pglease::LeaseManager::with_options(p2, ManagerOptions::default().notify(false))
        .expect("manager");
    let lease = m1
        .acquire("pooled", AcquireOptions::ttl(TTL))
        .await
        .expect("app1 acquires through pgbouncer");
    not_permitted("release through pgbouncer", m2.release(&lease).await);
    assert!(m1.release(&lease).await.expect("app1 releases"));
    let history = db.manager().history("pooled", None).await.expect("history");
    assert!(
        history
            .iter()
            .all(|t| t.role.as_deref() == Some(app1.as_str())),
        "{history:?}"
    );
    Ok(())
}

/// Finding 5: no session setting turns the history off, purges it or adds
/// to it; only an administrator sets its bounds.
async fn no_session_setting_rewrites_the_history() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["app1", "app2", "ops"], &[]).await;
    let (app1, app2, ops) = (&roles[0], &roles[1], &roles[2]);
    db.execute(&[format!("GRANT pglease_admin TO {ops}")]).await;
    let m1 = db.manager_as(app1, ManagerOptions::default()).await;
    let kept = m1
        .acquire("kept", AcquireOptions::ttl(Duration::from_millis(200)))
        .await
        .expect("acquire");
    let mut c2 = db.connect_as(app2).await;
    for sql in [
        "SET pglease.history_retention = '0'",
        "SELECT pglease.release('off', (SELECT token FROM pglease.acquire('off', 'h', '1 min')))",
        "SET pglease.history_retention = '1 microsecond'",
    ] {
        assert_eq!(sqlstate_of(&mut c2, sql).await, None, "{sql}");
    }
    for _ in 0..300 {
        let _ = sqlstate_of(
            &mut c2,
            "SELECT pglease.release('burn', (SELECT token FROM pglease.acquire('burn', 'h', '1 min')))",
        )
        .await;
    }
    let off = db.manager().history("off", None).await.expect("history");
    assert_eq!(off.len(), 2, "recorded despite the setting: {off:?}");
    let kept_rows = db.manager().history("kept", None).await.expect("history");
    assert_eq!(
        kept_rows.len(),
        1,
        "not purged by the setting: {kept_rows:?}"
    );
    // A forged eviction record before taking over an expired lease.
    db.wait_until(kept.expires_at()).await;
    assert_eq!(
        sqlstate_of(
            &mut c2,
            "SELECT set_config('pglease.evicted', '1:4242', false), \
                    set_config('pglease.reason', 'forged', false), \
                    pglease.acquire('kept', 'taker', '1 min')"
        )
        .await,
        None
    );
    let events: Vec<String> = db
        .manager()
        .history("kept", None)
        .await
        .expect("history")
        .iter()
        .map(|t| t.event.as_str().to_owned())
        .collect();
    assert_eq!(events, ["acquired", "expired", "acquired"]);
    // Only an administrator sets the bounds.
    assert_eq!(
        sqlstate_of(&mut c2, "SELECT pglease.set_history('0')")
            .await
            .as_deref(),
        Some("42501")
    );
    let mut co = db.connect_as(ops).await;
    assert_eq!(
        sqlstate_of(&mut co, "SELECT pglease.set_history('0')").await,
        None
    );
    let _ = sqlstate_of(
        &mut c2,
        "SELECT pglease.release('quiet', (SELECT token FROM pglease.acquire('quiet', 'h', '1 min')))",
    )
    .await;
    assert!(
        db.manager()
            .history("quiet", None)
            .await
            .expect("history")
            .is_empty()
    );
    assert_eq!(
        sqlstate_of(&mut co, "SELECT pglease.set_history('30 days', 10)")
            .await
            .as_deref(),
        Some("22023"),
        "a bound under 1,000 rows"
    );
}

/// Finding 6: no advisory key another role holds makes a lease wait
/// without bound: creating a name no longer uses one, observing answers
/// within about 2 s and then reads instead, a waiter polls, and a fenced
/// transaction's marker cannot be taken first.
async fn no_key_any_role_can_take_blocks_a_lease() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["nopriv"], &["nopriv"]).await;
    let mut squatter = db.connect_as(&roles[0]).await;
    for key in [
        "1886152033, hashtext('fresh')",
        "1886154594, hashtext('seen')",
        "1886156641, hashtext('awaited')",
    ] {
        sqlx::query(AssertSqlSafe(format!("SELECT pg_advisory_lock({key})")))
            .execute(&mut squatter)
            .await
            .expect("anyone may take an advisory key");
    }
    let options = ManagerOptions::default().max_poll_interval(Duration::from_millis(200));
    let m = db.manager_as("postgres", options).await;

    // The old first-acquisition key: not used any more.
    let started = Instant::now();
    let fresh = m
        .acquire("fresh", AcquireOptions::ttl(TTL))
        .await
        .expect("a new name despite the squatter");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // The observer key: observe answers (about 2 s), then the observer
    // reads the lease at its poll interval and still reports changes.
    let started = Instant::now();
    let mut observer = m.observe("seen").await.expect("observe");
    assert!(matches!(
        tokio::time::timeout(BOUND, observer.next()).await,
        Ok(Ok(Change::Current(_)))
    ));
    let seen = m
        .acquire("seen", AcquireOptions::ttl(TTL))
        .await
        .expect("acquire");
    until_acquired(&mut observer, seen.token()).await;
    assert!(started.elapsed() < BOUND, "{:?}", started.elapsed());

    // The watch key: the waiter is not woken by a notification, but it
    // polls, and gets the lease soon after the release.
    let holder = m
        .acquire("awaited", AcquireOptions::ttl(TTL))
        .await
        .expect("hold");
    let waiter = tokio::spawn({
        let m = m.clone();
        async move {
            m.acquire("awaited", AcquireOptions::ttl(TTL).wait(BOUND))
                .await
        }
    });
    poll_until("the waiter to wait", BOUND, || async {
        m.stats().waiting == 1
    })
    .await;
    assert!(m.release(&holder).await.expect("release"));
    let released = Instant::now();
    let next = tokio::time::timeout(BOUND, waiter)
        .await
        .expect("the waiter answers")
        .expect("joined")
        .expect("the waiter gets the lease");
    assert!(next.token() > holder.token());
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "{:?}",
        released.elapsed()
    );

    // The marker: the old key space, and every key nopriv can see held,
    // taken exclusively; a fenced transaction is still marked, and a
    // takeover after its lease expired ends it.
    let short = m
        .acquire("marked", AcquireOptions::ttl(Duration::from_millis(300)))
        .await
        .expect("acquire");
    sqlx::query("SELECT pg_advisory_lock(1886152293, g) FROM generate_series(1, 20) AS g")
        .execute(&mut squatter)
        .await
        .expect("the old marker keys");
    let mut frozen = db.connect().await;
    let mut tx = frozen.begin().await.expect("begin");
    sqlx::query("SELECT pglease.assert_held('marked', $1)")
        .bind(short.token().get())
        .execute(&mut *tx)
        .await
        .expect("marked despite the squatter");
    let fenced: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pglease.fenced WHERE name = 'marked'")
            .fetch_one(db.pool())
            .await
            .expect("fenced");
    assert_eq!(fenced, 1);
    db.wait_until(short.expires_at()).await;
    let started = Instant::now();
    let taken = m
        .acquire("marked", AcquireOptions::ttl(TTL))
        .await
        .expect("the takeover ends the frozen holder");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(taken.token() > short.token());
    assert!(tx.commit().await.is_err(), "the stale holder never commits");
    drop(fresh);
}

/// Finding 7: bounds. Step-down requests count once per term, a term's
/// values at most 16 times (1,000 characters each) in the history, a
/// token never issued is refused, ids and tokens are bigint.
async fn what_one_role_writes_is_bounded() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["app2"], &[]).await;
    let m = db.manager();
    let lease = m
        .acquire("payments", AcquireOptions::ttl(TTL))
        .await
        .expect("acquire");
    let mut c2 = db.connect_as(&roles[0]).await;
    for _ in 0..200 {
        assert_eq!(
            sqlstate_of(
                &mut c2,
                "SELECT pglease.request_step_down('payments', 'nag')"
            )
            .await,
            None
        );
    }
    for i in 0..40 {
        m.set_value(&lease, Some(&format!("{i}{}", "x".repeat(8000))))
            .await
            .expect("set value");
    }
    let history = m.history("payments", None).await.expect("history");
    let count = |e: &str| history.iter().filter(|t| t.event.as_str() == e).count();
    assert_eq!(count("step_down_requested"), 1);
    assert_eq!(count("value"), 16);
    assert!(
        history
            .iter()
            .filter_map(|t| t.detail.as_deref())
            .all(|d| d.chars().count() <= 1000)
    );
    // The status still shows the latest value whole.
    let status = m.inspect("payments").await.expect("inspect");
    assert!(
        status
            .value
            .as_deref()
            .is_some_and(|v| v.starts_with("39") && v.len() == 8002)
    );

    let never = pglease::Token::new(i64::MAX).expect("a token");
    match m.admit("payments-store", never).await {
        Err(Error::InvalidInput {
            argument: "token",
            reason,
        }) => {
            assert!(reason.contains("never been issued"), "{reason}")
        }
        other => panic!("a token never issued: {other:?}"),
    }
    assert!(
        m.admit("payments-store", lease.token())
            .await
            .expect("a real token")
    );
    let types: Vec<(String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text FROM information_schema.columns \
          WHERE table_schema = 'pglease' AND table_name = 'leases' AND column_name IN ('id', 'token') \
          ORDER BY column_name",
    )
    .fetch_all(db.pool())
    .await
    .expect("columns");
    assert_eq!(
        types,
        [
            ("id".to_owned(), "bigint".to_owned()),
            ("token".to_owned(), "bigint".to_owned())
        ]
    );
    let max: i64 = sqlx::query_scalar(
        "SELECT seqmax FROM pg_sequence WHERE seqrelid = 'pglease.lease_id_seq'::regclass",
    )
    .fetch_one(db.pool())
    .await
    .expect("sequence");
    assert_eq!(max, i64::MAX);
}

/// Names granted by prefix: only the granted role (or an administrator)
/// acquires them, counted leases and step-down requests included;
/// ungranted names stay open; only an administrator grants.
async fn names_granted_by_prefix_are_the_grantees_alone() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["app1", "app2"], &[]).await;
    let (app1, app2) = (&roles[0], &roles[1]);
    let m1 = db.manager_as(app1, ManagerOptions::default()).await;
    let m2 = db.manager_as(app2, ManagerOptions::default()).await;
    let mut c2 = db.connect_as(app2).await;
    assert_eq!(
        sqlstate_of(
            &mut c2,
            &format!("SELECT pglease.grant_names('billing/', '{app2}')")
        )
        .await
        .as_deref(),
        Some("42501")
    );
    sqlx::query("SELECT pglease.grant_names('billing/', $1)")
        .bind(app1)
        .execute(db.pool())
        .await
        .expect("an administrator grants");
    let before = db.state().await;
    not_permitted(
        "acquire billing/",
        m2.acquire("billing/invoices", AcquireOptions::ttl(TTL))
            .await,
    );
    not_permitted(
        "a counted lease under billing/",
        m2.acquire("billing/workers", AcquireOptions::ttl(TTL).limit(3))
            .await,
    );
    assert_eq!(
        db.state().await,
        before,
        "refused before anything was written"
    );
    let held = m1
        .acquire("billing/invoices", AcquireOptions::ttl(TTL))
        .await
        .expect("the grantee acquires");
    not_permitted(
        "a step-down request",
        m2.request_step_down("billing/invoices", "app2").await,
    );
    m1.acquire("billing/workers", AcquireOptions::ttl(TTL).limit(3))
        .await
        .expect("the grantee's counted lease");
    m2.acquire("reports", AcquireOptions::ttl(TTL))
        .await
        .expect("ungranted names are open");
    sqlx::query("SELECT pglease.revoke_names('billing/', $1)")
        .bind(app1)
        .execute(db.pool())
        .await
        .expect("revoke");
    m2.acquire("billing/other", AcquireOptions::ttl(TTL))
        .await
        .expect("open again");
    assert!(m1.release(&held).await.expect("release"));
}

/// The single-role set-up docs/design.md starts with ("Roles and grants") needs no step beyond
/// USAGE on the schema: one login role acquires, renews, writes fenced,
/// observes, waits and releases.
async fn one_application_role_needs_no_set_up() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["app"], &[]).await;
    let m = db.manager_as(&roles[0], ManagerOptions::default()).await;
    let mut observer = m.observe("job").await.expect("observe");
    let held = m
        .hold(
            "job",
            AcquireOptions::ttl(Duration::from_secs(5)).value("here"),
        )
        .await
        .expect("hold");
    let mut tx = held.begin_fenced().await.expect("fenced");
    tx.recheck().await.expect("recheck");
    tx.commit().await.expect("commit");
    m.renew(held.lease(), Duration::from_secs(5))
        .await
        .expect("renew");
    until_acquired(&mut observer, held.token()).await;
    let waiter = tokio::spawn({
        let m = m.clone();
        async move { m.acquire("job", AcquireOptions::ttl(TTL).wait(BOUND)).await }
    });
    poll_until("the waiter to wait", BOUND, || async {
        m.stats().waiting == 1
    })
    .await;
    let first = held.token();
    held.release().await.expect("release");
    let next = tokio::time::timeout(BOUND, waiter)
        .await
        .expect("waiter")
        .expect("joined")
        .expect("acquired");
    assert!(next.token() > first);
}

/// The bounded takeover, whoever the roles: a holder frozen inside
/// a fenced transaction is ended once its lease expires, by an acquirer of
/// the same role or of another.
async fn a_frozen_fenced_holder_is_ended_for_every_role_set_up() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["app1", "app2"], &[]).await;
    for (holder, taker) in [(&roles[0], &roles[0]), (&roles[0], &roles[1])] {
        let name = format!("job-{taker}");
        let mh = db.manager_as(holder, ManagerOptions::default()).await;
        let mt = db.manager_as(taker, ManagerOptions::default()).await;
        let short = mh
            .acquire(&name, AcquireOptions::ttl(Duration::from_millis(300)))
            .await
            .expect("acquire");
        let mut frozen = db.connect_as(holder).await;
        let mut tx = frozen.begin().await.expect("begin");
        sqlx::query("SELECT pglease.assert_held($1, $2)")
            .bind(&name)
            .bind(short.token().get())
            .execute(&mut *tx)
            .await
            .expect("fenced");
        db.wait_until(short.expires_at()).await;
        let started = Instant::now();
        let taken = mt
            .acquire(&name, AcquireOptions::ttl(TTL))
            .await
            .expect("the takeover");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(taken.token() > short.token());
        assert!(
            tx.commit().await.is_err(),
            "the frozen holder never commits"
        );
        poll_until("the ended session to go", BOUND, || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pglease.fenced WHERE name = $1")
                .bind(&name)
                .fetch_one(db.pool())
                .await
                .expect("fenced")
                == 0
        })
        .await;
    }
}

pglease_formations::tests![
    a_forged_notification_changes_nothing_an_observer_or_elector_reports(2),
    a_listener_learns_no_token_holder_value_or_name,
    a_role_with_trigger_cannot_repoint_a_protected_table,
    only_the_acquiring_role_acts_under_a_token,
    the_login_role_counts_also_through_a_pooler,
    no_session_setting_rewrites_the_history,
    no_key_any_role_can_take_blocks_a_lease(2),
    what_one_role_writes_is_bounded,
    names_granted_by_prefix_are_the_grantees_alone,
    one_application_role_needs_no_set_up(2),
    a_frozen_fenced_holder_is_ended_for_every_role_set_up,
];
