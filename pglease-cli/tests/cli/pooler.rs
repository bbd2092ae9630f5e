//! The `pglease` binary through PgBouncer in transaction mode (the
//! distribution's version): concurrent `migrate`, every lease command in
//! a row of rounds, `run` renewing across several periods and handing
//! over to a waiting `run`, and `doctor`.

use std::process::{Command, Output};
use std::time::Duration;

use crate::common::TestDb;
use pglease_formations::{PgBouncer, SetupError};

const BIN: &str = env!("CARGO_BIN_EXE_pglease");

/// `pglease ARGS` with the database reached through `bouncer`.
fn pglease(bouncer: &PgBouncer, db: &TestDb, args: &[&str]) -> Output {
    pglease_as(bouncer, db, db.options().get_username(), args)
}

/// `pglease ARGS` through `bouncer`, logged in as `user`.
fn pglease_as(bouncer: &PgBouncer, db: &TestDb, user: &str, args: &[&str]) -> Output {
    let url = format!(
        "postgres://{user}@127.0.0.1:{}/{}",
        bouncer.port(),
        db.name()
    );
    Command::new(BIN)
        .arg("--database-url")
        .arg(url)
        .args(args)
        .output()
        .expect("run the pglease binary")
}

fn check(output: &Output, expected: i32, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(
        output.status.code(),
        Some(expected),
        "{what}: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

async fn every_command_works_through_the_pooler() -> Result<(), SetupError> {
    let db = crate::common::empty_db().await;
    let bouncer = PgBouncer::builder().start(&db.options())?;
    std::thread::scope(|scope| {
        let runs: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| pglease(&bouncer, &db, &["migrate"])))
            .collect();
        for run in runs {
            check(&run.join().expect("migrate"), 0, "concurrent migrate");
        }
    });

    for round in 0..10 {
        let out = pglease(&bouncer, &db, &["acquire", "job", "--ttl", "30s", "--json"]);
        let acquired: serde_json::Value =
            serde_json::from_str(&check(&out, 0, "acquire")).expect("JSON");
        let token = acquired["token"].as_i64().expect("a token").to_string();
        let out = pglease(&bouncer, &db, &["acquire", "job", "--ttl", "30s"]);
        check(&out, 3, "acquire of a held lease");
        let out = pglease(
            &bouncer,
            &db,
            &["renew", "job", "--token", &token, "--ttl", "30s"],
        );
        check(&out, 0, "renew");
        let out = pglease(&bouncer, &db, &["status", "job", "--json"]);
        let status: serde_json::Value =
            serde_json::from_str(&check(&out, 0, "status")).expect("JSON");
        assert_eq!(status["token"].to_string(), token, "round {round}");
        // The table reads the database clock too.
        for args in [&["status", "job"][..], &["status"]] {
            let table = check(&pglease(&bouncer, &db, args), 0, "status as a table");
            assert!(table.contains(&format!(" {token}  in ")), "{table}");
        }
        check(
            &pglease(&bouncer, &db, &["release", "job", "--token", &token]),
            0,
            "release",
        );
        check(
            &pglease(&bouncer, &db, &["release", "job", "--token", &token]),
            4,
            "release again",
        );
    }

    // `run` renews a 900 ms lease over three seconds, while a second `run`
    // waits (polling) and runs its command once the first releases.
    std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            pglease(
                &bouncer,
                &db,
                &["run", "batch", "--ttl", "900ms", "--", "sleep", "3"],
            )
        });
        let holding = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let out = pglease(&bouncer, &db, &["status", "batch", "--json"]);
            // 0 once held, 3 before.
            let held = out.status.code() == Some(0);
            let status: serde_json::Value =
                serde_json::from_str(&check(&out, if held { 0 } else { 3 }, "status"))
                    .expect("JSON");
            if status["held"] == serde_json::Value::Bool(true) {
                break;
            }
            assert!(
                std::time::Instant::now() < holding,
                "the first run never held"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let second = scope.spawn(|| {
            pglease(
                &bouncer,
                &db,
                &[
                    "run", "batch", "--ttl", "900ms", "--wait", "20s", "--", "true",
                ],
            )
        });
        check(&first.join().expect("first run"), 0, "first run");
        check(&second.join().expect("second run"), 0, "second run");
    });

    // Election: who leads, a step-down request, and a whole `elect`.
    check(
        &pglease(&bouncer, &db, &["leader", "svc"]),
        3,
        "leader, nobody",
    );
    let out = pglease(
        &bouncer,
        &db,
        &[
            "acquire", "svc", "--ttl", "30s", "--holder", "a", "--value", "a:1", "--json",
        ],
    );
    let token = serde_json::from_str::<serde_json::Value>(&check(&out, 0, "acquire svc"))
        .expect("JSON")["token"]
        .to_string();
    let out = pglease(&bouncer, &db, &["leader", "svc"]);
    assert_eq!(check(&out, 0, "leader"), format!("a\ttoken {token}\ta:1\n"));
    check(
        &pglease(&bouncer, &db, &["step-down", "svc"]),
        0,
        "step-down",
    );
    check(
        &pglease(&bouncer, &db, &["release", "svc", "--token", &token]),
        0,
        "release svc",
    );
    let out = pglease(
        &bouncer,
        &db,
        &["elect", "svc", "--ttl", "2s", "--", "true"],
    );
    check(&out, 0, "elect with a command that succeeds");
    check(
        &pglease(&bouncer, &db, &["leader", "svc"]),
        3,
        "leader after elect",
    );

    let out = pglease(&bouncer, &db, &["doctor"]);
    let report = check(&out, 0, "doctor");
    assert!(report.contains("share server sessions"), "{report}");
    Ok(())
}

/// An owner without `pg_signal_backend` is told the GRANT it lacks, by a
/// query of the command line's own, also through the pooler and on every
/// run (not only the first, before a prepared statement could collide).
async fn migrate_names_the_missing_grant_through_the_pooler() -> Result<(), SetupError> {
    let owner = format!("pglease_pooler_owner_{}", std::process::id());
    let db = &crate::common::empty_db().await;
    db.scratch_roles(&[&owner]).await;
    db.execute(&[
        format!("CREATE ROLE {owner} LOGIN"),
        format!("GRANT CREATE ON DATABASE {} TO {owner}", db.name()),
    ])
    .await;
    let bouncer = PgBouncer::builder().user(&owner).start(&db.options())?;
    for run in 0..5 {
        let out = pglease_as(&bouncer, db, &owner, &["migrate"]);
        check(&out, 0, "migrate as the owner");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains(&format!("GRANT pg_signal_backend TO {owner}")),
            "run {run}: {said}"
        );
    }
    Ok(())
}

/// `run --declare` behind PgBouncer, in transaction and in session mode:
/// the declaration travels as a startup option, which PgBouncer does not
/// pass on (the distribution's 1.18 refuses the connection; later versions
/// refuse an option they do not track). The command's session is refused
/// before it writes anything: a declared command must connect to the
/// server itself, as docs/cli.md says. In session mode a command may
/// declare with SET after connecting instead, and its write is checked so.
/// The same command without a declaration, checking its token itself,
/// connects and writes in both modes.
async fn a_declared_command_is_refused_by_the_pooler() -> Result<(), SetupError> {
    let db = crate::common::new_db().await;
    db.execute(&[
        "CREATE TABLE log (n integer)",
        "SELECT pglease.protect('log', 'job')",
    ])
    .await;
    for session_mode in [false, true] {
        let builder = PgBouncer::builder();
        let builder = if session_mode {
            builder.session_mode()
        } else {
            builder
        };
        let bouncer = builder.start(&db.options())?;
        let write = "psql \"$PGLEASE_DATABASE_URL\" -X -q -v ON_ERROR_STOP=1 \
                     -c \"BEGIN; SELECT pglease.assert_held('job', $PGLEASE_TOKEN); \
                           INSERT INTO log VALUES (1); COMMIT;\"";
        let out = pglease(
            &bouncer,
            &db,
            &[
                "run",
                "job",
                "--declare",
                "--ttl",
                "5s",
                "--",
                "sh",
                "-c",
                write,
            ],
        );
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_ne!(out.status.code(), Some(0), "{said}");
        assert!(said.contains("unsupported startup parameter"), "{said}");
        let out = pglease(
            &bouncer,
            &db,
            &["run", "job", "--ttl", "5s", "--", "sh", "-c", write],
        );
        check(&out, 0, "the same command, undeclared");
        if session_mode {
            let set = "psql \"$PGLEASE_DATABASE_URL\" -X -q -v ON_ERROR_STOP=1 \
                       -c \"SET pglease.name = 'job'\" -c \"SET pglease.token = $PGLEASE_TOKEN\" \
                       -c \"INSERT INTO log VALUES (2)\"";
            let out = pglease(
                &bouncer,
                &db,
                &["run", "job", "--ttl", "5s", "--", "sh", "-c", set],
            );
            check(&out, 0, "declared with SET in session mode");
        }
    }
    let rows: Vec<i32> = sqlx::query_scalar("SELECT n FROM log ORDER BY n")
        .fetch_all(db.pool())
        .await
        .expect("read");
    assert_eq!(
        rows,
        vec![1, 1, 2],
        "only the undeclared runs and the SET one wrote"
    );
    Ok(())
}

pglease_formations::tests![
    every_command_works_through_the_pooler(2),
    migrate_names_the_missing_grant_through_the_pooler,
    a_declared_command_is_refused_by_the_pooler(2),
];
