//! pgbench running the scripts of `bench/pgbench/`, and the SQL level's
//! three-way rows.

use std::path::{Path, PathBuf};

use pglease::Error;

use sqlx::PgPool;

use super::database::{found, held_token_offset, scripts};
use super::timing::median_f64;

/// pgbench, ready to run the scripts of `bench/pgbench/` on a database
/// set up by `setup.sql`.
pub(crate) struct Pgbench {
    binary: PathBuf,
    url: String,
    /// `token - N` of pglease's held leases `held-N` (`:off`).
    offset: i64,
    /// The same in `raw_leases` (`:roff`).
    raw_offset: i64,
}

impl Pgbench {
    /// `binary` run on the database at `url`, whose held leases' tokens
    /// are `offset` (pglease's) and `raw_offset` (`raw_leases`') above
    /// their numbers.
    pub(crate) fn new(binary: PathBuf, url: String, offset: i64, raw_offset: i64) -> Self {
        Self {
            binary,
            url,
            offset,
            raw_offset,
        }
    }

    /// `binary` run on database `db` of the benchmark's server, set up by
    /// `setup.sql` (`pool` is a pool on it): the token offsets of its held
    /// leases read there.
    pub(crate) async fn on(binary: PathBuf, pool: &PgPool, db: &str) -> Result<Self, Error> {
        let offset = held_token_offset(pool, "pglease.leases").await?;
        let raw_offset = held_token_offset(pool, "raw_leases").await?;
        Ok(Self::new(
            binary,
            found().await?.url(db),
            offset,
            raw_offset,
        ))
    }

    /// Transactions per second of one pgbench run of `script`
    /// (`bench/pgbench/{script}.sql`), prepared statements, `clients`
    /// clients on `names` names, for `secs` (rounded up to whole seconds).
    pub(crate) fn tps(
        &self,
        script: &str,
        clients: usize,
        names: u32,
        secs: f64,
    ) -> Result<f64, Error> {
        self.tps_with(script, clients, names, secs, &[])
    }

    /// [`Pgbench::tps`] with `env` added to pgbench's environment (which
    /// libpq reads when pgbench connects: `PGOPTIONS`, say).
    pub(crate) fn tps_with(
        &self,
        script: &str,
        clients: usize,
        names: u32,
        secs: f64,
        env: &[(&str, String)],
    ) -> Result<f64, Error> {
        let script = scripts().join(format!("{script}.sql"));
        let output = std::process::Command::new(&self.binary)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .args(["-n", "-M", "prepared"])
            .args(["-c", &clients.to_string(), "-j", &clients.to_string()])
            .args(["-T", &format!("{}", secs.ceil().max(1.0) as u64)])
            .args(["-D", &format!("names={names}")])
            .args(["-D", &format!("off={}", self.offset)])
            .args(["-D", &format!("roff={}", self.raw_offset)])
            .arg("-f")
            .arg(&script)
            .arg(&self.url)
            .output()
            .map_err(|e| Error::Database(sqlx::Error::Io(e)))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let tps = stdout
            .lines()
            .find_map(|line| line.strip_prefix("tps = "))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok());
        match tps {
            Some(tps) if output.status.success() => Ok(tps),
            _ => Err(failed(&script, &output)),
        }
    }
}

/// A pgbench run that did not report its tps, as an error.
fn failed(script: &Path, output: &std::process::Output) -> Error {
    Error::Database(sqlx::Error::Configuration(
        format!(
            "pgbench {} failed ({}): {}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into(),
    ))
}

/// pgbench on PATH, else the newest server package's.
pub(crate) fn find() -> Result<PathBuf, Error> {
    binary().ok_or_else(|| {
        Error::Database(sqlx::Error::Configuration(
            "pgbench not found on PATH or in /usr/lib/postgresql/*/bin (Debian: the \
             postgresql-client package)"
                .into(),
        ))
    })
}

fn binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("pgbench"))
            .find(|candidate| candidate.is_file())
    });
    on_path.or_else(|| {
        let mut found: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|entry| Some(entry.ok()?.path().join("bin/pgbench")))
            .filter(|candidate| candidate.is_file())
            .collect();
        found.sort();
        found.pop()
    })
}

/// One row's cells from its rounds of `[raw, floor, pglease]` tps: the
/// median tps of each, pglease / floor per round and its median, then the
/// medians of pglease / raw and floor / raw (each a median of the rounds'
/// own ratios, so that a slow round moves one ratio, not every cell).
pub(crate) fn three_way(rounds: &[[f64; 3]]) -> String {
    let column = |i: usize| rounds.iter().map(|r| r[i]).collect::<Vec<f64>>();
    let ratio = |a: usize, b: usize| rounds.iter().map(|r| r[a] / r[b]).collect::<Vec<f64>>();
    let over_floor = ratio(2, 1);
    let each: Vec<String> = over_floor.iter().map(|r| format!("{r:.2}")).collect();
    format!(
        "{:.0} | {:.0} | {:.0} | {} | {:.2} | {:.2} | {:.2}",
        median_f64(&mut column(0)),
        median_f64(&mut column(1)),
        median_f64(&mut column(2)),
        each.join(", "),
        median_f64(&mut over_floor.clone()),
        median_f64(&mut ratio(2, 0)),
        median_f64(&mut ratio(1, 0))
    )
}
