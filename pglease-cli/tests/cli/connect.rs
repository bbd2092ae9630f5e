//! Where the binary connects: several hosts wherever a URL is taken, and
//! a server that is not PostgreSQL named as such.

use std::process::Command;

use crate::common::{BIN, code, pglease, stderr, stdout};

/// Several hosts, as libpq takes them, in every place a URL is taken: a
/// URL in --database-url, a keyword=value string in DATABASE_URL, PGHOST
/// and PGPORT lists; the host that refuses (port 1) is passed over. Lists
/// that do not fit and attributes that cannot be written exit 2 before
/// anything connects.
async fn several_hosts_are_taken_wherever_a_url_is() {
    let db = crate::common::new_db().await;
    let options = db.options();
    let (host, port, user) = (
        options.get_host(),
        options.get_port(),
        options.get_username(),
    );
    let database = options.get_database().unwrap_or("postgres");
    assert_eq!(code(&pglease(&db, &["acquire", "multi", "--ttl", "1m"])), 0);
    let in_url = host.replace('/', "%2F");
    let url = format!("postgres://{user}@127.0.0.1:1,{in_url}:{port}/{database}");
    let keywords = format!("host=127.0.0.1,{host} port=1,{port} user={user} dbname={database}");
    let runs = [
        Command::new(BIN)
            .args(["--database-url", &url, "status", "multi"])
            .output(),
        Command::new(BIN)
            .env("DATABASE_URL", &keywords)
            .args(["status", "multi"])
            .output(),
        Command::new(BIN)
            .env_remove("DATABASE_URL")
            .env("PGHOST", format!("127.0.0.1,{host}"))
            .env("PGPORT", format!("1,{port}"))
            .env("PGUSER", user)
            .env("PGDATABASE", database)
            .args(["status", "multi"])
            .output(),
        // A URL without a host takes PGHOST's list, as libpq does.
        Command::new(BIN)
            .env("PGHOST", format!("127.0.0.1,{host}"))
            .env("PGPORT", format!("1,{port}"))
            .args(["--database-url", &format!("postgres://{user}@/{database}")])
            .args(["status", "multi"])
            .output(),
    ];
    for out in runs {
        let out = out.expect("run the pglease binary");
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(stdout(&out).contains("multi"), "{}", stdout(&out));
    }
    for (url, said) in [
        (
            "postgres://postgres@127.0.0.1/postgres?target_session_attrs=standby",
            "cannot be written",
        ),
        (
            "postgres://postgres@a,b,c/postgres?port=1,2",
            "3 hosts and 2 ports",
        ),
        ("host=a dbnme=x", "dbnme"),
    ] {
        let out = Command::new(BIN)
            .args(["--database-url", url, "status"])
            .output()
            .expect("run the pglease binary");
        assert_eq!(code(&out), 2, "{url}: {}", stderr(&out));
        assert!(stderr(&out).contains(said), "{url}: {}", stderr(&out));
    }
    let out = Command::new(BIN)
        .env_remove("DATABASE_URL")
        .env("PGHOST", "127.0.0.1,127.0.0.2")
        .env("PGPORT", "1,2,3")
        .arg("status")
        .output()
        .expect("run the pglease binary");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("PGHOST"), "{}", stderr(&out));
}

/// A URL of another database is refused before connecting (exit 2); a
/// server that answers, but not as PostgreSQL (here an HTTP server), is
/// named as such (exit 5).
async fn another_kind_of_server_is_named_as_such() {
    let out = Command::new(BIN)
        .args(["--database-url", "mysql://root@127.0.0.1/x", "status"])
        .output()
        .expect("run");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("mysql://"), "{}", stderr(&out));
    let http = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = http.local_addr().expect("address").port();
    let answering = std::thread::spawn(move || {
        use std::io::{Read, Write};
        if let Ok((mut client, _)) = http.accept() {
            let mut request = [0_u8; 1024];
            let _ = client.read(&mut request);
            let _ = client.write_all(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let out = Command::new(BIN)
        .args([
            "--database-url",
            &format!("postgres://nobody@127.0.0.1:{port}/x"),
            "status",
        ])
        .output()
        .expect("run");
    let said = stderr(&out);
    assert_eq!(code(&out), 5, "{said}");
    assert!(said.contains("PostgreSQL's protocol"), "{said}");
    assert!(!said.contains("1414811696"), "{said}");
    let _ = answering.join();
}

pglease_formations::tests![
    another_kind_of_server_is_named_as_such,
    several_hosts_are_taken_wherever_a_url_is,
];
