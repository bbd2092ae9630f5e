//! The `pglease` binary against the server users have in production
//! (`pglease_formations::TlsServer`: TLS only, `scram-sha-256`, a CA made
//! at test time, a non-superuser owner): every command over `verify-full`,
//! docs/cli.md's URL, environment and password-file forms exactly as it
//! writes them, a certificate from another CA and a connection without
//! TLS refused with exit 5 and a message that says why.

use std::process::{Command, Output};

use pglease_formations::{SetupError, TlsServer};

const BIN: &str = env!("CARGO_BIN_EXE_pglease");

/// `pglease ARGS` with `env` and nothing of the caller's PG* variables.
fn pglease(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    for (key, _) in std::env::vars() {
        if key.starts_with("PG") || key == "DATABASE_URL" {
            command.env_remove(key);
        }
    }
    command
        .envs(env.iter().copied())
        .args(args)
        .stdin(std::process::Stdio::null())
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

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn every_command_works_over_verify_full() -> Result<(), SetupError> {
    let server = TlsServer::start().await?;
    let url = server.url("sslmode=verify-full");
    let on = |args: &[&str]| {
        let mut all = vec!["--database-url", url.as_str()];
        all.extend_from_slice(args);
        pglease(&[], &all)
    };
    check(&on(&["migrate"]), 0, "migrate");
    let out = check(
        &on(&["acquire", "job", "--ttl", "30s", "--json"]),
        0,
        "acquire",
    );
    let acquired: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let token = acquired["token"].as_i64().expect("a token").to_string();
    check(
        &on(&["renew", "job", "--token", &token, "--ttl", "30s"]),
        0,
        "renew",
    );
    check(&on(&["status", "job"]), 0, "status");
    check(&on(&["release", "job", "--token", &token]), 0, "release");
    // run and elect: CMD sees its lease held, over the same TLS URL.
    let held =
        format!("\"{BIN}\" --database-url \"$PGLEASE_DATABASE_URL\" status \"$PGLEASE_NAME\"");
    check(
        &on(&["run", "nightly", "--ttl", "5s", "--", "sh", "-c", &held]),
        0,
        "run",
    );
    check(
        &on(&["elect", "leader", "--ttl", "5s", "--", "sh", "-c", &held]),
        0,
        "elect",
    );
    let doctor = on(&["doctor"]);
    let report = String::from_utf8_lossy(&doctor.stdout).into_owned();
    assert!(
        report.contains("encrypted (TLSv1."),
        "{report}{}",
        stderr(&doctor)
    );
    assert!(report.contains("verify-full"), "{report}");
    assert!(report.contains("pg_signal_backend"), "{report}");
    Ok(())
}

async fn the_readmes_forms_connect_as_written() -> Result<(), SetupError> {
    let server = TlsServer::start().await?;
    let port = server.port().to_string();
    let ca = server.ca().display().to_string();
    // The URL form, with the CA file.
    let url = format!(
        "postgres://{}@localhost:{port}/{}?sslmode=verify-full&sslrootcert={ca}",
        TlsServer::USER,
        TlsServer::DATABASE
    );
    let password = [("PGPASSWORD", TlsServer::PASSWORD)];
    check(
        &pglease(&password, &["--database-url", &url, "migrate"]),
        0,
        "URL form",
    );
    check(
        &pglease(&password, &["--database-url", &url, "status"]),
        0,
        "URL form",
    );
    // The environment form.
    let env = [
        ("PGHOST", "localhost"),
        ("PGPORT", port.as_str()),
        ("PGUSER", TlsServer::USER),
        ("PGDATABASE", TlsServer::DATABASE),
        ("PGSSLMODE", "verify-full"),
        ("PGSSLROOTCERT", ca.as_str()),
        ("PGPASSWORD", TlsServer::PASSWORD),
    ];
    check(&pglease(&env, &["status"]), 0, "environment form");
    // The password file, as docs/cli.md writes it: ~/.pgpass (HOME a
    // scratch directory here), mode 0600.
    let dir = std::env::temp_dir().join(format!("pglease-cli-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let home = dir.display().to_string();
    let line = server.passfile_line();
    let written = Command::new("sh")
        .env("HOME", &home)
        .arg("-c")
        .arg(format!(
            "printf '%s\\n' '{}' >> ~/.pgpass && chmod 0600 ~/.pgpass",
            line.trim_end()
        ))
        .status()
        .expect("sh");
    assert!(written.success());
    check(
        &pglease(&[("HOME", &home)], &["--database-url", &url, "status"]),
        0,
        "password file",
    );
    // libpq's refusal of a file others may read, said with what to do.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join(".pgpass"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let out = pglease(&[("HOME", &home)], &["--database-url", &url, "status"]);
    check(&out, 5, "a password file others may read");
    assert!(stderr(&out).contains("chmod 0600"), "{}", stderr(&out));
    // sslrootcert=system, as docs/cli.md writes it (no sslmode: it implies
    // verify-full): the test CA is in no system store, so the certificate
    // is not trusted, and the message says against what.
    let system = format!(
        "postgres://{}@localhost:{port}/{}?sslrootcert=system",
        TlsServer::USER,
        TlsServer::DATABASE
    );
    let out = pglease(&password, &["--database-url", &system, "status"]);
    check(&out, 5, "sslrootcert=system with a private CA");
    assert!(
        stderr(&out).contains("system's trusted roots"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("sslmode=verify-full"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

async fn a_wrong_ca_and_a_connection_without_tls_exit_5_saying_why() -> Result<(), SetupError> {
    let server = TlsServer::start().await?;
    let wrong = server.url("sslmode=verify-full").replace(
        &server.ca().display().to_string(),
        &server.wrong_ca().display().to_string(),
    );
    let out = pglease(&[], &["--database-url", &wrong, "status"]);
    check(&out, 5, "a certificate from another CA");
    let said = stderr(&out);
    assert!(
        said.contains("invalid peer certificate: UnknownIssuer"),
        "{said}"
    );
    assert!(said.contains("Check sslrootcert"), "{said}");

    let plain = server.url("sslmode=disable");
    let out = pglease(&[], &["--database-url", &plain, "status"]);
    check(&out, 5, "without TLS");
    let said = stderr(&out);
    assert!(said.contains("no encryption"), "{said}");
    assert!(said.contains("it requires TLS"), "{said}");
    Ok(())
}

/// A role granted nothing on the schema: `status` names the GRANT it
/// needs, and `doctor` reports each missing privilege with its GRANT
/// instead of stopping.
async fn a_role_without_grants_is_told_the_grant() -> Result<(), SetupError> {
    let server = TlsServer::start().await?;
    let owner = server.url("sslmode=verify-full");
    check(
        &pglease(&[], &["--database-url", &owner, "migrate"]),
        0,
        "migrate",
    );
    let mut admin = sqlx::ConnectOptions::connect(&server.admin())
        .await
        .expect("the superuser over the socket");
    sqlx::raw_sql("CREATE ROLE reader LOGIN PASSWORD 'r3ader'")
        .execute(&mut admin)
        .await
        .expect("create a role granted nothing");
    let reader = format!(
        "postgres://reader:r3ader@localhost:{}/{}?sslmode=verify-full&sslrootcert={}",
        server.port(),
        TlsServer::DATABASE,
        server.ca().display()
    );
    let out = pglease(&[], &["--database-url", &reader, "status"]);
    check(&out, 5, "status as a role granted nothing");
    assert!(
        stderr(&out).contains("grants it: GRANT USAGE ON SCHEMA pglease TO \"reader\";"),
        "{}",
        stderr(&out)
    );
    let out = pglease(&[], &["--database-url", &reader, "doctor"]);
    let report = check(&out, 1, "doctor as a role granted nothing");
    assert!(
        report.contains("GRANT USAGE ON SCHEMA pglease TO \"reader\";")
            && report.contains(
                "GRANT SELECT ON pglease.status, pglease.history, pglease.shared TO \"reader\";"
            ),
        "{report}"
    );
    Ok(())
}

pglease_formations::tests![
    every_command_works_over_verify_full,
    a_role_without_grants_is_told_the_grant,
    the_readmes_forms_connect_as_written,
    a_wrong_ca_and_a_connection_without_tls_exit_5_saying_why,
];
