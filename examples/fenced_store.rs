//! A resource outside the database that fences its writers by token: a
//! small file store that remembers the highest token it has accepted (in
//! its directory, so the mark survives a restart) and rejects lower ones.
//!
//! Run: `cargo run --example fenced_store` (the leases on DATABASE_URL,
//! else the libpq defaults, else a throwaway cluster; the store lives in a temporary directory).
//!
//! Worker A acquires the lease and writes; its lease expires while it is
//! paused; worker B acquires (larger token) and writes; A's delayed write
//! reaches the store and is rejected there, with no help from A.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use pglease::{AcquireOptions, Error, HighWaterMark, LeaseManager, Token};
use sqlx::postgres::PgPoolOptions;

/// The store: one file per key, and `.fence` with the highest token.
struct FileStore {
    dir: PathBuf,
    mark: HighWaterMark,
    // Check, persist and write as one step, so that a lower token can never
    // slip in between the check and the write.
    write: Mutex<()>,
}

impl FileStore {
    fn open(dir: &Path) -> std::io::Result<Self> {
        fs::create_dir_all(dir)?;
        let highest = fs::read_to_string(dir.join(".fence"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        Ok(FileStore {
            dir: dir.to_owned(),
            mark: HighWaterMark::starting_at(highest),
            write: Mutex::new(()),
        })
    }

    /// Writes `value` under `key` if `token` is at least the highest seen.
    fn put(&self, key: &str, value: &str, token: Token) -> std::io::Result<bool> {
        let _turn = self.write.lock().unwrap_or_else(|e| e.into_inner());
        if !self.mark.admit(token) {
            return Ok(false);
        }
        // Persist the mark before the data (write, then rename: atomic).
        let tmp = self.dir.join(".fence.tmp");
        fs::write(&tmp, self.mark.highest().to_string())?;
        fs::rename(&tmp, self.dir.join(".fence"))?;
        fs::write(self.dir.join(key), value)?;
        Ok(true)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // DATABASE_URL, else the libpq defaults, else a throwaway cluster.
    let options = pglease::provision::server().await?.options.clone();
    let pool = PgPoolOptions::new().connect_with(options).await?;
    let leases = LeaseManager::new(pool);
    leases.migrate().await?;

    let dir = std::env::temp_dir().join(format!("pglease-store-{}", std::process::id()));
    let store = FileStore::open(&dir)?;
    let name = format!("report-store-{}", std::process::id());
    let ttl = Duration::from_millis(500);

    let a = leases
        .acquire(&name, AcquireOptions::ttl(ttl).holder("worker-A"))
        .await?;
    println!(
        "A acquires token {} and writes: accepted = {}",
        a.token(),
        store.put("report", "A's draft", a.token())?
    );
    println!("A pauses past its TTL ...");
    tokio::time::sleep(ttl * 2).await;
    let b = match leases
        .acquire(&name, AcquireOptions::ttl(ttl).holder("worker-B"))
        .await
    {
        Ok(b) => b,
        Err(Error::Held { .. }) => return Err("the lease did not expire".into()),
        Err(e) => return Err(e.into()),
    };
    println!(
        "B acquires token {} and writes: accepted = {}",
        b.token(),
        store.put("report", "B's final", b.token())?
    );
    let late = store.put("report", "A's stale draft", a.token())?;
    println!(
        "A's delayed write with token {}: accepted = {late}",
        a.token()
    );
    println!(
        "the store holds: {:?}",
        fs::read_to_string(dir.join("report"))?
    );

    // The same rule kept in the database, for resources that can reach it.
    let resource = format!("store-{}", std::process::id());
    println!(
        "pglease.admit: B's token {} accepted = {}, A's token {} accepted = {}",
        b.token(),
        leases.admit(&resource, b.token()).await?,
        a.token(),
        leases.admit(&resource, a.token()).await?
    );

    leases.release(&b).await?;
    fs::remove_dir_all(&dir)?;
    assert!(!late, "the store accepted a stale token");
    Ok(())
}
