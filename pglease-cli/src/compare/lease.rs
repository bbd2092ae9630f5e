//! The scenarios against a lease with fencing.

use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};

use pglease::{AcquireOptions, Error, Fence, Result, Token};

use super::harness::Harness;

impl Harness {
    pub(super) async fn paused_lease(
        &self,
        name: &str,
    ) -> Result<(bool, Option<Duration>, String)> {
        let start = Instant::now();
        let a = self
            .m
            .acquire(name, AcquireOptions::ttl(self.ttl()).holder("A"))
            .await?;
        self.pause_until(a.expires_at()).await?;
        let b = self
            .m
            .acquire(name, AcquireOptions::ttl(self.ttl()).holder("B"))
            .await?;
        let took_over = start.elapsed();
        let b_wrote = self.fenced_write(b.fence(), "B").await?;
        let a_landed = self.fenced_write(a.fence(), "A").await?;
        self.m.release(&b).await?;
        let value = self.value().await?;
        let safe = b_wrote && !a_landed && value == "B";
        Ok((
            safe,
            Some(took_over),
            format!(
                "B took over after {} ms (the TTL); A's delayed write with token {} was {} \
                 (value {value:?})",
                took_over.as_millis(),
                a.token(),
                if a_landed {
                    "APPLIED"
                } else {
                    "rejected by the database (LE001)"
                }
            ),
        ))
    }

    pub(super) async fn killed_lease(
        &self,
        name: &str,
    ) -> Result<(bool, Option<Duration>, String)> {
        // A acquires on a connection of its own, which is then killed.
        let mut conn = PgConnection::connect_with(&self.m.pool().connect_options()).await?;
        let (token, pid): (i64, i32) =
            sqlx::query_as("SELECT token, pg_backend_pid() FROM pglease.acquire($1, 'A', $2)")
                .bind(name)
                .bind(self.ttl())
                .fetch_one(&mut conn)
                .await?;
        self.terminate(pid).await?;
        drop(conn);
        let start = Instant::now();
        let b = self
            .m
            .acquire(
                name,
                AcquireOptions::ttl(self.ttl())
                    .holder("B")
                    .wait(self.unit * 10),
            )
            .await?;
        let took_over = start.elapsed();
        self.fenced_write(b.fence(), "B").await?;
        let a_landed = self
            .fenced_write(&Fence::new(name, Token::new(token)?)?, "A")
            .await?;
        self.m.release(&b).await?;
        let value = self.value().await?;
        Ok((
            !a_landed && value == "B",
            Some(took_over),
            format!(
                "the lease outlived the killed connection; B took over {} ms later, at its \
                 expiry; A's write through a fresh connection was {}",
                took_over.as_millis(),
                if a_landed {
                    "APPLIED"
                } else {
                    "rejected by the database (LE001)"
                }
            ),
        ))
    }

    pub(super) async fn dead_lease(&self, name: &str) -> Result<(bool, Option<Duration>, String)> {
        let start = Instant::now();
        self.m
            .acquire(name, AcquireOptions::ttl(self.ttl()).holder("A"))
            .await?;
        // A dies here. B waits for the lease.
        let b = self
            .m
            .acquire(
                name,
                AcquireOptions::ttl(self.ttl())
                    .holder("B")
                    .wait(self.unit * 10),
            )
            .await?;
        let took_over = start.elapsed();
        self.m.release(&b).await?;
        Ok((
            b.token() > 0,
            Some(took_over),
            format!(
                "B took over {} ms after A's acquisition (TTL {} ms), whatever state A's host \
                 is in",
                took_over.as_millis(),
                self.ttl().as_millis()
            ),
        ))
    }

    pub(super) async fn duplicate_lease(
        &self,
        name: &str,
    ) -> Result<(bool, Option<Duration>, String)> {
        let first = self
            .m
            .acquire(name, AcquireOptions::ttl(self.ttl() * 10).holder("A"))
            .await?;
        self.m.release(&first).await?;
        let second = self
            .m
            .acquire(name, AcquireOptions::ttl(self.ttl() * 10).holder("A"))
            .await?;
        let duplicate = self.m.release(&first).await?;
        let b_got_it = match self
            .m
            .acquire(name, AcquireOptions::ttl(self.ttl()).holder("B"))
            .await
        {
            Ok(b) => {
                self.m.release(&b).await?;
                true
            }
            Err(Error::Held { .. }) => false,
            Err(e) => return Err(e),
        };
        self.m.release(&second).await?;
        Ok((
            !duplicate && !b_got_it,
            None,
            format!(
                "the delayed release carried token {}, not the current {}: {}",
                first.token(),
                second.token(),
                if duplicate {
                    "it ENDED the new hold"
                } else {
                    "ignored, A still holds it"
                }
            ),
        ))
    }

    pub(super) async fn timeout_lease(
        &self,
        name: &str,
    ) -> Result<(bool, Option<Duration>, String)> {
        let ttl = self.unit * 3;
        let held = self
            .m
            .hold(name, AcquireOptions::ttl(ttl).holder("A"))
            .await?;
        // Every renewal from now on blocks behind this row lock.
        let mut blocker = PgConnection::connect_with(&self.m.pool().connect_options()).await?;
        let mut tx = blocker.begin().await?;
        sqlx::query("SELECT 1 FROM pglease.leases WHERE name = $1 FOR UPDATE")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let start = Instant::now();
        let limit = ttl * 3;
        let reason = tokio::time::timeout(limit, held.lost()).await.ok();
        let told_after = start.elapsed();
        let db_valid: bool = sqlx::query_scalar("SELECT held FROM pglease.status WHERE name = $1")
            .bind(name)
            .fetch_one(self.m.pool())
            .await?;
        // Unblock first: a fenced transaction that does reach the database
        // would wait behind the blocker's row lock.
        tx.rollback().await?;
        let refused = match held.begin_fenced().await {
            Err(Error::Lost { .. }) => true,
            Ok(tx) => {
                tx.rollback().await?;
                false
            }
            Err(e) => return Err(e),
        };
        drop(held);
        let safe = reason.is_some() && refused;
        Ok((
            safe,
            None,
            match reason {
                Some(reason) => format!(
                    "the loss signal fired {} ms into the unanswered renewals ({reason}), while \
                     the database {} the lease valid; new fenced work was {}",
                    told_after.as_millis(),
                    if db_valid {
                        "still considered"
                    } else {
                        "no longer considered"
                    },
                    if refused { "refused" } else { "ALLOWED" }
                ),
                None => format!("NO loss signal within {} ms", limit.as_millis()),
            },
        ))
    }
}
