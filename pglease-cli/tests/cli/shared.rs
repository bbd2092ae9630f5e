//! Shared leases from the command line: `acquire --shared` and `run
//! --shared` hold a name together, each with a token of its own; an
//! exclusive run waits for them and is served when the last one releases;
//! a shared run's command reads under its token (`pglease.assert_shared`,
//! `PGLEASE_SHARED=1`) and cannot write under it; and the combinations
//! that cannot work are refused before connecting.

use std::process::Stdio;
use std::time::Instant;

use crate::common::{
    BOUND, TestDb, code, command, json, pglease, poll_until, stderr, stdout, wait_bounded,
};

/// Whether an exclusive acquirer waits for the shared holders of `name`.
async fn writer_waits(db: &TestDb, name: &str) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pglease.leases \
          WHERE name = $1 AND writer_waits_until > clock_timestamp())",
    )
    .bind(name)
    .fetch_one(db.pool())
    .await
    .expect("read the lease row")
}

/// Two shared acquisitions hold the name; `run --shared` reads under its
/// token and its write is refused; an exclusive acquisition exits 3
/// saying how many hold it shared; an exclusive `run --wait` waits for the shared holders and
/// starts once the last has released (exit 0); bad combinations exit 2.
async fn shared_holders_from_the_command_line() {
    let db = crate::common::new_db().await;
    sqlx::query("CREATE TABLE log (id bigserial PRIMARY KEY, token bigint NOT NULL)")
        .execute(db.pool())
        .await
        .expect("create the log");
    db.manager()
        .admin()
        .protect("log", "doc")
        .await
        .expect("protect");

    let acquire = |holder: &str| {
        pglease(
            &db,
            &[
                "acquire", "doc", "--ttl", "10m", "--shared", "--holder", holder, "--json",
            ],
        )
    };
    let (a, b) = (acquire("A"), acquire("B"));
    assert_eq!(code(&a), 0, "{}", stderr(&a));
    assert_eq!(code(&b), 0, "{}", stderr(&b));
    let (a, b) = (json(&a), json(&b));
    assert_eq!(a["shared"], true);
    let (ta, tb) = (
        a["token"].as_i64().expect("A's token"),
        b["token"].as_i64().expect("B's token"),
    );
    assert!(tb > ta, "each shared holder has its own token");

    // A shared run: its command reads under its token; a write under it
    // is refused by the database (LE001, reason shared).
    let script = "echo shared=$PGLEASE_SHARED; \
        psql \"$PGLEASE_DATABASE_URL\" -qAt -v ON_ERROR_STOP=1 \
          -c \"BEGIN; SELECT pglease.assert_shared('$PGLEASE_NAME', $PGLEASE_TOKEN); \
               SELECT count(*) FROM log; COMMIT;\" >/dev/null && echo read; \
        psql \"$PGLEASE_DATABASE_URL\" -qAt -v ON_ERROR_STOP=1 \
          -c \"BEGIN; SELECT pglease.assert_held('$PGLEASE_NAME', $PGLEASE_TOKEN); \
               INSERT INTO log (token) VALUES ($PGLEASE_TOKEN); COMMIT;\" >/dev/null 2>&1 \
          && echo wrote || echo write refused";
    let run = pglease(
        &db,
        &[
            "run", "doc", "--shared", "--ttl", "10s", "--", "sh", "-c", script,
        ],
    );
    assert_eq!(code(&run), 0, "{}", stderr(&run));
    assert_eq!(stdout(&run).trim(), "shared=1\nread\nwrite refused");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM log")
        .fetch_one(db.pool())
        .await
        .expect("count");
    assert_eq!(rows, 0, "no write under a shared token");

    // A one-shot exclusive acquisition is refused, saying it is held shared.
    let refused = pglease(&db, &["acquire", "doc", "--ttl", "10m", "--holder", "W"]);
    assert_eq!(code(&refused), 3, "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("\"doc\" is held shared by 2 holder(s)"),
        "{}",
        stderr(&refused)
    );

    // An exclusive run waits for A and B, and keeps new shared holders out.
    let writer = command(
        &db,
        &[
            "run", "doc", "--ttl", "10s", "--wait", "30s", "--holder", "W", "--", "true",
        ],
    )
    .stdout(Stdio::null())
    .spawn()
    .expect("start the exclusive run");
    poll_until("the exclusive run to wait", BOUND, || {
        writer_waits(&db, "doc")
    })
    .await;
    let late = pglease(
        &db,
        &[
            "acquire", "doc", "--ttl", "10m", "--shared", "--holder", "C",
        ],
    );
    assert_eq!(
        code(&late),
        3,
        "a new shared holder waits behind W: {}",
        stderr(&late)
    );
    let release = |token: i64| pglease(&db, &["release", "doc", "--token", &token.to_string()]);
    assert_eq!(code(&release(ta)), 0);
    assert_eq!(code(&release(tb)), 0);
    let released = Instant::now();
    let status = wait_bounded(writer).await;
    assert_eq!(
        status.code(),
        Some(0),
        "the exclusive run ran after the shared holders"
    );
    println!(
        "exclusive run done {:?} after the last shared release",
        released.elapsed()
    );

    // Refused before connecting.
    for args in [
        &["acquire", "doc", "--ttl", "1m", "--shared", "--limit", "2"][..],
        &[
            "run",
            "doc",
            "--ttl",
            "1m",
            "--shared",
            "--session-bound",
            "--",
            "true",
        ],
        &[
            "run", "doc", "--ttl", "1m", "--shared", "--fair", "--", "true",
        ],
        &["run", "a", "b", "--ttl", "1m", "--shared", "--", "true"],
    ] {
        let out = crate::common::pglease_on("postgres://nobody@127.0.0.1:1/none", args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
    }
}

pglease_formations::tests![shared_holders_from_the_command_line];
