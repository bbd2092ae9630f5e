//! What the tests share: a test database (the library's test kit,
//! `pglease::testing`).

pub use pglease::testing::TestDatabase as TestDb;

/// A new test database with the `pglease` schema applied, dropped when the
/// value is dropped.
pub async fn new_db() -> TestDb {
    TestDb::new().await.unwrap_or_else(|e| panic!("{e}"))
}
