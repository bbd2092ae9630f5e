//! sqlx 0.8's `PgAdvisoryLock` (session level): the guard owns the
//! connection that holds the lock, and writes go through it, as its
//! documentation shows.

use std::sync::LazyLock;
use std::time::Duration;

use pglease_scenarios::engine::{BoxError, Contender, Fault, Scenario, Seen, Who, Written};
use sqlx08::pool::PoolConnection;
use sqlx08::postgres::{PgAdvisoryLock, PgAdvisoryLockGuard, PgPool};
use sqlx08::{Either, Postgres};

use super::{Setting, committed, net, takeover_text, written_text};

/// The lock on `res` (a guard borrows its lock for as long as it lives).
static RES: LazyLock<PgAdvisoryLock> = LazyLock::new(|| PgAdvisoryLock::new("res"));

/// A holder's guard, with the connection it owns.
pub(crate) type Held = PgAdvisoryLockGuard<'static, PoolConnection<Postgres>>;

pub(crate) struct SqlxLockContender<'a> {
    s: &'a Setting,
    a_pool: PgPool,
    b_pool: PgPool,
}

impl<'a> SqlxLockContender<'a> {
    pub(crate) async fn new(s: &'a Setting) -> Result<SqlxLockContender<'a>, BoxError> {
        Ok(SqlxLockContender {
            s,
            a_pool: net::proxied_pool(&s.db, &s.proxy).await?,
            b_pool: crate::pool(&s.db, "peer-B").await?,
        })
    }
}

/// `who`'s row on the guard's connection.
async fn insert(s: &Setting, guard: &mut Held, who: Who) -> Result<(), sqlx08::Error> {
    sqlx08::query(&s.ledger.insert())
        .bind(who.name())
        .execute(&mut **guard)
        .await?;
    Ok(())
}

impl Contender for SqlxLockContender<'_> {
    type Held = Held;

    fn lacks(&self, scenario: Scenario) -> Option<&'static str> {
        (scenario == Scenario::LateRelease).then_some(
            "release consumes the guard and waits for the unlock's answer, so the API cannot \
             send a release late or twice",
        )
    }

    async fn acquire(&self, who: Who, wait: Duration) -> Result<Option<Held>, BoxError> {
        let pool = match who {
            Who::A => &self.a_pool,
            Who::B => &self.b_pool,
        };
        let start = std::time::Instant::now();
        loop {
            if let Either::Left(guard) = RES.try_acquire(pool.acquire().await?).await? {
                return Ok(Some(guard));
            }
            if start.elapsed() >= wait {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn write(&self, held: &mut Held, who: Who) -> Result<Written, BoxError> {
        Ok(committed(insert(self.s, held, who).await))
    }

    async fn stage(&self, held: &mut Held, who: Who) -> Result<bool, BoxError> {
        if self.s.scenario != Scenario::PausedHolder {
            return Ok(false);
        }
        // The write in a transaction on the guard's own connection.
        sqlx08::raw_sql("BEGIN").execute(&mut **held).await?;
        insert(self.s, held, who).await?;
        Ok(true)
    }

    async fn commit(&self, held: &mut Held) -> Result<Written, BoxError> {
        Ok(committed(
            sqlx08::raw_sql("COMMIT").execute(&mut **held).await,
        ))
    }

    async fn fault(&self, _held: &mut Held, fault: Fault) -> Result<(), BoxError> {
        self.s.fault(fault).await?;
        Ok(())
    }

    async fn heal(&self, _fault: Fault) -> Result<(), BoxError> {
        self.s.heal();
        Ok(())
    }

    async fn die(&self, held: Held) -> Result<(), BoxError> {
        drop(held);
        Ok(())
    }

    async fn release(&self, held: Held) -> Result<Option<bool>, BoxError> {
        drop(held);
        Ok(None)
    }

    fn detail(&self, scenario: Scenario, seen: &Seen) -> String {
        let takeover = takeover_text(seen.took_over, seen.window);
        let a_wrote = written_text(seen.a_wrote.as_ref());
        match scenario {
            Scenario::PausedHolder => format!(
                "the lock lives as long as A's session, which a frozen network does not end; B \
                 {takeover}; A's commit after the thaw: {a_wrote}; rows by insertion {:?}",
                seen.writers()
            ),
            Scenario::KilledConnection => format!(
                "A's connections ended: {}; the lock went with them, B {takeover}; A's write \
                 through the guard's connection, as documented: {a_wrote}",
                self.s.killed(),
            ),
            Scenario::LateRelease | Scenario::DeadHolder => "not run".to_owned(),
            Scenario::SilentRenewal => format!(
                "the lock stays with A's (frozen) session; there is nothing to renew and nothing \
                 to tell A; B {takeover}; A's write after the thaw: {a_wrote}"
            ),
        }
    }
}
