//! Connecting: a refused connection fails at once with its cause, a server
//! that never answers fails after the timeout, and the manager's
//! connections tell the server to abandon a statement whose client is gone.

use std::time::{Duration, Instant};

use crate::common::TestDb;
use pglease::connect::Target;
use pglease::{AcquireOptions, Error, LeaseManager};
use sqlx::postgres::PgConnectOptions;

async fn a_refused_connection_fails_at_once_with_its_cause() {
    let options = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(1)
        .username("nobody");
    let started = Instant::now();
    let error = LeaseManager::connect_with(options, Duration::from_secs(20))
        .await
        .expect_err("nothing listens on port 1");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "gave up after {:?}, not at once",
        started.elapsed()
    );
    assert!(matches!(error, Error::Database(_)), "{error:?}");
    assert!(error.to_string().contains("refused"), "{error}");
}

async fn a_server_that_never_answers_fails_after_the_timeout() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = silent.local_addr().expect("address").port();
    let options = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(port)
        .username("nobody");
    let error = LeaseManager::connect_with(options, Duration::from_millis(500))
        .await
        .expect_err("the server never answers");
    assert!(error.to_string().contains("no answer"), "{error}");
    drop(silent);
}

async fn the_managers_connections_abandon_statements_of_a_client_that_is_gone() {
    let db = TestDb::new().await;
    let m = LeaseManager::connect(&db.url()).await.expect("connect");
    let interval: String = sqlx::query_scalar("SHOW client_connection_check_interval")
        .fetch_one(m.pool())
        .await
        .expect("show");
    assert_eq!(interval, "1s");
    m.pool().close().await;
}

/// Several hosts are tried in order, as libpq tries them: a host that
/// refuses is passed over at once, and the manager uses the first that
/// answers; the same from a `keyword=value` string.
async fn several_hosts_are_tried_in_order() {
    let db = TestDb::new().await;
    let options = db.options();
    let database = options.get_database().unwrap_or("postgres").to_owned();
    let (host, port, user) = (
        options.get_host(),
        options.get_port(),
        options.get_username(),
    );
    let in_url = host.replace('/', "%2F");
    for conninfo in [
        format!("postgres://{user}@127.0.0.1:1,{in_url}:{port}/{database}"),
        format!("host=127.0.0.1,{host} port=1,{port} user={user} dbname={database}"),
        format!("postgres://{user}@/{database}?host=127.0.0.1,{host}&port=1,{port}"),
    ] {
        let started = Instant::now();
        let m = LeaseManager::connect(&conninfo)
            .await
            .unwrap_or_else(|e| panic!("{conninfo}: {e}"));
        assert!(started.elapsed() < Duration::from_secs(5), "{conninfo}");
        assert_eq!(m.admin().current_host(), Some(format!("{host}:{port}")));
        let lease = m
            .acquire("multi", AcquireOptions::ttl(Duration::from_secs(5)))
            .await
            .expect("acquire through the second host");
        m.release(&lease).await.expect("release");
        m.shutdown().await.expect("shutdown");
    }
}

/// No host will do: each is named with why, at once.
async fn no_usable_host_names_each_with_why() {
    let error = LeaseManager::connect("postgres://postgres@127.0.0.1:1,127.0.0.1:2/postgres")
        .await
        .expect_err("nothing listens on ports 1 and 2");
    let said = error.to_string();
    assert!(said.contains("127.0.0.1:1"), "{said}");
    assert!(said.contains("127.0.0.1:2"), "{said}");
    assert!(said.contains("refused"), "{said}");
}

/// Attributes pglease cannot work with, and lists that do not fit, are
/// refused before anything connects.
async fn bad_hosts_or_attributes_are_refused_before_connecting() {
    for (url, said) in [
        (
            "postgres://postgres@127.0.0.1/postgres?target_session_attrs=standby",
            "cannot be written",
        ),
        (
            "postgres://postgres@127.0.0.1/postgres?target_session_attrs=read-only",
            "cannot be written",
        ),
        (
            "postgres://postgres@127.0.0.1/postgres?target_session_attrs=bogus",
            "not one libpq knows",
        ),
        (
            "postgres://postgres@a,b,c/postgres?port=1,2",
            "3 hosts and 2 ports",
        ),
        ("postgres://postgres@a,,b/postgres", "empty entry"),
    ] {
        let started = Instant::now();
        match LeaseManager::connect(url).await {
            Err(
                e @ Error::InvalidInput {
                    argument: "url", ..
                },
            ) => assert!(e.to_string().contains(said), "{url}: {e}"),
            other => panic!("{url}: expected InvalidInput, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_millis(100), "{url}");
    }
}

/// A URL of another database (`mysql://`, which sqlx would read as
/// PostgreSQL's) or no URL at all is refused before anything connects;
/// both spellings of PostgreSQL's scheme are taken.
async fn a_url_that_is_not_postgresqls_is_refused_before_connecting() {
    for url in [
        "mysql://root@127.0.0.1/x",
        "redis://127.0.0.1:6379",
        "127.0.0.1:5432",
    ] {
        let started = Instant::now();
        match LeaseManager::connect(url).await {
            Err(
                e @ Error::InvalidInput {
                    argument: "url", ..
                },
            ) => assert!(e.to_string().contains("postgres://"), "{url}: {e}"),
            other => panic!("{url}: expected InvalidInput, got {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "{url}: refused at once"
        );
    }
    for url in ["postgres://u@h/db", "postgresql://u@h/db"] {
        Target::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
}

/// Something that answers, but not as PostgreSQL does (an HTTP server on
/// the port): said as such, not as the protocol decoder's arithmetic.
async fn a_server_that_is_not_postgresql_is_named_as_such() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let port = listener.local_addr().expect("address").port();
    let http = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut client, _)) = listener.accept().await {
            let mut request = [0_u8; 1024];
            let _ = client.read(&mut request).await;
            let _ = client
                .write_all(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                .await;
        }
    });
    let options = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(port)
        .username("nobody");
    let error = LeaseManager::connect_with(options, Duration::from_secs(5))
        .await
        .expect_err("an HTTP server is not PostgreSQL");
    let said = error.to_string();
    assert!(said.contains("PostgreSQL's protocol"), "{said}");
    assert!(said.contains(&format!("127.0.0.1:{port}")), "{said}");
    assert!(!said.contains("1414811696"), "{said}");
    http.abort();
}

pglease_formations::tests![
    a_url_that_is_not_postgresqls_is_refused_before_connecting,
    a_server_that_is_not_postgresql_is_named_as_such,
    a_refused_connection_fails_at_once_with_its_cause,
    a_server_that_never_answers_fails_after_the_timeout,
    the_managers_connections_abandon_statements_of_a_client_that_is_gone,
    several_hosts_are_tried_in_order,
    no_usable_host_names_each_with_why,
    bad_hosts_or_attributes_are_refused_before_connecting,
];
