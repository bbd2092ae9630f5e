//! Each peer as a contender of the scenario engine
//! (`pglease_scenarios::engine`): the scripts, the ledger and the
//! verdicts are the demo's; what is here is how each library acquires,
//! writes and suffers each fault. A's connections go through a proxy
//! (`pglease_formations::Forwarder`) the scenario freezes (a paused
//! holder, unanswered renewals) and are named `peer-A`, so that a killed
//! connection is all of them; B's go straight to the server.

mod dlock;
mod lease;
pub(crate) mod net;
mod pg_lease;
mod sqlx_lock;

use std::time::Duration;

use pglease::testing::TestDatabase;
use pglease_scenarios::engine::{self, Fault, Ledger, Scenario, Stage, Verdict, Who, Written};

use crate::{BoxError, Peer};
use pglease_formations::Forwarder;

/// The scenarios run here: (c), a holder that dies without releasing,
/// is the demo's only.
pub const SCENARIOS: [Scenario; 4] = [
    Scenario::PausedHolder,
    Scenario::KilledConnection,
    Scenario::LateRelease,
    Scenario::SilentRenewal,
];

/// The leases' TTL in `scenario`.
fn ttl(scenario: Scenario) -> Duration {
    match scenario {
        Scenario::KilledConnection => Duration::from_secs(2),
        _ => Duration::from_secs(1),
    }
}

/// How long B tries to take over in `scenario`: from the freeze or the
/// kill, or from the late release's arrival.
fn window(scenario: Scenario) -> Duration {
    match scenario {
        Scenario::LateRelease => Duration::from_secs(2),
        _ => Duration::from_secs(3),
    }
}

/// What a peer's contender works in: a database of its own with the
/// ledger, and the proxy A's connections go through.
pub(crate) struct Setting {
    pub(crate) db: TestDatabase,
    pub(crate) proxy: Forwarder,
    pub(crate) ledger: Ledger,
    pub(crate) scenario: Scenario,
    /// (b): how many of A's connections the kill ended.
    killed: tokio::sync::Mutex<Option<i64>>,
}

impl Setting {
    pub(crate) fn ttl(&self) -> Duration {
        ttl(self.scenario)
    }

    /// Appends `who`'s row through `pool` (a write the library does not
    /// guard).
    pub(crate) async fn write(&self, pool: &sqlx08::PgPool, who: Who) -> Result<Written, BoxError> {
        Ok(committed(
            sqlx08::query(&self.ledger.insert())
                .bind(who.name())
                .execute(pool)
                .await,
        ))
    }

    /// The faults every peer suffers alike: A's network freezes (a pause,
    /// a stall) or A's connections are killed. A late release is the
    /// peer's own.
    pub(crate) async fn fault(&self, fault: Fault) -> Result<(), BoxError> {
        match fault {
            Fault::Pause | Fault::Stall => self.proxy.freeze(),
            Fault::Kill => {
                *self.killed.lock().await = Some(crate::kill(&self.db, "peer-A").await?);
            }
            Fault::LateRelease | Fault::Die => {}
        }
        Ok(())
    }

    /// The end of every fault: A's network thaws.
    pub(crate) fn heal(&self) {
        self.proxy.open();
    }

    /// How many of A's connections the kill ended.
    pub(crate) fn killed(&self) -> i64 {
        self.killed.try_lock().ok().and_then(|k| *k).unwrap_or(0)
    }
}

/// What became of a commit (or a write that commits on its own).
pub(crate) fn committed<T, E: std::fmt::Display>(outcome: Result<T, E>) -> Written {
    match outcome {
        Ok(_) => Written::Committed,
        Err(e) => Written::Refused(e.to_string()),
    }
}

/// What B managed in the window, for the details.
pub(crate) fn takeover_text(took_over: Option<Duration>, window: Duration) -> String {
    match took_over {
        Some(t) => format!("took over after {} ms", t.as_millis()),
        None => format!("could not take over within {} s", window.as_secs()),
    }
}

/// A's write after the fault, for the details.
pub(crate) fn written_text(written: Option<&Written>) -> String {
    match written {
        Some(Written::Committed) => "committed".to_owned(),
        Some(Written::Refused(why)) => format!("refused ({why})"),
        None => "not sent".to_owned(),
    }
}

/// `scenario` for `peer`, in a database of its own.
///
/// # Errors
///
/// A peer or the database failing in a way the scenario does not expect.
pub async fn run(scenario: Scenario, peer: Peer) -> Result<Verdict<Peer>, BoxError> {
    let db = TestDatabase::new().await?;
    let ledger = Ledger::create(db.pool(), "ledger").await?;
    let proxy = Forwarder::start(net::target(&db).await?).await?;
    let setting = Setting {
        db,
        proxy,
        ledger,
        scenario,
        killed: tokio::sync::Mutex::new(None),
    };
    let stage = Stage::new(&setting.ledger, setting.db.pool(), &window);
    match peer {
        Peer::Pglease => {
            let contender = lease::PgleaseContender::new(&setting).await?;
            engine::run(&stage, scenario, peer, &contender).await
        }
        Peer::PgLease => {
            let contender = pg_lease::PgLeaseContender::new(&setting).await?;
            engine::run(&stage, scenario, peer, &contender).await
        }
        Peer::DistributedLock => {
            let contender = dlock::DlockContender::new(&setting).await?;
            engine::run(&stage, scenario, peer, &contender).await
        }
        Peer::SqlxAdvisoryLock => {
            let contender = sqlx_lock::SqlxLockContender::new(&setting).await?;
            engine::run(&stage, scenario, peer, &contender).await
        }
    }
}
