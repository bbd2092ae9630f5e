//! Connecting a scenario's workers: B straight to the server, A through
//! a proxy the scenario can freeze (to the server, a frozen network and a
//! paused process look the same: nothing arrives).

use std::time::Duration;

use pglease::LeaseManager;
use pglease::testing::TestDatabase;
use sqlx08::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::BoxError;
use pglease_formations::{Forwarder, Target};

/// Where the test database's server listens.
pub(crate) async fn target(db: &TestDatabase) -> Result<Target, BoxError> {
    let options = db.options();
    let (host, port) = (options.get_host().to_owned(), options.get_port());
    if host.starts_with('/') {
        return Ok(Target::Unix(format!("{host}/.s.PGSQL.{port}").into()));
    }
    let addr = tokio::net::lookup_host((host.as_str(), port))
        .await?
        .next()
        .ok_or("the server's host has no address")?;
    Ok(Target::Tcp(addr))
}

/// The password in the test database's URL, if it has one (a container's).
fn password(db: &TestDatabase) -> Option<String> {
    let url = db.url();
    let (_, rest) = url.split_once("://")?;
    let credentials = rest.split_once('@')?.0;
    Some(credentials.split_once(':')?.1.to_owned())
}

/// A sqlx 0.8 pool through the proxy, its connections named `peer-A`.
pub(crate) async fn proxied_pool(db: &TestDatabase, proxy: &Forwarder) -> Result<PgPool, BoxError> {
    let options = db.options();
    let mut through = PgConnectOptions::new_without_pgpass()
        .host("127.0.0.1")
        .port(proxy.port())
        .username(options.get_username())
        .database(db.name())
        .application_name("peer-A");
    if let Some(password) = password(db) {
        through = through.password(&password);
    }
    Ok(PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(through)
        .await?)
}

/// A pglease manager through the proxy, its connections named `peer-A`.
pub(crate) async fn proxied_manager(
    db: &TestDatabase,
    proxy: &Forwarder,
) -> Result<LeaseManager, BoxError> {
    Ok(LeaseManager::new(
        pglease::connect::pool_options()
            .max_connections(4)
            .connect_with(proxied_options(db, proxy))
            .await?,
    ))
}

/// The same, as pglease's sqlx 0.9 options.
pub(crate) fn proxied_options(
    db: &TestDatabase,
    proxy: &Forwarder,
) -> sqlx::postgres::PgConnectOptions {
    let options = db.options();
    let mut through = sqlx::postgres::PgConnectOptions::new()
        .host("127.0.0.1")
        .port(proxy.port())
        .username(options.get_username())
        .database(db.name())
        .application_name("peer-A");
    if let Some(password) = password(db) {
        through = through.password(&password);
    }
    through
}
