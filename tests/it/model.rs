//! Model conformance: random sequences of acquire, renew, release, guarded
//! write and expiry run against PostgreSQL and against a serial model of
//! a lease store (below), with identical outcomes.
//!
//! Deterministic in time: TTLs are an hour (nothing expires by itself
//! during a case) and expiry is an explicit step, applied to the model's
//! clock and to the lease row alike.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::common::TestDb;
use pglease::{AcquireOptions, Error, LeaseManager};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// The serial model, `LeaseStore`: co-located coordinator and
/// resource, one manual clock.
#[derive(Debug, Default)]
struct Model {
    holder: Option<String>,
    expiry: u64,
    fence: u64,
    data: Option<String>,
    clock: u64,
}

impl Model {
    fn observe(&mut self, now: u64) {
        assert!(now >= self.clock, "clock moved backwards");
        self.clock = now;
    }

    fn acquire(&mut self, owner: &str, ttl: u64, now: u64) -> Option<u64> {
        self.observe(now);
        if self.holder.is_none() || now >= self.expiry {
            self.holder = Some(owner.to_owned());
            self.expiry = now + ttl;
            self.fence += 1;
            return Some(self.fence);
        }
        None
    }

    fn valid(&self, owner: &str, token: u64, now: u64) -> bool {
        self.holder.as_deref() == Some(owner) && token == self.fence && now < self.expiry
    }

    fn renew(&mut self, owner: &str, token: u64, ttl: u64, now: u64) -> bool {
        self.observe(now);
        if !self.valid(owner, token, now) {
            return false;
        }
        self.expiry = now + ttl;
        true
    }

    fn release(&mut self, owner: &str, token: u64, now: u64) -> bool {
        self.observe(now);
        if !self.valid(owner, token, now) {
            return false;
        }
        self.holder = None;
        true
    }

    fn write(&mut self, owner: &str, token: u64, value: &str, now: u64) -> bool {
        self.observe(now);
        if !self.valid(owner, token, now) {
            return false;
        }
        self.data = Some(value.to_owned());
        true
    }
}

/// Which token an operation carries: one issued earlier in the case
/// (current or stale, with the holder that acquired it), or one never
/// issued.
#[derive(Debug, Clone)]
enum Pick {
    Issued(Index),
    Never,
}

#[derive(Debug, Clone)]
enum Op {
    Acquire(usize),
    Renew(Pick),
    Release(Pick),
    Write(Pick),
    Expire,
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![5 => any::<Index>().prop_map(Pick::Issued), 1 => Just(Pick::Never)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize).prop_map(Op::Acquire),
        3 => pick().prop_map(Op::Renew),
        3 => pick().prop_map(Op::Release),
        4 => pick().prop_map(Op::Write),
        2 => Just(Op::Expire),
    ]
}

const HOLDERS: [&str; 3] = ["A", "B", "C"];
/// Model TTL in model time units; each operation advances the clock by 1.
const MODEL_TTL: u64 = 1_000_000;
const DB_TTL: Duration = Duration::from_secs(3600);

/// One acquisition seen in both worlds.
struct Issued {
    holder: &'static str,
    model: u64,
    db: i64,
}

async fn run_case(
    db: &TestDb,
    m: &LeaseManager,
    case: u32,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let name = format!("model-{case}");
    sqlx::query("INSERT INTO data (id, value) VALUES ($1, 'initial')")
        .bind(case as i32)
        .execute(db.pool())
        .await
        .expect("data row");
    let mut model = Model {
        data: Some("initial".to_owned()),
        ..Model::default()
    };
    let mut issued: Vec<Issued> = Vec::new();
    let mut now = 0;
    // After an expiry step the next operation runs at that same instant.
    let mut at_expiry = false;
    for (step, op) in ops.into_iter().enumerate() {
        if !std::mem::take(&mut at_expiry) {
            now += 1;
        }
        let chosen = |p: &Pick| match p {
            Pick::Issued(i) if !issued.is_empty() => {
                let x = &issued[i.index(issued.len())];
                (x.holder, x.model, x.db)
            }
            _ => ("A", u64::MAX, i64::MAX),
        };
        match &op {
            Op::Acquire(h) => {
                let holder = HOLDERS[*h];
                let expected = model.acquire(holder, MODEL_TTL, now);
                match m
                    .acquire(&name, AcquireOptions::ttl(DB_TTL).holder(holder))
                    .await
                {
                    Ok(lease) => {
                        prop_assert!(
                            expected.is_some(),
                            "step {step} {op:?}: database acquired, model did not"
                        );
                        if let Some(last) = issued.last() {
                            prop_assert!(lease.token() > last.db, "tokens must increase");
                        }
                        issued.push(Issued {
                            holder,
                            model: expected.unwrap_or_default(),
                            db: lease.token().get(),
                        });
                    }
                    Err(Error::Held {
                        holder: current, ..
                    }) => {
                        prop_assert!(
                            expected.is_none(),
                            "step {step} {op:?}: model acquired, database did not"
                        );
                        prop_assert_eq!(Some(current), model.holder.clone());
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e}"))),
                }
            }
            Op::Renew(p) => {
                let (holder, model_token, db_token) = chosen(p);
                let expected = model.renew(holder, model_token, MODEL_TTL, now);
                let got = match m
                    .renew(&crate::common::fence(&name, db_token), DB_TTL)
                    .await
                {
                    Ok(_) => true,
                    // Lost, or a token never issued (refused as not held):
                    // either way the model's renewal fails too.
                    Err(Error::Lost { .. } | Error::NotHeld { .. }) => false,
                    Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e}"))),
                };
                prop_assert_eq!(got, expected, "step {} {:?}", step, op);
            }
            Op::Release(p) => {
                let (holder, model_token, db_token) = chosen(p);
                let expected = model.release(holder, model_token, now);
                let got = match m.release(&crate::common::fence(&name, db_token)).await {
                    Ok(released) => released,
                    Err(Error::NotHeld { .. }) => false,
                    Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e}"))),
                };
                prop_assert_eq!(got, expected, "step {} {:?}", step, op);
            }
            Op::Write(p) => {
                let (holder, model_token, db_token) = chosen(p);
                let value = format!("{holder}-{step}");
                let expected = model.write(holder, model_token, &value, now);
                let got = match fenced_write_row(m, &name, db_token, case, &value).await {
                    Ok(()) => true,
                    Err(Error::NotHeld { .. }) => false,
                    Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e}"))),
                };
                prop_assert_eq!(got, expected, "step {} {:?}", step, op);
            }
            Op::Expire => {
                // Time passes until the current expiry, in both worlds: the
                // next step runs exactly at the model's expiry (equality is
                // expired) and after the row's expires_at.
                now = now.max(model.expiry);
                at_expiry = true;
                model.observe(now);
                sqlx::query("UPDATE pglease.leases SET expires_at = least(expires_at, clock_timestamp()) WHERE name = $1")
                    .bind(&name)
                    .execute(db.pool())
                    .await
                    .expect("expire the lease row");
            }
        }
        // The observable state agrees after every step.
        let status = m.inspect(&name).await.expect("inspect");
        let model_held = model.holder.is_some() && now < model.expiry;
        prop_assert_eq!(status.held, model_held, "step {} {:?}: held", step, op);
        prop_assert_eq!(
            status.token.map(pglease::Token::get),
            issued.last().map(|x| x.db),
            "step {} {:?}: token",
            step,
            op
        );
        if model_held {
            prop_assert_eq!(status.holder, model.holder.clone());
        }
        let data: String = sqlx::query_scalar("SELECT value FROM data WHERE id = $1")
            .bind(case as i32)
            .fetch_one(db.pool())
            .await
            .expect("data");
        prop_assert_eq!(
            Some(data),
            model.data.clone(),
            "step {} {:?}: data",
            step,
            op
        );
    }
    Ok(())
}

async fn fenced_write_row(
    m: &LeaseManager,
    name: &str,
    token: i64,
    id: u32,
    value: &str,
) -> Result<(), Error> {
    m.fenced(&crate::common::fence(name, token), async |conn| {
        sqlx::query("UPDATE data SET value = $1 WHERE id = $2")
            .bind(value)
            .bind(id as i32)
            .execute(&mut *conn)
            .await
            .map_err(Error::from)?;
        Ok(())
    })
    .await
}

async fn database_agrees_with_the_serial_model() {
    let db = TestDb::new().await;
    sqlx::query("CREATE TABLE data (id int PRIMARY KEY, value text NOT NULL)")
        .execute(db.pool())
        .await
        .expect("data table");
    // proptest's runner is synchronous: it runs on a blocking thread and
    // drives each case on this test's runtime.
    let runtime = tokio::runtime::Handle::current();
    let cases = tokio::task::spawn_blocking(move || {
        let m = db.manager();
        let next_case = AtomicU32::new(0);
        let mut runner = TestRunner::new(Config {
            cases: 256,
            failure_persistence: None,
            ..Config::default()
        });
        let outcome = runner.run(&proptest::collection::vec(op(), 1..30), |ops| {
            let case = next_case.fetch_add(1, Ordering::Relaxed);
            runtime.block_on(run_case(&db, &m, case, ops))
        });
        if let Err(e) = outcome {
            panic!("{e}");
        }
        next_case.load(Ordering::Relaxed)
    })
    .await
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()));
    // Every case ran against the database.
    assert!(cases >= 256);
}

pglease_formations::tests![database_agrees_with_the_serial_model(2)];
