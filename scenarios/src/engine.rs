//! The scenario engine: the failures a lease must survive, written once, as
//! scripts over a [`Contender`] (a way of guarding a resource: acquire,
//! write, a fault on the holder's side, release), with one ledger the
//! writers append to and one way of judging what the ledger and the clocks
//! show.
//!
//! `pglease demo` runs the scripts against the lease and the two advisory
//! locks ([`crate::Variant`]), in-process; the project's peers comparison
//! runs the same scripts against other crates, through a network it can
//! freeze. What differs between the two is each contender's part (how it
//! acquires, what its fault does), never the script or the verdict.

use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, PgPool};

/// Errors of any contender's library, as text.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A failure a lease must survive, lettered the same everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// (a) The holder pauses past its TTL (a GC pause, a stopped VM, a
    /// frozen network): another worker takes over and writes, then the
    /// first holder's write (or its commit, sent before the pause) arrives.
    PausedHolder,
    /// (b) The holder's connection is killed; another worker takes over,
    /// then the first holder writes as its library says to.
    KilledConnection,
    /// (c) The holder dies without releasing.
    DeadHolder,
    /// (d) A release arrives late, after the same holder acquired again.
    LateRelease,
    /// (e) The holder's renewals (or its liveness checks) get no answer:
    /// is it told before another worker takes over?
    SilentRenewal,
}

impl Scenario {
    /// Every scenario, in letter order.
    pub const ALL: [Scenario; 5] = [
        Scenario::PausedHolder,
        Scenario::KilledConnection,
        Scenario::DeadHolder,
        Scenario::LateRelease,
        Scenario::SilentRenewal,
    ];

    /// The scenario's letter, the same in the demo, the peers comparison
    /// and the docs.
    pub fn letter(self) -> char {
        match self {
            Scenario::PausedHolder => 'a',
            Scenario::KilledConnection => 'b',
            Scenario::DeadHolder => 'c',
            Scenario::LateRelease => 'd',
            Scenario::SilentRenewal => 'e',
        }
    }

    /// A short label, with the letter.
    pub fn label(self) -> &'static str {
        match self {
            Scenario::PausedHolder => "(a) holder pauses past the TTL",
            Scenario::KilledConnection => "(b) holder's connection killed",
            Scenario::DeadHolder => "(c) holder dies without releasing",
            Scenario::LateRelease => "(d) delayed duplicate release",
            Scenario::SilentRenewal => "(e) holder's renewal gets no answer",
        }
    }

    /// The fault the script injects on the holder's side.
    pub fn fault(self) -> Fault {
        match self {
            Scenario::PausedHolder => Fault::Pause,
            Scenario::KilledConnection => Fault::Kill,
            Scenario::DeadHolder => Fault::Die,
            Scenario::LateRelease => Fault::LateRelease,
            Scenario::SilentRenewal => Fault::Stall,
        }
    }
}

/// What happens to the holder. Each contender carries it out its own way
/// (in-process, or by freezing the holder's network), as its suite can.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The holder stops acting (and, where its suite can, its network
    /// stops answering) until [`Contender::heal`].
    Pause,
    /// The holder's connections are terminated by the server.
    Kill,
    /// The holder is gone without releasing ([`Contender::die`]).
    Die,
    /// The holder releases, acquires again, and a copy of its first
    /// release is held up until [`Contender::heal`] delivers it.
    LateRelease,
    /// The holder's renewals or checks get no answer until
    /// [`Contender::heal`].
    Stall,
}

/// The two workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// The first holder, the one the fault happens to.
    A,
    /// The worker that tries to take over.
    B,
}

impl Who {
    /// The name written in the ledger and used as the holder's name.
    pub fn name(self) -> &'static str {
        match self {
            Who::A => "A",
            Who::B => "B",
        }
    }
}

/// What became of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// It committed.
    Committed,
    /// The library or the database refused it, or its connection was gone;
    /// why, in words (beginning with `by` where it names who refused it:
    /// `by PostgreSQL (LE001): ...`).
    Refused(String),
}

/// A safety property a scenario showed broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A write of the old holder committed after the new holder held the
    /// resource.
    StaleWrite,
    /// Another worker held the resource while the old holder had not been
    /// told it lost it.
    TwoHolders,
}

impl Violation {
    /// In words.
    pub fn describe(self) -> &'static str {
        match self {
            Violation::StaleWrite => "a stale write committed after the new holder took over",
            Violation::TwoHolders => "two holders at once, the old one not told",
        }
    }
}

/// A scenario's verdict on a contender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    /// No safety property broken.
    Safe,
    /// One was.
    Violated(Violation),
    /// The contender cannot be put in this scenario; why.
    NotApplicable(&'static str),
}

impl Judgement {
    /// Whether no safety property was broken (not-applicable counts as
    /// safe: nothing happened).
    pub fn is_safe(self) -> bool {
        !matches!(self, Judgement::Violated(_))
    }
}

/// What a scenario did to a contender, as measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict<K> {
    /// The scenario.
    pub scenario: Scenario,
    /// The contender.
    pub contender: K,
    /// What the ledger and the clocks showed.
    pub judgement: Judgement,
    /// How long after the fault (for (d), after the late release arrived)
    /// another worker held the resource; `None` if it could not within the
    /// scenario's window. Timed when B's acquisition returned, one round
    /// trip after the database granted it.
    pub took_over: Option<Duration>,
    /// How long after the fault the library told A it had lost the
    /// resource ((d) and (e) only); `None` if it did not within the window.
    pub told: Option<Duration>,
    /// What became of A's write (or commit) after the fault; `None` where
    /// A wrote nothing ((c)) or the scenario does not apply.
    pub a_wrote: Option<Written>,
    /// What happened, in one sentence with the measured figures.
    pub detail: String,
}

impl<K> Verdict<K> {
    /// Whether no safety property was broken.
    pub fn safe(&self) -> bool {
        self.judgement.is_safe()
    }
}

/// One row of the ledger: its place in insertion order and its writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The row's sequence number (insertion order, not commit order).
    pub seq: i64,
    /// Who wrote it.
    pub writer: String,
}

/// What a script saw, for the judgement and the contender's detail.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// How long after the fault B held the resource.
    pub took_over: Option<Duration>,
    /// How long after the fault the library told A it had lost it.
    pub told: Option<Duration>,
    /// What became of A's write after the fault, if A wrote.
    pub a_wrote: Option<Written>,
    /// Whether B wrote (B's write must commit whenever B takes over).
    pub b_wrote: bool,
    /// The ledger as committed as soon as B held the resource, before its
    /// write.
    pub at_takeover: Vec<Row>,
    /// The ledger at the end.
    pub rows: Vec<Row>,
    /// How long B tried.
    pub window: Duration,
}

impl Seen {
    /// The last committed writer, `initial` if none: the value a single
    /// overwritten cell would hold.
    pub fn value(&self) -> &str {
        self.rows.last().map_or("initial", |r| r.writer.as_str())
    }

    /// The ledger's writers, in insertion order.
    pub fn writers(&self) -> Vec<&str> {
        self.rows.iter().map(|r| r.writer.as_str()).collect()
    }
}

/// Whether a row of A's committed after B held the resource: B took over,
/// and the row is in the ledger at the end but was not when B's
/// acquisition returned. (A commit that lands in the round trip between
/// the database granting B the resource and that read counts as earlier;
/// the scripts hold A's held-up commit until after it.)
pub fn stale_after_new(took_over: bool, at_takeover: &[Row], end: &[Row]) -> bool {
    took_over
        && end
            .iter()
            .filter(|r| r.writer == "A")
            .any(|r| !at_takeover.iter().any(|s| s.seq == r.seq))
}

/// Whether B held the resource before A was told it had lost it (or A was
/// never told).
pub fn two_holders(took_over: Option<Duration>, told: Option<Duration>) -> bool {
    match (took_over, told) {
        (Some(b), Some(a)) => a > b,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// The verdict on what a scenario saw. Two holders, where the scenario
/// judges it ((d), (e)), comes before a stale write: the old holder not
/// being told is the cause of its stale writes.
pub fn judge(scenario: Scenario, seen: &Seen) -> Judgement {
    let stale = stale_after_new(seen.took_over.is_some(), &seen.at_takeover, &seen.rows);
    match scenario {
        Scenario::LateRelease | Scenario::SilentRenewal
            if two_holders(seen.took_over, seen.told) =>
        {
            Judgement::Violated(Violation::TwoHolders)
        }
        // (c) measures liveness: nobody writes.
        Scenario::DeadHolder => Judgement::Safe,
        _ if stale => Judgement::Violated(Violation::StaleWrite),
        _ => Judgement::Safe,
    }
}

/// The table the writers append to, one row per committed write.
#[derive(Debug, Clone)]
pub struct Ledger {
    table: String,
}

impl Ledger {
    /// Creates the ledger `table`, a plain lower-case identifier (letters,
    /// digits, `_`, at most 63 bytes).
    ///
    /// # Errors
    ///
    /// Any other name, before connecting; the database's.
    pub async fn create(pool: &PgPool, table: &str) -> Result<Ledger, BoxError> {
        let plain = table.starts_with(|c: char| c.is_ascii_lowercase())
            && table
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !plain || table.len() > 63 {
            return Err(format!("not a plain identifier for the ledger: {table:?}").into());
        }
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (seq bigserial PRIMARY KEY, writer text NOT NULL)"
        )))
        .execute(pool)
        .await?;
        Ok(Ledger {
            table: table.to_owned(),
        })
    }

    /// The statement that appends a row; `$1` is the writer.
    pub fn insert(&self) -> String {
        format!("INSERT INTO {} (writer) VALUES ($1)", self.table)
    }

    /// The committed rows, in insertion order.
    ///
    /// # Errors
    ///
    /// The database's.
    pub async fn rows(&self, pool: &PgPool) -> Result<Vec<Row>, BoxError> {
        let rows: Vec<(i64, String)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT seq, writer FROM {} ORDER BY seq",
            self.table
        )))
        .fetch_all(pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(seq, writer)| Row { seq, writer })
            .collect())
    }

    /// Empties the ledger, for the next scenario.
    ///
    /// # Errors
    ///
    /// The database's.
    pub async fn clear(&self, pool: &PgPool) -> Result<(), BoxError> {
        sqlx::query(AssertSqlSafe(format!("TRUNCATE {}", self.table)))
            .execute(pool)
            .await?;
        Ok(())
    }

    /// Drops the ledger.
    ///
    /// # Errors
    ///
    /// The database's.
    pub async fn drop(self, pool: &PgPool) -> Result<(), BoxError> {
        sqlx::query(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {}",
            self.table
        )))
        .execute(pool)
        .await?;
        Ok(())
    }
}

/// A way of guarding a resource, put through the scripts. Built for one
/// scenario at a time (its TTL and its faults may depend on it), on one
/// resource name. Not object-safe: suites dispatch on their own enum.
// The scripts await these futures in place and never spawn them, so no
// `Send` bound is needed on them.
#[allow(async_fn_in_trait)]
pub trait Contender {
    /// What a holder has while it holds.
    type Held;

    /// Why the contender cannot be put in `scenario`, if it cannot.
    fn lacks(&self, _scenario: Scenario) -> Option<&'static str> {
        None
    }

    /// The fencing token `held` carries, if the contender's holds have one
    /// (for an [`Observer`]).
    fn token(&self, _held: &Self::Held) -> Option<i64> {
        None
    }

    /// `who` takes the resource, trying for up to `wait` (zero: once).
    ///
    /// # Errors
    ///
    /// Anything but "someone else holds it".
    async fn acquire(&self, who: Who, wait: Duration) -> Result<Option<Self::Held>, BoxError>;

    /// `who` appends its row to the ledger under `held`, as the library
    /// documents (or, where it offers no way, the obvious way).
    ///
    /// # Errors
    ///
    /// Anything but a refusal, which is `Ok(Written::Refused)`.
    async fn write(&self, held: &mut Self::Held, who: Who) -> Result<Written, BoxError>;

    /// `who`'s work while it holds, before the fault: a write that
    /// commits, as a paused holder writes before it pauses; `Ok(None)`
    /// where the contender does not work before the fault (or cannot
    /// without giving its hold up, as a transaction lock's commit does).
    ///
    /// # Errors
    ///
    /// Anything but a refusal.
    async fn work(&self, _held: &mut Self::Held, _who: Who) -> Result<Option<Written>, BoxError> {
        Ok(None)
    }

    /// Appends `who`'s row and leaves it uncommitted, for the fault to
    /// catch the commit in flight; `Ok(false)` if the contender writes
    /// only after the fault.
    ///
    /// # Errors
    ///
    /// The database's.
    async fn stage(&self, _held: &mut Self::Held, _who: Who) -> Result<bool, BoxError> {
        Ok(false)
    }

    /// Commits what [`Contender::stage`] wrote.
    ///
    /// Cancel safety: the script drops this future if no answer comes
    /// within ten seconds of the fault's end; the transaction must then end
    /// with its connection.
    ///
    /// # Errors
    ///
    /// Anything but a refusal.
    async fn commit(&self, _held: &mut Self::Held) -> Result<Written, BoxError> {
        Err("nothing was staged".into())
    }

    /// The fault begins on the holder's side.
    ///
    /// # Errors
    ///
    /// The database's, or the fault could not be set up.
    async fn fault(&self, held: &mut Self::Held, fault: Fault) -> Result<(), BoxError>;

    /// The fault ends: the network thaws, the stalled session is dropped,
    /// the late release arrives. Called once per scenario that faults,
    /// whatever B managed and also when B's side failed; for (d) before B
    /// tries, otherwise after.
    ///
    /// # Errors
    ///
    /// The database's.
    async fn heal(&self, _fault: Fault) -> Result<(), BoxError> {
        Ok(())
    }

    /// The holder is gone without releasing.
    ///
    /// # Errors
    ///
    /// The database's.
    async fn die(&self, held: Self::Held) -> Result<(), BoxError>;

    /// When the library told the holder it had lost the resource, waiting
    /// for up to `limit`; `None` if it did not (or cannot).
    ///
    /// # Errors
    ///
    /// The library's.
    async fn told(
        &self,
        _held: &Self::Held,
        _limit: Duration,
    ) -> Result<Option<Instant>, BoxError> {
        Ok(None)
    }

    /// Lets go, if there is anything left to let go of; whether that ended
    /// a hold, where the library says (`Some(false)`: the release was
    /// ignored, as a stale token's is).
    ///
    /// # Errors
    ///
    /// The database's.
    async fn release(&self, held: Self::Held) -> Result<Option<bool>, BoxError>;

    /// The detail sentence for `scenario` from what was seen (and what
    /// the contender noted itself).
    fn detail(&self, scenario: Scenario, seen: &Seen) -> String;
}

/// A step of a script, as it happens, for an [`Observer`]. Tokens are
/// the contender's ([`Contender::token`]), `None` where its holds have
/// none.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Step<'a> {
    /// `who` holds the resource: A at the start, B when it took over
    /// (`after`: how long after the fault).
    Acquired {
        /// Who.
        who: Who,
        /// The hold's token.
        token: Option<i64>,
        /// For B, how long after the fault (for (d), after the late
        /// release arrived).
        after: Option<Duration>,
    },
    /// B could not take over within `window`.
    Missed {
        /// How long B tried.
        window: Duration,
    },
    /// `who` wrote its row (or committed the one it staged).
    Wrote {
        /// Who.
        who: Who,
        /// The token it wrote under.
        token: Option<i64>,
        /// What became of the write.
        written: &'a Written,
    },
    /// `who` appended its row and left it uncommitted, for the fault to
    /// catch its commit in flight.
    Staged {
        /// Who.
        who: Who,
        /// The token it wrote under.
        token: Option<i64>,
    },
    /// The fault hit A.
    Fault(Fault),
    /// The fault ended.
    Healed(Fault),
    /// The library told A it had lost the resource, `after` the fault.
    Told {
        /// How long after the fault.
        after: Duration,
    },
    /// `who` let go.
    Released {
        /// Who.
        who: Who,
        /// The token it let go of.
        token: Option<i64>,
        /// Whether that ended a hold, where the library says.
        ended: Option<bool>,
    },
    /// The ledger at the end, every committed row in insertion order.
    Ledger(&'a [Row]),
}

/// Something the scripts tell each [`Step`] as it happens (the demo's
/// narration is one: [`crate::Narrator`]). Called from the script's own
/// task, between its awaits: it must not block.
pub trait Observer: Sync {
    /// `step` has just happened.
    fn step(&self, step: Step<'_>);
}

/// Nobody watching.
impl Observer for () {
    fn step(&self, _step: Step<'_>) {}
}

/// What every scenario of a suite shares: the ledger, the pool it is read
/// through, how long B tries to take over in each scenario, and who is
/// told each step.
#[derive(Clone, Copy)]
pub struct Stage<'a> {
    ledger: &'a Ledger,
    pool: &'a PgPool,
    window: &'a (dyn Fn(Scenario) -> Duration + Sync),
    observer: &'a dyn Observer,
}

impl<'a> Stage<'a> {
    /// The ledger, a pool on its database outside every fault, and how
    /// long B tries to take over in each scenario; nobody told the steps.
    pub fn new(
        ledger: &'a Ledger,
        pool: &'a PgPool,
        window: &'a (dyn Fn(Scenario) -> Duration + Sync),
    ) -> Stage<'a> {
        Stage {
            ledger,
            pool,
            window,
            observer: &(),
        }
    }

    /// Tells `observer` each step.
    pub fn observed(self, observer: &'a dyn Observer) -> Stage<'a> {
        Stage { observer, ..self }
    }

    fn step(&self, step: Step<'_>) {
        self.observer.step(step);
    }
}

/// How long a held-up commit may take to be answered after the fault
/// ends before the scenario gives up on it.
const ANSWER: Duration = Duration::from_secs(10);

/// Runs `scenario` against `contender` on an empty ledger.
///
/// Cancel safety: none. Dropped midway, the fault may stay in force (a
/// frozen proxy, a blocked renewal) and A's and B's holds last until their
/// connections close; the ledger is emptied by the next run.
///
/// # Errors
///
/// The contender or the database failing in a way the script does not
/// expect.
pub async fn run<C: Contender, K>(
    stage: &Stage<'_>,
    scenario: Scenario,
    kind: K,
    contender: &C,
) -> Result<Verdict<K>, BoxError> {
    stage.ledger.clear(stage.pool).await?;
    if let Some(why) = contender.lacks(scenario) {
        return Ok(Verdict {
            scenario,
            contender: kind,
            judgement: Judgement::NotApplicable(why),
            took_over: None,
            told: None,
            a_wrote: None,
            detail: format!("not applicable: {why}"),
        });
    }
    let window = (stage.window)(scenario);
    let mut seen = match scenario {
        Scenario::PausedHolder | Scenario::KilledConnection => {
            held_up_write(stage, contender, scenario.fault(), window).await?
        }
        Scenario::DeadHolder => dead_holder(stage, contender, window).await?,
        Scenario::LateRelease | Scenario::SilentRenewal => {
            unaware_holder(stage, contender, scenario.fault(), window).await?
        }
    };
    seen.window = window;
    seen.rows = stage.ledger.rows(stage.pool).await?;
    stage.step(Step::Ledger(&seen.rows));
    Ok(Verdict {
        scenario,
        contender: kind,
        judgement: judge(scenario, &seen),
        took_over: seen.took_over,
        told: seen.told,
        a_wrote: seen.a_wrote.clone(),
        detail: contender.detail(scenario, &seen),
    })
}

/// A's acquisition, which the scenario cannot do without.
async fn first<C: Contender>(stage: &Stage<'_>, contender: &C) -> Result<C::Held, BoxError> {
    let a = contender
        .acquire(Who::A, Duration::ZERO)
        .await?
        .ok_or("A could not acquire a free resource")?;
    stage.step(Step::Acquired {
        who: Who::A,
        token: contender.token(&a),
        after: None,
    });
    Ok(a)
}

/// B tries for `window` from `since`; if it got the resource, the ledger
/// is read and B writes, which must commit.
async fn take_over<C: Contender>(
    stage: &Stage<'_>,
    contender: &C,
    window: Duration,
    since: Instant,
    seen: &mut Seen,
) -> Result<Option<C::Held>, BoxError> {
    let Some(mut b) = contender.acquire(Who::B, window).await? else {
        stage.step(Step::Missed { window });
        return Ok(None);
    };
    seen.took_over = Some(since.elapsed());
    let token = contender.token(&b);
    stage.step(Step::Acquired {
        who: Who::B,
        token,
        after: seen.took_over,
    });
    seen.at_takeover = stage.ledger.rows(stage.pool).await?;
    let written = contender.write(&mut b, Who::B).await?;
    stage.step(Step::Wrote {
        who: Who::B,
        token,
        written: &written,
    });
    match written {
        Written::Committed => seen.b_wrote = true,
        Written::Refused(why) => {
            return Err(format!("B held the resource but its write did not commit: {why}").into());
        }
    }
    Ok(Some(b))
}

/// `who` lets go of `held`, and the observer is told.
async fn release<C: Contender>(
    stage: &Stage<'_>,
    contender: &C,
    who: Who,
    held: C::Held,
) -> Result<(), BoxError> {
    let token = contender.token(&held);
    let ended = contender.release(held).await?;
    stage.step(Step::Released { who, token, ended });
    Ok(())
}

/// A works and stages its write, as the contender does before the fault.
async fn before_fault<C: Contender>(
    stage: &Stage<'_>,
    contender: &C,
    a: &mut C::Held,
) -> Result<bool, BoxError> {
    let token = contender.token(a);
    if let Some(written) = contender.work(a, Who::A).await? {
        stage.step(Step::Wrote {
            who: Who::A,
            token,
            written: &written,
        });
    }
    let staged = contender.stage(a, Who::A).await?;
    if staged {
        stage.step(Step::Staged { who: Who::A, token });
    }
    Ok(staged)
}

/// (a) and (b): A holds (and may have written, committed or not), the
/// fault hits A, B tries to take over and writes, the fault ends, A's
/// write (or commit) arrives, then A's release (while B still holds, if
/// B took over) and B's.
async fn held_up_write<C: Contender>(
    stage: &Stage<'_>,
    contender: &C,
    fault: Fault,
    window: Duration,
) -> Result<Seen, BoxError> {
    let mut a = first(stage, contender).await?;
    let staged = before_fault(stage, contender, &mut a).await?;
    contender.fault(&mut a, fault).await?;
    stage.step(Step::Fault(fault));
    let since = Instant::now();
    let mut seen = Seen::default();
    let (committed, b) = {
        let a_side = async {
            if staged {
                Some(contender.commit(&mut a).await)
            } else {
                None
            }
        };
        let b_side = async {
            let b = take_over(stage, contender, window, since, &mut seen).await;
            // The fault ends whatever B managed, so that A's side ends too.
            let healed = contender.heal(fault).await;
            let b = b?;
            healed?;
            stage.step(Step::Healed(fault));
            Ok::<_, BoxError>(b)
        };
        let (committed, b) = tokio::join!(tokio::time::timeout(window + ANSWER, a_side), b_side);
        (committed, b?)
    };
    let written = match committed {
        Err(_) => return Err("A's commit got no answer after the fault ended".into()),
        Ok(Some(written)) => written?,
        Ok(None) => contender.write(&mut a, Who::A).await?,
    };
    stage.step(Step::Wrote {
        who: Who::A,
        token: contender.token(&a),
        written: &written,
    });
    seen.a_wrote = Some(written);
    release(stage, contender, Who::A, a).await?;
    if let Some(b) = b {
        release(stage, contender, Who::B, b).await?;
    }
    Ok(seen)
}

/// (c): A holds and dies; B tries to take over.
async fn dead_holder<C: Contender>(
    stage: &Stage<'_>,
    contender: &C,
    window: Duration,
) -> Result<Seen, BoxError> {
    let a = first(stage, contender).await?;
    contender.die(a).await?;
    stage.step(Step::Fault(Fault::Die));
    let since = Instant::now();
    let mut seen = Seen::default();
    match contender.acquire(Who::B, window).await? {
        Some(b) => {
            seen.took_over = Some(since.elapsed());
            stage.step(Step::Acquired {
                who: Who::B,
                token: contender.token(&b),
                after: seen.took_over,
            });
            release(stage, contender, Who::B, b).await?;
        }
        None => stage.step(Step::Missed { window }),
    }
    Ok(seen)
}

/// (d) and (e): A holds, the fault hits it (a late release, unanswered
/// renewals); B tries to take over while A waits to be told; then A, if
/// it was not told, starts new work.
async fn unaware_holder<C: Contender>(
    stage: &Stage<'_>,
    contender: &C,
    fault: Fault,
    window: Duration,
) -> Result<Seen, BoxError> {
    let mut a = first(stage, contender).await?;
    contender.fault(&mut a, fault).await?;
    stage.step(Step::Fault(fault));
    let mut seen = Seen::default();
    // A late release is timed from its arrival; a stall from its start.
    if fault == Fault::LateRelease {
        contender.heal(fault).await?;
        stage.step(Step::Healed(fault));
    }
    let since = Instant::now();
    let (b, told) = tokio::join!(
        take_over(stage, contender, window, since, &mut seen),
        contender.told(&a, window)
    );
    // The fault ends before any error is reported, so that nothing stays
    // frozen or blocked.
    if fault != Fault::LateRelease {
        contender.heal(fault).await?;
    }
    let (b, told) = (b?, told?);
    seen.told = told.map(|at| at.saturating_duration_since(since));
    if let Some(after) = seen.told {
        stage.step(Step::Told { after });
    }
    if fault != Fault::LateRelease {
        stage.step(Step::Healed(fault));
    }
    let written = contender.write(&mut a, Who::A).await?;
    stage.step(Step::Wrote {
        who: Who::A,
        token: contender.token(&a),
        written: &written,
    });
    seen.a_wrote = Some(written);
    if let Some(b) = b {
        release(stage, contender, Who::B, b).await?;
    }
    release(stage, contender, Who::A, a).await?;
    Ok(seen)
}
