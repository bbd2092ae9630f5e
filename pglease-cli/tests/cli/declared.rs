//! `run --declare`: a migration tool and a psql job, run unmodified under
//! the lease, are fenced by the database. Two deployers run the same
//! migrations; the first one's host freezes (its `run` and its command's
//! process group stopped with SIGSTOP) with its migration transaction
//! open; the second takes over after the TTL. Each test checks safety (the
//! frozen deployer's migration never commits after the takeover, it is
//! applied exactly once, no token twice), liveness (the second deployer
//! finishes while the first stays frozen) and authority (another role's
//! session cannot declare the lease: after each contended deploy, and in
//! `a_declaration_is_a_claim_the_database_checks`).
//!
//! The migration tool is sqlx's migrator, `sqlx::migrate::Migrator` as
//! `sqlx migrate run` runs it (from `DATABASE_URL`, with its session-level
//! advisory lock held for the whole run): this test binary, started again
//! with [`MIGRATOR`] set, is that tool (see [`migrator`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crate::common::{BOUND, TestDb, code, command, poll_until, stderr, wait_bounded};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pglease::sqlstate::{NOT_DECLARED, NOT_HELD, NOT_PERMITTED};
use pglease_formations::SetupError;
use sqlx::Connection;

/// Set to a migrations directory, this binary runs sqlx's migrator on it
/// against `DATABASE_URL` instead of the tests, after appending
/// `pid:<its pid>` to the file named by [`PIDFILE`] (if set). (Not named
/// `PGLEASE_*`: `run` keeps those of an outer run from its command.)
pub(crate) const MIGRATOR: &str = "TEST_MIGRATOR_DIR";
const PIDFILE: &str = "TEST_MIGRATOR_PIDFILE";

/// The migrator: exit 0 when every migration is applied, 1 (with the
/// error on stderr) otherwise.
pub(crate) fn migrator(dir: PathBuf) -> ExitCode {
    if let Some(file) = std::env::var_os(PIDFILE) {
        let line = format!("pid:{}\n", std::process::id());
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
        if let Err(e) = appended {
            eprintln!("migrator: cannot write the pid file: {e}");
            return ExitCode::from(1);
        }
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("migrator: {e}");
            return ExitCode::from(1);
        }
    };
    let outcome: Result<(), String> = runtime.block_on(async {
        let url = std::env::var("DATABASE_URL").map_err(|e| format!("DATABASE_URL: {e}"))?;
        // As sqlx-cli connects: the URL, with PGOPTIONS and PGAPPNAME from
        // the environment (PgConnectOptions reads them).
        let mut conn = sqlx::PgConnection::connect(&url)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let migrations = sqlx::migrate::Migrator::new(dir.as_path())
            .await
            .map_err(|e| format!("read the migrations: {e}"))?;
        migrations
            .run(&mut conn)
            .await
            .map_err(|e| format!("migrate: {e}"))
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("migrator: {e}");
            ExitCode::from(1)
        }
    }
}

/// The advisory key a test holds while a deployer's migration waits for it
/// (`pg_advisory_xact_lock_shared`): the barrier at which the deployer is
/// frozen, its migration transaction open.
const BARRIER: i64 = 7_346_001;

/// The test's hold on [`BARRIER`], on a connection of its own.
struct Barrier(sqlx::PgConnection);

impl Barrier {
    /// Holds the barrier: whoever waits for it stops there.
    async fn hold(db: &TestDb) -> Barrier {
        let mut conn = db.connect().await.expect("connect");
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(BARRIER)
            .execute(&mut conn)
            .await
            .expect("hold the barrier");
        Barrier(conn)
    }

    /// Lets whoever waits at the barrier through.
    async fn open(mut self) {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(BARRIER)
            .execute(&mut self.0)
            .await
            .expect("open the barrier");
    }
}

/// A directory of its own for this test's migrations, made empty.
fn migrations_dir(db: &TestDb, what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pglease-declared-{}-{what}", db.name()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("make the migrations directory");
    dir
}

fn write(dir: &Path, file: &str, sql: &str) {
    std::fs::write(dir.join(file), sql).expect("write a migration");
}

/// A migration tool as a deployer runs it, in a directory of its own: its
/// migrations, and the files its command appends `pid:<pid>` to.
#[derive(Clone, Copy)]
enum Tool<'a> {
    /// sqlx's migrator (this binary, see [`migrator`]) on the `.sql`
    /// files of the directory.
    Sqlx(&'a Path),
    /// Alembic, `alembic upgrade head` in a project that `alembic init`
    /// made in the directory.
    Alembic(&'a Path),
}

impl<'a> Tool<'a> {
    fn dir(self) -> &'a Path {
        match self {
            Tool::Sqlx(dir) | Tool::Alembic(dir) => dir,
        }
    }

    /// The count, 1, that says migration 2 is recorded once.
    fn recorded_once(self) -> &'static str {
        match self {
            Tool::Sqlx(_) => "SELECT count(*) FROM _sqlx_migrations WHERE version = 2 AND success",
            Tool::Alembic(_) => "SELECT count(*) FROM alembic_version WHERE version_num = '0002'",
        }
    }

    /// The tool's version table.
    fn version_table(self) -> &'static str {
        match self {
            Tool::Sqlx(_) => "_sqlx_migrations",
            Tool::Alembic(_) => "alembic_version",
        }
    }
}

/// Authority: once lease `lease` is held again (here by the test's role),
/// a role of its own, allowed to write `table` (protected by the lease),
/// whose session declares the lease under its current token, is refused
/// (42501) when it deletes the table's rows, and the table keeps them.
async fn another_role_cannot_act_under(db: &TestDb, lease: &str, table: &str) {
    let m = db.manager();
    let held = m
        .acquire(
            lease,
            pglease::AcquireOptions::ttl(Duration::from_secs(600)).holder("C"),
        )
        .await
        .expect("acquire the lease");
    let other = format!("{}_other", db.name());
    db.scratch_roles(&[&other]).await;
    db.execute(&[
        format!("CREATE ROLE {other} LOGIN PASSWORD 'pw'"),
        format!("GRANT SELECT, DELETE ON {table} TO {other}"),
    ])
    .await;
    let count = format!("SELECT count(*) FROM {table}");
    let rows = || async {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(count.clone()))
            .fetch_one(db.pool())
            .await
            .expect("count the rows")
    };
    let before = rows().await;
    let token = held.token().get();
    let out = Command::new("psql")
        .args([
            &db.url_for(&other, "pw"),
            "-X",
            "-q",
            "-v",
            "VERBOSITY=verbose",
            "-c",
        ])
        .arg(format!("DELETE FROM {table}"))
        .env(
            "PGOPTIONS",
            format!("-c pglease.name={lease} -c pglease.token={token}"),
        )
        .output()
        .expect("run psql");
    assert!(
        stderr(&out).contains(&format!("ERROR:  {NOT_PERMITTED}")),
        "another role's declared write: {}",
        stderr(&out)
    );
    assert_eq!(rows().await, before, "{table} is unchanged");
    m.release(&crate::common::fence(lease, held.token()))
        .await
        .expect("release");
}

/// `pglease run migrations --declare --ttl 1s [--wait 30s] -- TOOL`
/// against `url`, started, the tool's process writing its pid to
/// `pidfile`.
fn deploy(url: &str, tool: Tool<'_>, pidfile: &Path, wait: bool) -> Child {
    let mut args = vec!["run", "migrations", "--declare", "--ttl", "1s"];
    if wait {
        args.extend(["--wait", "30s"]);
    }
    args.push("--");
    let me = std::env::current_exe().expect("this test binary");
    let me = me.to_str().expect("a UTF-8 path").to_owned();
    let alembic = format!(
        "echo pid:$$ >> '{}'; exec python3 -m alembic upgrade head",
        pidfile.display()
    );
    match tool {
        Tool::Sqlx(_) => args.push(&me),
        Tool::Alembic(_) => args.extend(["sh", "-c", &alembic]),
    }
    Command::new(crate::common::BIN)
        .arg("--database-url")
        .arg(url)
        .args(&args)
        .current_dir(tool.dir())
        .env("DATABASE_URL", url)
        .env(MIGRATOR, tool.dir())
        .env(PIDFILE, pidfile)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pglease run")
}

/// Runs one deploy to its end, against `url`; it must succeed.
async fn deploy_alone(url: &str, tool: Tool<'_>) {
    let pidfile = tool.dir().join("alone.pid");
    let child = deploy(url, tool, &pidfile, false);
    let out = child.wait_with_output().expect("wait");
    assert_eq!(code(&out), 0, "the first deploy: {}", stderr(&out));
}

/// The process group of the command `run` started (its first `pid:` line).
fn group_of(pidfile: &Path) -> Option<Pid> {
    std::fs::read_to_string(pidfile)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("pid:"))
        .and_then(|p| p.trim().parse().ok())
        .map(Pid::from_raw)
}

/// Whether some session of the test database waits for the barrier.
async fn waits_at_barrier(db: &TestDb) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
           AND objid = $1 AND database = (SELECT oid FROM pg_database \
                                           WHERE datname = current_database()))",
    )
    .bind(BARRIER)
    .fetch_one(db.pool())
    .await
    .expect("read pg_locks")
}

/// A host frozen: `run` and its command's group stopped, or continued.
fn freeze(run: &Child, group: Pid, signal: Signal) {
    kill(Pid::from_raw(-group.as_raw()), signal).expect("signal the command's group");
    kill(Pid::from_raw(run.id() as i32), signal).expect("signal run");
}

/// The tokens the history records as acquired for `migrations`, in order.
async fn acquired_tokens(db: &TestDb) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT token FROM pglease.history WHERE name = 'migrations' AND event = 'acquired' \
         ORDER BY id",
    )
    .fetch_all(db.pool())
    .await
    .expect("read the history")
}

/// The first migration, run by one deployer alone: a table of balances.
const ACCOUNTS: &str = "CREATE TABLE accounts (id integer PRIMARY KEY, balance bigint NOT NULL);\n\
     INSERT INTO accounts SELECT g, g FROM generate_series(1, 10) AS g;\n";

/// Two deployers of the tool's migrations (the second migration in its
/// directory, which stops at the barrier); the first, A, frozen at
/// the barrier with its migration transaction open; the second, B,
/// started then. Checks that B finishes while A stays frozen, that A's
/// `run` exits 4 once resumed, that no token was issued twice and that
/// the migration is recorded once. Both deploy against `url`. Returns
/// the time B took from its start.
async fn contended(db: &TestDb, url: &str, tool: Tool<'_>) -> Duration {
    let dir = tool.dir();
    let barrier = Barrier::hold(db).await;
    let a_pids = dir.join("a.pid");
    let a = deploy(url, tool, &a_pids, false);
    poll_until("A's migration to reach the barrier", BOUND, || {
        waits_at_barrier(db)
    })
    .await;
    let a_group = group_of(&a_pids).expect("A's command wrote its pid");
    let a_token: i64 =
        sqlx::query_scalar("SELECT token FROM pglease.leases WHERE name = 'migrations'")
            .fetch_one(db.pool())
            .await
            .expect("A's token");
    // A's host freezes; its migration gets past the barrier in the server
    // and stays open, uncommitted, its client stopped.
    freeze(&a, a_group, Signal::SIGSTOP);
    barrier.open().await;
    poll_until("A's migration past the barrier", BOUND, || async {
        !waits_at_barrier(db).await
    })
    .await;

    // B deploys while A stays frozen; it must finish.
    let started = Instant::now();
    let b = deploy(url, tool, &dir.join("b.pid"), true);
    let b_status = wait_bounded(b).await;
    let b_took = started.elapsed();
    assert_eq!(b_status.code(), Some(0), "B's deploy, A still frozen");
    assert_eq!(
        kill(Pid::from_raw(a.id() as i32), None),
        Ok(()),
        "A is still there, frozen"
    );

    freeze(&a, a_group, Signal::SIGCONT);
    let a_out = a.wait_with_output().expect("A ends");
    assert_eq!(
        code(&a_out),
        4,
        "A resumed after losing its lease: {}",
        stderr(&a_out)
    );

    // No token twice; A's term came before B's.
    let tokens = acquired_tokens(db).await;
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens in order: {tokens:?}"
    );
    assert!(tokens.contains(&a_token) && tokens.last() > Some(&a_token));
    // The migration recorded once, as applied.
    let applied: i64 = sqlx::query_scalar(tool.recorded_once())
        .fetch_one(db.pool())
        .await
        .expect("read the version table");
    assert_eq!(applied, 1, "migration 2 is recorded once");
    another_role_cannot_act_under(db, "migrations", tool.version_table()).await;
    b_took
}

/// DDL and data in one migration, the DDL fence on: A's `ALTER TABLE` was
/// checked under its token, so B's takeover ends A's transaction after the
/// grace; B adds the column and fills it once. A's late commit never
/// lands, and A's `run` exits 4.
async fn a_frozen_deployers_ddl_migration_never_commits_after_the_takeover() {
    let db = crate::common::new_db().await;
    let dir = migrations_dir(&db, "ddl");
    write(&dir, "0001_accounts.sql", ACCOUNTS);
    deploy_alone(&db.url(), Tool::Sqlx(&dir)).await;
    let out = crate::common::pglease(
        &db,
        &[
            "protect",
            "--tool",
            "sqlx",
            "--lease",
            "migrations",
            "--ddl",
        ],
    );
    assert_eq!(code(&out), 0, "protect: {}", stderr(&out));
    let said = crate::common::stdout(&crate::common::pglease(&db, &["doctor"]));
    assert!(
        said.contains("lease 'migrations' fences tables public._sqlx_migrations; its declared sessions' DDL is fenced"),
        "{said}"
    );

    write(
        &dir,
        "0002_second.sql",
        &format!(
            "ALTER TABLE accounts ADD COLUMN cents bigint;\n\
             UPDATE accounts SET cents = balance * 100;\n\
             SELECT pg_advisory_xact_lock_shared({BARRIER});\n"
        ),
    );
    let took = contended(&db, &db.url(), Tool::Sqlx(&dir)).await;
    let (rows, right): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE cents = balance * 100) FROM accounts",
    )
    .fetch_one(db.pool())
    .await
    .expect("read accounts");
    assert_eq!((rows, right), (10, 10), "the column filled once");
    let evicted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pglease.history WHERE name = 'migrations' AND event = 'evicted'",
    )
    .fetch_one(db.pool())
    .await
    .expect("history");
    assert!(evicted >= 1, "the takeover ended A's session");
    println!("B deployed in {took:?} while A stayed frozen (TTL 1 s)");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A data-only migration, only the version table protected (no DDL
/// fence): A's transaction updated balances and was never checked, so it
/// holds no fence; its session carries `pglease:<token>` as its
/// application_name, and B's takeover ends it. The balances are
/// multiplied once.
async fn a_frozen_deployers_data_migration_is_applied_exactly_once() {
    let db = crate::common::new_db().await;
    let dir = migrations_dir(&db, "data");
    write(&dir, "0001_accounts.sql", ACCOUNTS);
    deploy_alone(&db.url(), Tool::Sqlx(&dir)).await;
    let out = crate::common::pglease(&db, &["protect", "--tool", "sqlx", "--lease", "migrations"]);
    assert_eq!(code(&out), 0, "protect: {}", stderr(&out));

    write(
        &dir,
        "0002_second.sql",
        &format!(
            "UPDATE accounts SET balance = balance * 100;\n\
             SELECT pg_advisory_xact_lock_shared({BARRIER});\n"
        ),
    );
    let took = contended(&db, &db.url(), Tool::Sqlx(&dir)).await;
    let sum: i64 = sqlx::query_scalar("SELECT sum(balance)::bigint FROM accounts")
        .fetch_one(db.pool())
        .await
        .expect("read accounts");
    assert_eq!(sum, 55 * 100, "balances multiplied exactly once");
    println!("B deployed in {took:?} while A stayed frozen (TTL 1 s)");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Alembic, a migration tool not written in Rust (from PyPI, with
/// psycopg), set up and run as a new user does: `alembic init`, the URL in
/// alembic.ini, `alembic upgrade head` under `run --declare`, unchanged
/// (psycopg connects through libpq, which reads PGOPTIONS and PGAPPNAME).
/// Alembic's version table protected (`protect --tool alembic`); a
/// data-only revision, then a DDL and data revision with the DDL fence on:
/// the frozen deployer's whole upgrade, one transaction, never commits,
/// and each revision is applied once.
async fn alembic_run_unmodified_is_fenced() -> Result<(), SetupError> {
    let found = Command::new("python3")
        .args(["-c", "import alembic, psycopg"])
        .output();
    if !found.is_ok_and(|o| o.status.success()) {
        return Err(SetupError::Unavailable(
            "needs Alembic and psycopg for python3, from PyPI: python3 -m pip install alembic \
             'psycopg[binary]'"
                .to_owned(),
        ));
    }
    alembic_contended(false).await;
    alembic_contended(true).await;
    Ok(())
}

/// One Alembic project and two deployers of its second revision: data
/// only, or (`ddl`) a new column filled, with the DDL fence on.
async fn alembic_contended(ddl: bool) {
    let db = crate::common::new_db().await;
    let dir = migrations_dir(&db, "alembic");
    let out = Command::new("python3")
        .args(["-m", "alembic", "init", "migrations"])
        .current_dir(&dir)
        .output()
        .expect("alembic init");
    assert_eq!(code(&out), 0, "alembic init: {}", stderr(&out));
    let ini = std::fs::read_to_string(dir.join("alembic.ini")).expect("alembic.ini");
    let url = db.url().replacen("postgres://", "postgresql+psycopg://", 1);
    let ini: String = ini
        .lines()
        .map(|line| match line.starts_with("sqlalchemy.url") {
            true => format!("sqlalchemy.url = {url}\n"),
            false => format!("{line}\n"),
        })
        .collect();
    std::fs::write(dir.join("alembic.ini"), ini).expect("write alembic.ini");
    let versions = dir.join("migrations/versions");
    let revision = |file: &str, id: &str, down: &str, upgrade: &str| {
        let text = format!(
            "from alembic import op\n\nrevision = \"{id}\"\ndown_revision = {down}\n\
             branch_labels = None\ndepends_on = None\n\n\ndef upgrade():\n{upgrade}\n\n\
             def downgrade():\n    pass\n"
        );
        std::fs::write(versions.join(file), text).expect("write a revision");
    };
    revision(
        "0001_accounts.py",
        "0001",
        "None",
        "    op.execute(\"CREATE TABLE accounts (id integer PRIMARY KEY, balance bigint NOT NULL)\")\n\
         \x20   op.execute(\"INSERT INTO accounts SELECT g, g FROM generate_series(1, 10) AS g\")",
    );
    deploy_alone(&db.url(), Tool::Alembic(&dir)).await;
    let mut protect = vec!["protect", "--tool", "alembic", "--lease", "migrations"];
    if ddl {
        protect.push("--ddl");
    }
    let out = crate::common::pglease(&db, &protect);
    assert_eq!(code(&out), 0, "protect: {}", stderr(&out));

    let change = match ddl {
        true => {
            "    op.execute(\"ALTER TABLE accounts ADD COLUMN cents bigint\")\n\
                 \x20   op.execute(\"UPDATE accounts SET cents = balance * 100\")"
        }
        false => "    op.execute(\"UPDATE accounts SET balance = balance * 100\")",
    };
    revision(
        "0002_balances.py",
        "0002",
        "\"0001\"",
        &format!(
            "{change}\n\
             \x20   op.execute(\"SELECT pg_advisory_xact_lock_shared({BARRIER})\")"
        ),
    );
    let took = contended(&db, &db.url(), Tool::Alembic(&dir)).await;
    let check = match ddl {
        true => "SELECT count(*) FILTER (WHERE cents = balance * 100) FROM accounts",
        false => "SELECT count(*) FILTER (WHERE balance = id * 100) FROM accounts",
    };
    let right: i64 = sqlx::query_scalar(check)
        .fetch_one(db.pool())
        .await
        .expect("read accounts");
    assert_eq!(right, 10, "revision 2 applied exactly once (DDL: {ddl})");
    println!("B's Alembic deployed in {took:?} while A stayed frozen (TTL 1 s, DDL: {ddl})");
    let _ = std::fs::remove_dir_all(&dir);
}

/// As a managed service gives it: the schema owned by a role that is no
/// superuser, which the deployers log in as. The DDL fence, an event
/// trigger, is refused (exit 5, saying who may turn it on), and nothing is
/// changed; the version table, protected, fences a frozen deployer's
/// data migration as it does under a superuser, and the takeover ends the
/// frozen session (the owner may end its own role's sessions).
async fn a_non_superuser_owner_fences_migrations_with_the_version_table() {
    let db = crate::common::empty_db().await;
    let owner = format!("{}_owner", db.name());
    db.scratch_roles(&[&owner]).await;
    db.execute(&[
        format!("CREATE ROLE {owner} LOGIN PASSWORD 'pw'"),
        format!("GRANT CREATE ON DATABASE {} TO {owner}", db.name()),
        format!("GRANT CREATE ON SCHEMA public TO {owner}"),
    ])
    .await;
    let url = db.url_for(&owner, "pw");
    let as_owner = |args: &[&str]| {
        Command::new(crate::common::BIN)
            .arg("--database-url")
            .arg(&url)
            .args(args)
            .output()
            .expect("run pglease")
    };
    let out = as_owner(&["migrate"]);
    assert_eq!(code(&out), 0, "migrate: {}", stderr(&out));
    let dir = migrations_dir(&db, "owner");
    write(&dir, "0001_accounts.sql", ACCOUNTS);
    deploy_alone(&url, Tool::Sqlx(&dir)).await;

    // doctor warns of the tool's version table left unprotected.
    let said = crate::common::stdout(&as_owner(&["doctor"]));
    assert!(
        said.lines().any(|l| l.starts_with("warning")
            && l.contains("_sqlx_migrations, by its name sqlx's version table, is not protected")),
        "{said}"
    );
    let out = as_owner(&[
        "protect",
        "--tool",
        "sqlx",
        "--lease",
        "migrations",
        "--ddl",
    ]);
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(stderr(&out).contains("superuser"), "{}", stderr(&out));
    let protected: i64 = sqlx::query_scalar("SELECT count(*) FROM pglease.protected")
        .fetch_one(db.pool())
        .await
        .expect("read");
    assert_eq!(protected, 0, "nothing changed");
    let out = as_owner(&["protect", "--tool", "sqlx", "--lease", "migrations"]);
    assert_eq!(code(&out), 0, "protect: {}", stderr(&out));

    write(
        &dir,
        "0002_second.sql",
        &format!(
            "UPDATE accounts SET balance = balance * 100;\n\
             SELECT pg_advisory_xact_lock_shared({BARRIER});\n"
        ),
    );
    contended(&db, &url, Tool::Sqlx(&dir)).await;
    let sum: i64 = sqlx::query_scalar("SELECT sum(balance)::bigint FROM accounts")
        .fetch_one(db.pool())
        .await
        .expect("read accounts");
    assert_eq!(sum, 55 * 100, "balances multiplied exactly once");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Another role's session cannot declare a lease it may not act under:
/// with the holder's current token in its settings, its protected write
/// and its DDL are refused (42501); an undeclared session's protected
/// write is refused as before (LE002) and its DDL passes the fence; a
/// stale declaration is refused (LE001).
async fn a_declaration_is_a_claim_the_database_checks() {
    let db = crate::common::new_db().await;
    let m = db.manager();
    let intruder = format!("{}_intruder", db.name());
    db.scratch_roles(&[&intruder]).await;
    db.execute(&[
        format!("CREATE ROLE {intruder} LOGIN PASSWORD 'pw'"),
        format!("GRANT USAGE, CREATE ON SCHEMA public TO {intruder}"),
        format!("GRANT USAGE ON SCHEMA pglease TO {intruder}"),
        "CREATE TABLE ledger (id integer PRIMARY KEY)".to_owned(),
        format!("GRANT INSERT, SELECT ON ledger TO {intruder}"),
        "SELECT pglease.protect('ledger', 'migrations')".to_owned(),
        "SELECT pglease.fence_ddl(true)".to_owned(),
    ])
    .await;
    let how = pglease::AcquireOptions::ttl(Duration::from_secs(600)).holder("A");
    // An earlier term first, so that token - 1 below is a stale token.
    let earlier = m.acquire("migrations", how.clone()).await.expect("acquire");
    m.release(&crate::common::fence("migrations", earlier.token()))
        .await
        .expect("release");
    let lease = m.acquire("migrations", how).await.expect("acquire");
    let declared = |token: i64| format!("-c pglease.name=migrations -c pglease.token={token}");
    let psql = |url: &str, options: Option<String>, sql: &str| {
        let mut c = Command::new("psql");
        c.args([url, "-X", "-q", "-v", "VERBOSITY=verbose", "-c", sql])
            .env_remove("PGOPTIONS");
        if let Some(options) = options {
            c.env("PGOPTIONS", options);
        }
        c.output().expect("run psql")
    };
    let sqlstate = |out: &std::process::Output| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        err.split_once("ERROR:  ")
            .map(|(_, rest)| rest.split(':').next().unwrap_or("").trim().to_owned())
            .unwrap_or_default()
    };
    let token = lease.token().get();
    let theirs = db.url_for(&intruder, "pw");
    for sql in [
        "INSERT INTO ledger VALUES (1)",
        "CREATE TABLE theirs (x int)",
    ] {
        let out = psql(&theirs, Some(declared(token)), sql);
        assert_eq!(sqlstate(&out), NOT_PERMITTED, "{sql}: {}", stderr(&out));
    }
    let out = psql(&theirs, None, "INSERT INTO ledger VALUES (1)");
    assert_eq!(sqlstate(&out), NOT_DECLARED, "{}", stderr(&out));
    let out = psql(&theirs, None, "CREATE TABLE undeclared (x int)");
    assert!(out.status.success(), "undeclared DDL: {}", stderr(&out));
    // The holder's own sessions, declared: current token yes, stale no.
    let ours = db.url();
    let out = psql(
        &ours,
        Some(declared(token)),
        "INSERT INTO ledger VALUES (2)",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = psql(
        &ours,
        Some(declared(token - 1)),
        "INSERT INTO ledger VALUES (3)",
    );
    assert_eq!(sqlstate(&out), NOT_HELD, "{}", stderr(&out));
    let rows: Vec<i32> = sqlx::query_scalar("SELECT id FROM ledger ORDER BY id")
        .fetch_all(db.pool())
        .await
        .expect("read");
    assert_eq!(rows, vec![2]);

    // A session of another role that names itself after a term is not
    // ended when the term is taken over (a name is a hint); one of the
    // holder's role is.
    let short = m
        .acquire(
            "short",
            pglease::AcquireOptions::ttl(Duration::from_millis(500)).holder("A"),
        )
        .await
        .expect("acquire short");
    let named = format!("pglease:{}", short.token());
    let sleeper = |url: String| {
        Command::new("psql")
            .args([url.as_str(), "-X", "-q", "-c", "SELECT pg_sleep(60)"])
            .env("PGAPPNAME", &named)
            .env_remove("PGOPTIONS")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start psql")
    };
    let mut theirs_session = sleeper(theirs.clone());
    let mut ours_session = sleeper(ours.clone());
    let sessions = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT usename::text FROM pg_stat_activity WHERE application_name = $1 \
             ORDER BY usename",
        )
        .bind(&named)
        .fetch_all(db.pool())
        .await
        .expect("read pg_stat_activity")
    };
    poll_until("both named sessions", BOUND, || async {
        sessions().await.len() == 2
    })
    .await;
    db.wait_until(short.expires_at()).await;
    m.acquire(
        "short",
        pglease::AcquireOptions::ttl(Duration::from_secs(60)).holder("B"),
    )
    .await
    .expect("take short over");
    poll_until("the holder's role's named session ended", BOUND, || async {
        sessions().await == vec![intruder.clone()]
    })
    .await;
    let _ = theirs_session.kill();
    let _ = ours_session.kill();
    let _ = theirs_session.wait();
    let _ = ours_session.wait();
    db.execute(&["SELECT pglease.fence_ddl(false)"]).await;
}

/// `CREATE INDEX CONCURRENTLY` under the lease, with the DDL fence on,
/// while three other deployers wait for the lease (`--wait`, in line): it
/// completes, no deadlock (a waiter holds no snapshot while it waits), and
/// each waiter then runs and finds the index there.
async fn create_index_concurrently_completes_while_three_deployers_wait() {
    let db = crate::common::new_db().await;
    db.execute(&[
        "CREATE TABLE accounts (id integer PRIMARY KEY, balance bigint NOT NULL)",
        "INSERT INTO accounts SELECT g, g FROM generate_series(1, 1000) AS g",
        "SELECT pglease.fence_ddl(true)",
    ])
    .await;
    let barrier = Barrier::hold(&db).await;
    let url = db.url();
    // psql's -c are separate transactions: the barrier's, then the index's
    // (CREATE INDEX CONCURRENTLY runs outside any transaction block).
    let script = format!(
        "psql '{url}' -X -q -v ON_ERROR_STOP=1 \
           -c 'SELECT pg_advisory_lock_shared({BARRIER}); SELECT pg_advisory_unlock_shared({BARRIER})' \
           -c 'CREATE INDEX CONCURRENTLY IF NOT EXISTS accounts_balance ON accounts (balance)'"
    );
    let deployer = |holder: &str| {
        command(
            &db,
            &[
                "run",
                "migrations",
                "--declare",
                "--ttl",
                "2s",
                "--fair",
                "--wait",
                "60s",
                "--holder",
                holder,
                "--",
                "sh",
                "-c",
                &script,
            ],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a deployer")
    };
    let first = deployer("first");
    poll_until("the first deployer at the barrier", BOUND, || {
        waits_at_barrier(&db)
    })
    .await;
    let waiters: Vec<Child> = ["second", "third", "fourth"]
        .into_iter()
        .map(deployer)
        .collect();
    poll_until("three deployers in line", BOUND, || async {
        let waiting: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pglease.line WHERE name = 'migrations'")
                .fetch_one(db.pool())
                .await
                .expect("read the line");
        waiting == 3
    })
    .await;
    barrier.open().await;
    for (who, child) in std::iter::once(first).chain(waiters).enumerate() {
        let status = wait_bounded(child).await;
        assert_eq!(status.code(), Some(0), "deployer {who}");
    }
    let valid: bool = sqlx::query_scalar(
        "SELECT i.indisvalid FROM pg_index AS i WHERE i.indexrelid = 'accounts_balance'::regclass",
    )
    .fetch_one(db.pool())
    .await
    .expect("the index");
    assert!(valid, "the index is valid");
    let tokens = acquired_tokens(&db).await;
    assert_eq!(tokens.len(), 4, "four terms: {tokens:?}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    db.execute(&["SELECT pglease.fence_ddl(false)"]).await;
}

/// A psql job (`run job --declare -- psql -f job.sql`) frozen past its TTL
/// cannot commit its write to a protected table afterwards: with its
/// application_name as `run` gives it, the next holder's takeover ends its
/// session; with one of its own (`PGAPPNAME=report`), the write is refused
/// under its stale token when it resumes (LE001). Either way `run` exits 4.
async fn a_frozen_psql_job_cannot_commit_its_write_afterwards() {
    let db = crate::common::new_db().await;
    db.execute(&[
        "CREATE TABLE report (at timestamptz NOT NULL DEFAULT clock_timestamp(), token bigint)",
        "SELECT pglease.protect('report', 'job')",
    ])
    .await;
    let m = db.manager();
    for own_appname in [false, true] {
        let job = std::env::temp_dir().join(format!("pglease-job-{}.sql", db.name()));
        std::fs::write(
            &job,
            format!(
                "SELECT pg_advisory_lock_shared({BARRIER});\n\
                 SELECT pg_advisory_unlock_shared({BARRIER});\n\
                 INSERT INTO report (token) VALUES (current_setting('pglease.token')::bigint);\n"
            ),
        )
        .expect("write the job");
        let pidfile = std::env::temp_dir().join(format!("pglease-job-{}.pid", db.name()));
        let _ = std::fs::remove_file(&pidfile);
        let appname = if own_appname {
            "export PGAPPNAME=report; "
        } else {
            ""
        };
        let script = format!(
            "echo pid:$$ > '{}'; {appname}exec psql \"$PGLEASE_DATABASE_URL\" -X -q -v ON_ERROR_STOP=1 -f '{}'",
            pidfile.display(),
            job.display()
        );
        let barrier = Barrier::hold(&db).await;
        let run = command(
            &db,
            &[
                "run",
                "job",
                "--declare",
                "--ttl",
                "1s",
                "--",
                "sh",
                "-c",
                &script,
            ],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the job");
        poll_until("the job at the barrier", BOUND, || waits_at_barrier(&db)).await;
        let group = group_of(&pidfile).expect("the job wrote its pid");
        let frozen_token = m
            .inspect("job")
            .await
            .expect("inspect")
            .token
            .expect("the job holds the lease")
            .get();
        freeze(&run, group, Signal::SIGSTOP);
        barrier.open().await;
        // Another run of the job takes over once the frozen one's lease
        // has expired, and makes its own write.
        let next = command(
            &db,
            &[
                "run",
                "job",
                "--declare",
                "--ttl",
                "10s",
                "--wait",
                "30s",
                "--",
                "psql",
                &db.url(),
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                "INSERT INTO report (token) VALUES (current_setting('pglease.token')::bigint)",
            ],
        )
        .stdin(Stdio::null())
        .output()
        .expect("the next run");
        assert_eq!(code(&next), 0, "the next run: {}", stderr(&next));
        let written: i64 = sqlx::query_scalar("SELECT count(*) FROM report")
            .fetch_one(db.pool())
            .await
            .expect("count");
        freeze(&run, group, Signal::SIGCONT);
        let out = run.wait_with_output().expect("the frozen job ends");
        assert_eq!(code(&out), 4, "{}", stderr(&out));
        let after: i64 = sqlx::query_scalar("SELECT count(*) FROM report")
            .fetch_one(db.pool())
            .await
            .expect("count");
        assert_eq!(after, written, "the frozen job's write landed afterwards");
        let stale: i64 = sqlx::query_scalar("SELECT count(*) FROM report WHERE token = $1")
            .bind(frozen_token)
            .fetch_one(db.pool())
            .await
            .expect("count");
        assert_eq!(stale, 0, "a write under the frozen job's token");
        let _ = std::fs::remove_file(&job);
    }
    another_role_cannot_act_under(&db, "job", "report").await;
}

pglease_formations::tests![
    a_frozen_deployers_ddl_migration_never_commits_after_the_takeover(2),
    a_frozen_deployers_data_migration_is_applied_exactly_once(2),
    alembic_run_unmodified_is_fenced(2),
    a_non_superuser_owner_fences_migrations_with_the_version_table(2),
    a_declaration_is_a_claim_the_database_checks,
    create_index_concurrently_completes_while_three_deployers_wait(2),
    a_frozen_psql_job_cannot_commit_its_write_afterwards(2),
];
