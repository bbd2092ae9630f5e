//! On the server users have in production (`pglease_formations::TlsServer`:
//! TLS only, `scram-sha-256`, a CA made at test time, a database owned by a
//! role that is neither a superuser nor in `pg_signal_backend`): every lease
//! operation over `verify-full`, a certificate from another CA refused, a
//! connection without TLS refused by the server, libpq's `allow` and
//! `prefer` reaching it over TLS, the password read from a password file
//! for each connection, and the takeover behind a frozen fenced holder of
//! another role pinned and said so, as documented for such an owner.

use std::time::Duration;

use pglease::connect::Target;
use pglease::{AcquireOptions, Error, LeaseManager};
use pglease_formations::{SetupError, TlsServer};
use sqlx::Row;

/// Whether the pool's connections are encrypted, as the server sees them.
async fn encrypted(manager: &LeaseManager) -> (bool, String) {
    let row = sqlx::query(
        "SELECT ssl, coalesce(version, '') FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )
    .fetch_one(manager.pool())
    .await
    .expect("read pg_stat_ssl");
    (row.get(0), row.get(1))
}

async fn every_operation_works_as_the_owner_over_verify_full() -> Result<(), SetupError> {
    let server = TlsServer::start().await?;
    let m = LeaseManager::connect(&server.url("sslmode=verify-full"))
        .await
        .expect("connect over verify-full");
    assert!(encrypted(&m).await.0);
    m.migrate().await.expect("migrate as a non-superuser owner");
    // What the owner lacks is known and said (docs/design.md).
    assert!(!m.admin().can_end_stale_transactions().await.expect("ask"));
    sqlx::raw_sql(
        "CREATE TABLE data (id int PRIMARY KEY, value text NOT NULL, token bigint); \
         INSERT INTO data VALUES (1, 'initial', NULL)",
    )
    .execute(m.pool())
    .await
    .expect("create the data table");
    let ttl = Duration::from_secs(30);
    let lease = m
        .acquire("nightly", AcquireOptions::ttl(ttl))
        .await
        .expect("acquire");
    m.renew(&lease, ttl).await.expect("renew");
    // A guarded write: assert_held, then the write, in one transaction.
    let mut tx = m.pool().begin().await.expect("begin");
    sqlx::query("SELECT pglease.assert_held($1, $2)")
        .bind(lease.name())
        .bind(lease.token())
        .execute(&mut *tx)
        .await
        .expect("assert_held");
    sqlx::query("UPDATE data SET value = 'guarded', token = $1 WHERE id = 1")
        .bind(lease.token())
        .execute(&mut *tx)
        .await
        .expect("guarded write");
    tx.commit().await.expect("commit the guarded write");
    // A fenced transaction.
    let mut fenced = m.begin_fenced(&lease).await.expect("begin_fenced");
    sqlx::query("UPDATE data SET value = 'fenced' WHERE id = 1")
        .execute(&mut *fenced)
        .await
        .expect("fenced write");
    fenced.commit().await.expect("commit the fenced write");
    assert!(m.release(&lease).await.expect("release"));
    // Safety over TLS as anywhere: the next holder's token is larger, and
    // the old token's write is refused by the database.
    let next = m
        .acquire("nightly", AcquireOptions::ttl(ttl))
        .await
        .expect("acquire again");
    assert!(next.token() > lease.token());
    match m.begin_fenced(&lease).await {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("a stale token's fenced transaction must be refused, got {other:?}"),
    }
    let value: String = sqlx::query_scalar("SELECT value FROM data WHERE id = 1")
        .fetch_one(m.pool())
        .await
        .expect("read");
    assert_eq!(value, "fenced");
    Ok(())
}

async fn a_certificate_from_another_ca_is_refused() -> Result<(), SetupError> {
    let server = TlsServer::start().await?;
    let url = server.url("sslmode=verify-full").replace(
        &server.ca().display().to_string(),
        &server.wrong_ca().display().to_string(),
    );
    match LeaseManager::connect(&url).await {
        Err(e @ Error::Database(sqlx::Error::Tls(_))) => {
            let text = e.to_string();
            assert!(text.contains("certificate"), "{text}");
            assert!(text.contains("UnknownIssuer"), "{text}");
            assert!(text.contains("wrong-ca.crt"), "{text}");
        }
        other => panic!("expected a TLS error about the certificate, got {other:?}"),
    }
    Ok(())
}

async fn a_connection_without_tls_is_refused_by_the_server() -> Result<(), SetupError> {
    let server = TlsServer::start().await?;
    match LeaseManager::connect(&server.url("sslmode=disable")).await {
        Err(e) => {
            assert_eq!(e.sqlstate(), Some("28000"), "{e}");
            assert!(e.to_string().contains("no encryption"), "{e}");
        }
        Ok(_) => panic!("a TLS-only server accepted a connection without TLS"),
    }
    Ok(())
}

async fn allow_and_prefer_reach_a_tls_only_server_over_tls() -> Result<(), SetupError> {
    let server = TlsServer::start().await?;
    for mode in ["allow", "prefer", "require", "verify-ca"] {
        let m = LeaseManager::connect(&server.url(&format!("sslmode={mode}")))
            .await
            .unwrap_or_else(|e| panic!("sslmode={mode}: {e}"));
        let (ssl, version) = encrypted(&m).await;
        assert!(ssl, "sslmode={mode}");
        assert!(version.starts_with("TLSv1."), "sslmode={mode}: {version}");
        // The pool's later connections too (the mode that worked is kept).
        let mut more = Vec::new();
        for _ in 0..3 {
            more.push(m.pool().acquire().await.expect("another connection"));
        }
        drop(more);
    }
    Ok(())
}

async fn the_password_is_read_from_the_password_file_for_each_connection() -> Result<(), SetupError>
{
    let server = TlsServer::start().await?;
    let dir = std::env::temp_dir().join(format!("pglease-passfile-it-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let passfile = dir.join("pgpass");
    let write = |line: &str, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&passfile, line).expect("write the password file");
        std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    write(&server.passfile_line(), 0o600);
    let url = server.url_without_password(&format!(
        "sslmode=verify-full&sslrootcert={}&passfile={}",
        server.ca().display(),
        passfile.display()
    ));
    let target = Target::parse(&url).expect("parse");
    let (connection, _) = target
        .connect(Duration::from_secs(10))
        .await
        .expect("connect with the password file's password");
    drop(connection);

    // Rotated: the role's password changes and the file with it; the same
    // target's next connection reads the new one.
    let mut admin = sqlx::ConnectOptions::connect(&server.admin())
        .await
        .expect("admin");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER ROLE {} PASSWORD 'rotated-1'",
        TlsServer::USER
    )))
    .execute(&mut admin)
    .await
    .expect("rotate the password");
    assert!(target.connect(Duration::from_secs(10)).await.is_err());
    write(
        &server.passfile_line().replace(
            &TlsServer::PASSWORD
                .replace('\\', "\\\\")
                .replace(':', "\\:"),
            "rotated-1",
        ),
        0o600,
    );
    target
        .connect(Duration::from_secs(10))
        .await
        .expect("the rotated password is read again");

    // A file others may read is ignored, as libpq ignores it, and said.
    write(
        &server.passfile_line().replace(
            &TlsServer::PASSWORD
                .replace('\\', "\\\\")
                .replace(':', "\\:"),
            "rotated-1",
        ),
        0o644,
    );
    assert!(target.connect(Duration::from_secs(10)).await.is_err());
    let problem = target.passfile_problem(0).expect("the file's problem");
    assert!(problem.contains("group or world access"), "{problem}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

async fn a_frozen_holder_of_another_role_pins_the_lease_and_says_so() -> Result<(), SetupError> {
    let server = TlsServer::start().await?;
    let owner = LeaseManager::connect(&server.url("sslmode=verify-full"))
        .await
        .expect("connect as the owner");
    owner.migrate().await.expect("migrate");
    let mut admin = sqlx::ConnectOptions::connect(&server.admin())
        .await
        .expect("admin");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE worker LOGIN PASSWORD 'worker-pw'; \
         GRANT CONNECT ON DATABASE {} TO worker",
        TlsServer::DATABASE
    )))
    .execute(&mut admin)
    .await
    .expect("create the worker role");
    sqlx::raw_sql(
        "GRANT USAGE ON SCHEMA pglease TO worker; \
         CREATE TABLE log (token bigint NOT NULL); GRANT SELECT, INSERT ON log TO worker",
    )
    .execute(owner.pool())
    .await
    .expect("grant the worker what it needs");
    let worker_url = as_user(&server.url("sslmode=verify-full"), "worker", "worker-pw");
    let worker = LeaseManager::connect(&worker_url)
        .await
        .expect("connect as the worker");
    let held = worker
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_secs(1)).holder("A"),
        )
        .await
        .expect("A acquires");
    let mut tx = worker
        .begin_fenced(&held)
        .await
        .expect("A's fenced transaction");
    sqlx::query("INSERT INTO log VALUES ($1)")
        .bind(held.token())
        .execute(&mut *tx)
        .await
        .expect("A writes, then freezes inside its transaction");
    // Wait for the expiry on the database clock.
    let expires = held.expires_at();
    pglease::testing::poll_until("the lease's expiry", Duration::from_secs(10), || async {
        let now: Option<chrono::DateTime<chrono::Utc>> =
            sqlx::query_scalar("SELECT clock_timestamp()")
                .fetch_one(owner.pool())
                .await
                .ok();
        now.is_some_and(|now| now >= expires)
    })
    .await;
    let b = LeaseManager::new(worker.pool().clone());
    match b
        .acquire(
            "job",
            AcquireOptions::ttl(Duration::from_secs(30)).holder("B"),
        )
        .await
    {
        Err(Error::Pinned { reason, .. }) => {
            assert!(
                reason.contains(&format!("GRANT pg_signal_backend TO {}", TlsServer::USER)),
                "{reason}"
            );
        }
        other => panic!("expected Pinned, with the missing grant, got {other:?}"),
    }
    // Safety: A's transaction still cannot commit under its ended lease
    // once someone holds it; liveness returns as soon as it ends.
    drop(tx);
    let taken = tokio::time::timeout(
        Duration::from_secs(5),
        b.acquire(
            "job",
            AcquireOptions::ttl(Duration::from_secs(30))
                .holder("B")
                .wait(Duration::from_secs(3)),
        ),
    )
    .await
    .expect("bounded")
    .expect("B acquires once A's transaction has ended");
    assert!(taken.token() > held.token());
    Ok(())
}

/// A password that changes while the manager runs (a cloud IAM token):
/// once the pool's connections are gone, new ones fail to log in with the
/// old password, and `set_password` makes the next one log in; the lease
/// held across the change is renewed, not lost.
async fn a_password_set_while_running_is_used_by_new_connections() -> Result<(), SetupError> {
    let server = TlsServer::start().await?;
    let owner = LeaseManager::connect(&server.url("sslmode=verify-full"))
        .await
        .expect("connect as the owner");
    owner.migrate().await.expect("migrate");
    let mut admin = sqlx::ConnectOptions::connect(&server.admin())
        .await
        .expect("admin");
    sqlx::raw_sql("CREATE ROLE rotating LOGIN PASSWORD 'first-pw'")
        .execute(&mut admin)
        .await
        .expect("create the role");
    sqlx::raw_sql("GRANT USAGE ON SCHEMA pglease TO rotating")
        .execute(owner.pool())
        .await
        .expect("grant");
    let url = as_user(&server.url("sslmode=verify-full"), "rotating", "first-pw");
    let m = LeaseManager::connect(&url).await.expect("connect");
    let ttl = Duration::from_secs(30);
    let lease = m
        .acquire("rotated", AcquireOptions::ttl(ttl))
        .await
        .expect("acquire");
    // The token expires: the server takes only the new password, and the
    // connections made with the old one are gone.
    sqlx::raw_sql(
        "ALTER ROLE rotating PASSWORD 'second-pw';          SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'rotating'",
    )
    .execute(&mut admin)
    .await
    .expect("change the password, end the sessions");
    pglease::testing::poll_until("the old sessions gone", Duration::from_secs(10), || {
        let admin = server.admin();
        async move {
            let mut c = match sqlx::ConnectOptions::connect(&admin).await {
                Ok(c) => c,
                Err(_) => return false,
            };
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = 'rotating'",
            )
            .fetch_one(&mut c)
            .await
            .unwrap_or(-1);
            n == 0
        }
    })
    .await;
    let refused = m.renew(&lease, ttl).await.expect_err("the old password");
    assert_eq!(refused.sqlstate(), Some("28P01"), "{refused:?}");
    m.set_password("second-pw");
    let expires = m
        .renew(&lease, ttl)
        .await
        .expect("renew with the new password");
    // The lease held across the change: same token, the renewal recorded.
    let status = owner.inspect("rotated").await.expect("inspect");
    assert!(status.held, "{status:?}");
    assert_eq!(status.token, Some(lease.token()));
    assert_eq!(status.expires_at, Some(expires));
    Ok(())
}

/// `url` for `user` with `password` (URL-safe as given).
fn as_user(url: &str, user: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (_, tail) = rest.split_once('@').expect("user info");
    format!("{scheme}://{user}:{password}@{tail}")
}

pglease_formations::tests![
    every_operation_works_as_the_owner_over_verify_full,
    a_certificate_from_another_ca_is_refused,
    a_connection_without_tls_is_refused_by_the_server,
    allow_and_prefer_reach_a_tls_only_server_over_tls,
    the_password_is_read_from_the_password_file_for_each_connection,
    a_frozen_holder_of_another_role_pins_the_lease_and_says_so,
    a_password_set_while_running_is_used_by_new_connections,
];
