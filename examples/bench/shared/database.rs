//! The server the benchmark runs on, the databases it creates and drops,
//! and their set-up.

use std::path::PathBuf;

use pglease::{Error, LeaseManager};
use pglease_formations::SetupError;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgPool};

/// The server to benchmark, found as the tests find theirs
/// (`pglease::provision`: DATABASE_URL, the libpq defaults, a throwaway
/// cluster, a container).
pub(crate) async fn server() -> Result<PgConnectOptions, Error> {
    Ok(found().await?.options.clone())
}

pub(crate) async fn found() -> Result<&'static pglease::provision::Server, Error> {
    pglease::provision::server()
        .await
        .map_err(|e| Error::Database(sqlx::Error::Configuration(Box::new(e))))
}

/// A throwaway server of the test kit (PgBouncer, a replicated pair):
/// `None`, said on stdout, when this machine lacks what it needs.
pub(crate) fn kit<T>(what: &str, started: Result<T, SetupError>) -> Result<Option<T>, Error> {
    match started {
        Ok(server) => Ok(Some(server)),
        Err(SetupError::Unavailable(why)) => {
            println!("\n{what}: skipped ({why})");
            Ok(None)
        }
        Err(e) => Err(Error::Database(sqlx::Error::Configuration(Box::new(e)))),
    }
}

/// A new, empty database `name` (dropped first if a run left it behind),
/// and a pool of `connections` on it.
pub(crate) async fn fresh_database(name: &str, connections: u32) -> Result<PgPool, Error> {
    let server = server().await?;
    let mut admin = server.connect().await?;
    for statement in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        sqlx::query(AssertSqlSafe(statement))
            .execute(&mut admin)
            .await?;
    }
    admin.close().await?;
    Ok(PgPoolOptions::new()
        .max_connections(connections)
        .connect_with(server.database(name))
        .await?)
}

/// Drops database `name` (its pool's connections with it).
pub(crate) async fn drop_database(name: &str) -> Result<(), Error> {
    let mut admin = server().await?.connect().await?;
    sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await?;
    Ok(())
}

/// The database most measures share, `pglease_bench`: pglease's schema,
/// a data table of 16 rows, and the home-made alternative (`raw_leases`).
pub(crate) async fn setup() -> Result<PgPool, Error> {
    let pool = fresh_database("pglease_bench", 8).await?;
    LeaseManager::new(pool.clone()).migrate().await?;
    sqlx::query("CREATE TABLE data (id int PRIMARY KEY, value bigint NOT NULL)")
        .execute(&pool)
        .await?;
    sqlx::query("INSERT INTO data SELECT g, 0 FROM generate_series(0, 15) g")
        .execute(&pool)
        .await?;
    // The home-made alternative: a lease table driven by bare statements.
    sqlx::raw_sql(
        "CREATE SEQUENCE raw_seq; \
         CREATE TABLE raw_leases (name text PRIMARY KEY, holder text, token bigint NOT NULL, \
                                  expires_at timestamptz NOT NULL) WITH (fillfactor = 80); \
         INSERT INTO raw_leases SELECT 'cycle-' || g, NULL, 0, '-infinity' FROM generate_series(0, 7) g; \
         INSERT INTO raw_leases SELECT 'held-' || g, 'bench', nextval('raw_seq'), now() + interval '1 hour' \
           FROM generate_series(0, 7) g;",
    )
    .execute(&pool)
    .await?;
    Ok(pool)
}

/// The pgbench scripts' directory, `bench/pgbench/`.
pub(crate) fn scripts() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/pgbench")
}

/// A new database `name` with pglease's schema and the pgbench scripts'
/// set-up (`bench/pgbench/setup.sql`), which P1 through the library
/// shares with the SQL level; and a pool of `connections` on it.
pub(crate) async fn pgbench_database(name: &str, connections: u32) -> Result<PgPool, Error> {
    let pool = fresh_database(name, connections).await?;
    LeaseManager::new(pool.clone()).migrate().await?;
    let setup = std::fs::read_to_string(scripts().join("setup.sql"))
        .map_err(|e| Error::Database(sqlx::Error::Io(e)))?;
    sqlx::raw_sql(AssertSqlSafe(setup)).execute(&pool).await?;
    Ok(pool)
}

/// What `token - N` is for every held lease `held-N` of `table` (the
/// set-up acquired them in order, so their tokens are consecutive in N;
/// the scripts compute each token from its N).
pub(crate) async fn held_token_offset(pool: &PgPool, table: &str) -> Result<i64, Error> {
    let (low, high): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT min(token - substr(name, 6)::bigint), max(token - substr(name, 6)::bigint) \
         FROM {table} WHERE name LIKE 'held-%'"
    )))
    .fetch_one(pool)
    .await?;
    assert_eq!(
        low, high,
        "tokens of {table}'s held leases are not consecutive"
    );
    Ok(low)
}

/// Tops `pglease.leases` up to `rows` rows with other leases, half of them
/// held and half released, as a busy installation would have.
pub(crate) async fn fill(pool: &PgPool, rows: i64) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO pglease.leases (name, holder, token, expires_at, acquired_at) \
         SELECT 'filler-' || g, CASE WHEN g % 2 = 0 THEN 'filler' END, g, \
                CASE WHEN g % 2 = 0 THEN now() + interval '1 day' ELSE now() END, now() \
           FROM generate_series((SELECT count(*) FROM pglease.leases) + 1, $1) AS g",
    )
    .bind(rows)
    .execute(pool)
    .await?;
    sqlx::query("VACUUM ANALYZE pglease.leases")
        .execute(pool)
        .await?;
    Ok(())
}

/// Turns the history off (`pglease.set_history('0')`, the documented off
/// switch, an administrator's) or on again with the default retention.
pub(crate) async fn set_history(pool: &PgPool, on: bool) -> Result<(), Error> {
    let retention = if on { "30 days" } else { "0" };
    sqlx::query("SELECT pglease.set_history($1::interval)")
        .bind(retention)
        .execute(pool)
        .await?;
    Ok(())
}
