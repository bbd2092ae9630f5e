//! The operations of the pair tables that spread over names (P1 through
//! the library, the library's own cost): each run picks one of `names`
//! names ([`pick`]), as pgbench's `random(1, :names)` does, and works on
//! it through the library or with statements sent through sqlx. The
//! measures give what differs between them: the names' prefix, the
//! statements and the table the fenced transactions write.

use std::sync::Arc;

use pglease::{AcquireOptions, Error, Lease, LeaseManager};
use sqlx::postgres::{PgArguments, PgConnection};
use sqlx::query::Query;
use sqlx::{PgPool, Postgres};

use super::LONG;
use crate::shared::timing::{Op, op, pick};

/// The held leases as the statements sent through sqlx name them: lease
/// `n` (1 to 1,000) is a name and a token.
#[derive(Clone)]
pub(crate) enum Held {
    /// pglease's leases, as the library's handles `leases[n - 1]` hold
    /// them.
    Handles(Arc<Vec<Lease>>),
    /// `raw_leases`' rows as the pgbench set-up leaves them: `held-N`,
    /// token `N + offset` (`database::held_token_offset`).
    Raw { offset: i64 },
}

impl Held {
    /// `sql` with lease `n`'s name as $1 and its token as $2.
    fn query(&self, sql: &'static str, n: usize) -> Query<'static, Postgres, PgArguments> {
        let (name, token) = match self {
            Held::Handles(leases) => (leases[n - 1].name().to_owned(), leases[n - 1].token().get()),
            Held::Raw { offset } => (format!("held-{n}"), n as i64 + offset),
        };
        sqlx::query(sql).bind(name).bind(token)
    }
}

/// A statement that tries to acquire a name ($1) for a holder ($2) for
/// a TTL ($3) and returns the token, by how it says the name is held.
#[derive(Clone, Copy)]
pub(crate) enum Acquire {
    /// An `UPDATE … RETURNING token`: no row.
    Returning(&'static str),
    /// A call (`pglease.acquire`): one row, its token NULL.
    Call(&'static str),
}

impl Acquire {
    /// One of `{prefix}1` to `{prefix}{names}`, and the token `holder`
    /// got for it for [`LONG`], `None` if the name is held.
    async fn pick(
        self,
        pool: &PgPool,
        prefix: &str,
        names: usize,
        holder: &str,
    ) -> Result<(String, Option<i64>), Error> {
        let name = format!("{prefix}{}", pick(names));
        let token = match self {
            Acquire::Returning(sql) => {
                sqlx::query_scalar(sql)
                    .bind(&name)
                    .bind(holder)
                    .bind(LONG)
                    .fetch_optional(pool)
                    .await?
            }
            Acquire::Call(sql) => {
                sqlx::query_scalar(sql)
                    .bind(&name)
                    .bind(holder)
                    .bind(LONG)
                    .fetch_one(pool)
                    .await?
            }
        };
        Ok((name, token))
    }
}

/// The check a fenced transaction sent through sqlx opens with ($1 the
/// name, $2 the token), by how it refuses a lease that is not held.
#[derive(Clone, Copy)]
pub(crate) enum Guard {
    /// A `SELECT … FOR KEY SHARE`: no row, which fails the transaction.
    Select(&'static str),
    /// A call that raises (`pglease.assert_held`).
    Raises(&'static str),
}

impl Guard {
    /// Runs the check on lease `n` of `held` in `tx`.
    async fn check(self, tx: &mut PgConnection, held: &Held, n: usize) -> Result<(), Error> {
        match self {
            Guard::Select(sql) => held.query(sql, n).fetch_one(tx).await.map(drop)?,
            Guard::Raises(sql) => held.query(sql, n).execute(tx).await.map(drop)?,
        }
        Ok(())
    }
}

/// `holder`'s lease on one of `{prefix}1` to `{prefix}{names}`, acquired
/// through the library for [`LONG`], `None` if the name is held.
async fn lib_acquire(
    m: &LeaseManager,
    prefix: &str,
    names: usize,
    holder: &str,
) -> Result<Option<Lease>, Error> {
    let name = format!("{prefix}{}", pick(names));
    match m
        .acquire(&name, AcquireOptions::ttl(LONG).holder(holder))
        .await
    {
        Ok(lease) => Ok(Some(lease)),
        Err(Error::Held { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Acquire one of `{prefix}1` to `{prefix}{names}` through the library
/// and release it, or find it held by another client.
pub(crate) fn lib_cycle(m: &LeaseManager, prefix: &'static str, names: usize) -> Op {
    let m = m.clone();
    op(move |_| {
        let m = m.clone();
        async move {
            if let Some(lease) = lib_acquire(&m, prefix, names, "bench").await? {
                m.release(&lease).await?;
            }
            Ok(())
        }
    })
}

/// Acquire one of `{prefix}1` to `{prefix}{names}` with `acquire` and,
/// if it was free, release it with `release` ($1 the name, $2 the token).
pub(crate) fn sql_cycle(
    pool: &PgPool,
    acquire: Acquire,
    release: &'static str,
    prefix: &'static str,
    names: usize,
) -> Op {
    let pool = pool.clone();
    op(move |_| {
        let pool = pool.clone();
        async move {
            let (name, token) = acquire.pick(&pool, prefix, names, "bench").await?;
            if let Some(token) = token {
                sqlx::query(release)
                    .bind(&name)
                    .bind(token)
                    .execute(&pool)
                    .await?;
            }
            Ok(())
        }
    })
}

/// Try, through the library, to acquire one of `{prefix}1` to
/// `{prefix}{names}`, which are held; panics if it succeeds.
pub(crate) fn lib_failed(m: &LeaseManager, prefix: &'static str, names: usize) -> Op {
    let m = m.clone();
    op(move |_| {
        let m = m.clone();
        async move {
            let lease = lib_acquire(&m, prefix, names, "other").await?;
            assert!(lease.is_none(), "acquired a held lease");
            Ok(())
        }
    })
}

/// Try, with `acquire`, to acquire one of `{prefix}1` to
/// `{prefix}{names}`, which are held; panics if it succeeds.
pub(crate) fn sql_failed(
    pool: &PgPool,
    acquire: Acquire,
    prefix: &'static str,
    names: usize,
) -> Op {
    let pool = pool.clone();
    op(move |_| {
        let pool = pool.clone();
        async move {
            let (_, token) = acquire.pick(&pool, prefix, names, "other").await?;
            assert!(token.is_none(), "acquired a held lease");
            Ok(())
        }
    })
}

/// Renew, through the library, one of the leases `held[0]` to
/// `held[names - 1]`.
pub(crate) fn lib_renew(m: &LeaseManager, held: &Arc<Vec<Lease>>, names: usize) -> Op {
    let (m, held) = (m.clone(), held.clone());
    op(move |_| {
        let (m, held) = (m.clone(), held.clone());
        async move { m.renew(&held[pick(names) - 1], LONG).await.map(drop) }
    })
}

/// Renew one of the leases 1 to `names` of `held` for [`LONG`] with
/// `renew` ($1 the name, $2 the token, $3 the TTL).
pub(crate) fn sql_renew(pool: &PgPool, renew: &'static str, held: &Held, names: usize) -> Op {
    let (pool, held) = (pool.clone(), held.clone());
    op(move |_| {
        let (pool, held) = (pool.clone(), held.clone());
        async move {
            held.query(renew, pick(names))
                .bind(LONG)
                .execute(&pool)
                .await?;
            Ok(())
        }
    })
}

/// A guarded write in one statement, `write` ($1 the name, $2 the
/// token, $3 the row), on lease `n` of `held` (1 to `names`) and row `n`.
pub(crate) fn sql_write(pool: &PgPool, write: &'static str, held: &Held, names: usize) -> Op {
    let (pool, held) = (pool.clone(), held.clone());
    op(move |_| {
        let (pool, held) = (pool.clone(), held.clone());
        async move {
            let n = pick(names);
            held.query(write, n).bind(n as i32).execute(&pool).await?;
            Ok(())
        }
    })
}

/// A fenced transaction as `begin_fenced` opens it on lease `held[n -
/// 1]` (`n` 1 to `names`), writing row `n` with `update` ($1 the row).
pub(crate) fn lib_fenced(
    m: &LeaseManager,
    held: &Arc<Vec<Lease>>,
    update: &'static str,
    names: usize,
) -> Op {
    let (m, held) = (m.clone(), held.clone());
    op(move |_| {
        let (m, held) = (m.clone(), held.clone());
        async move {
            let n = pick(names);
            let mut tx = m.begin_fenced(&held[n - 1]).await?;
            sqlx::query(update).bind(n as i32).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        }
    })
}

/// A fenced transaction sent through sqlx on lease `n` of `held` (1 to
/// `names`): `BEGIN`, `guard`, row `n` written with `update` ($1 the
/// row), `COMMIT`.
pub(crate) fn sql_fenced(
    pool: &PgPool,
    guard: Guard,
    update: &'static str,
    held: &Held,
    names: usize,
) -> Op {
    let (pool, held) = (pool.clone(), held.clone());
    op(move |_| {
        let (pool, held) = (pool.clone(), held.clone());
        async move {
            let n = pick(names);
            let mut tx = pool.begin().await?;
            guard.check(&mut tx, &held, n).await?;
            sqlx::query(update).bind(n as i32).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        }
    })
}
