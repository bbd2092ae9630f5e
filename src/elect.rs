//! Leader election on one lease name: campaign (wait for the lease), run
//! the leader's work while it is held, stop that work when the lease is
//! lost and campaign again; resigning releases the lease, so the next
//! candidate leads at once. Every term is one acquisition, so the leader's
//! writes are fenced by its token like any holder's.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff;
use crate::error::{Error, LossReason, Result};
use crate::hold::HeldLease;
use crate::manager::LeaseManager;
use crate::observe::Change;
use crate::options::AcquireOptions;
use crate::token::Token;

/// How long one campaign statement waits before it is sent again (a
/// campaign waits for as long as it takes; this only bounds one wait).
const CAMPAIGN: Duration = Duration::from_secs(3600);

/// How often a leader that prefers another candidate asks whether that
/// candidate campaigns (a read while it does not): the bound, after the
/// candidate has joined the line, on the handover.
pub(crate) const PREFERRED_POLL: Duration = Duration::from_secs(1);

/// An elector's part in the election of its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leadership {
    /// Campaigning: waiting for the lease.
    Candidate,
    /// Leading the term of this token.
    Leading {
        /// The term's token, which fences the leader's writes.
        token: Token,
    },
    /// Not running: [`Elector::run`] has not started or has returned.
    Stopped,
}

/// The leader of an election as a candidate sees it: the current holder
/// of the lease and what it published.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's holder name.
    pub holder: String,
    /// Its term's token.
    pub token: Token,
    /// The value it published (its address, say), if any.
    pub value: Option<String>,
}

/// One candidate in the election of a lease name, made by
/// [`LeaseManager::elector`]. [`Elector::run`] campaigns and runs the
/// leader's work; [`Elector::is_leader`], [`Elector::leadership`] and
/// [`Elector::watch_leadership`] tell where it stands, [`Elector::leader`]
/// and [`Elector::watch_leader`] who leads; [`Elector::resign`] hands
/// over. See docs/library.md, "Leader election".
#[derive(Debug)]
pub struct Elector {
    manager: LeaseManager,
    name: String,
    how: AcquireOptions,
    state: watch::Sender<Leadership>,
    held: Mutex<Option<HeldLease>>,
    resigned: CancellationToken,
    terms: AtomicU64,
    /// The leader observed, whoever it is.
    leader: watch::Sender<Option<Leader>>,
    /// The latest step-down request heard: the term asked, and by whom.
    asked: watch::Sender<Option<(Token, String)>>,
    /// The term this candidate steps down from (`Elector::step_down`).
    stepping_down: watch::Sender<Option<Token>>,
    /// The candidate the leader hands over to when it campaigns
    /// (`Elector::prefer`).
    preferred: Option<String>,
    /// The term this candidate hands over to the preferred candidate: its
    /// work is told (`Elector::until_handover_due`) before it is dropped.
    handing_over: watch::Sender<Option<Token>>,
    /// Every term up to this token is observed to have ended.
    ended: watch::Sender<Option<Token>>,
}

/// How a term ended.
enum Ended {
    Lost(LossReason),
    /// Observed to have ended in the database (released or taken over by
    /// someone else) before the next renewal would have told.
    Observed,
    Resigned,
    SteppedDown,
    /// The preferred candidate (this holder name) campaigns: hand over.
    HandingOver(String),
}

/// Whether a candidate named `holder` campaigns in line (first come,
/// first served), so that a leader can hand over to it: the preferred
/// candidate does.
fn campaigns_in_line(preferred: Option<&str>, holder: &str) -> bool {
    preferred == Some(holder)
}

/// To whom a leader named `holder` offers its term: the preferred
/// candidate, unless it is that candidate.
fn offers_to<'a>(preferred: Option<&'a str>, holder: &str) -> Option<&'a str> {
    preferred.filter(|p| *p != holder)
}

/// Whether a campaign's error is one that retrying cannot mend: the
/// schema is missing or out of date, or the role may not use it.
fn permanent(error: &Error) -> bool {
    error.sqlstate().is_some_and(crate::sqlstate::is_permanent)
}

/// What a candidate does after a campaign that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Campaign again at once: one wait ran out.
    Now,
    /// Campaign again after a backoff.
    Later,
    /// Stop campaigning: the manager shut down.
    Stop,
    /// Fail the campaign: waiting will not mend the error.
    Fail,
}

/// What a candidate does after a campaign that failed with `error`.
fn after_failure(error: &Error) -> Retry {
    match error {
        Error::Held { .. } | Error::Pinned { .. } | Error::InLine { .. } => Retry::Now,
        Error::ShutDown => Retry::Stop,
        // The schema or a privilege is missing.
        error if permanent(error) => Retry::Fail,
        _ => Retry::Later,
    }
}

/// Marks the elector stopped and forgets its term when `run` returns or
/// is dropped; the term's lease is then released (by `run`, or in the
/// background when the last handle to it is dropped).
struct Running<'a>(&'a Elector);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.forget_term();
        self.0.state.send_replace(Leadership::Stopped);
    }
}

impl LeaseManager {
    /// A candidate for leading `name`, acquiring as `how` says (its TTL,
    /// holder and value; its wait is ignored: a campaign waits as long as
    /// it takes). Nothing is sent until [`Elector::run`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name, holder, value or TTL, a
    /// TTL too short for the manager's renewal timing, a
    /// [`limit`](AcquireOptions::limit) or [`shared`](AcquireOptions::shared)
    /// (an election has one leader).
    pub fn elector(&self, name: &str, how: AcquireOptions) -> Result<Elector> {
        how.check(name)?;
        if how.get_limit().is_some() {
            return Err(Error::invalid(
                "limit",
                "an election has one leader: a counted lease cannot be campaigned for",
            ));
        }
        if how.get_shared() {
            return Err(Error::invalid(
                "shared",
                "an election has one leader: a shared lease cannot be campaigned for",
            ));
        }
        self.options().timing(how.get_ttl())?;
        Ok(Elector {
            manager: self.clone(),
            name: name.to_owned(),
            how: how.wait(CAMPAIGN),
            state: watch::Sender::new(Leadership::Stopped),
            held: Mutex::new(None),
            resigned: CancellationToken::new(),
            terms: AtomicU64::new(0),
            leader: watch::Sender::new(None),
            asked: watch::Sender::new(None),
            stepping_down: watch::Sender::new(None),
            preferred: None,
            handing_over: watch::Sender::new(None),
            ended: watch::Sender::new(None),
        })
    }
}

impl Elector {
    /// Prefers the candidate whose holder name is `candidate` (give every
    /// elector of the name the same): that candidate campaigns in line
    /// ([`AcquireOptions::fair`]), so no other overtakes it, and any other
    /// leader hands its term over to it
    /// ([`LeaseManager::hand_over`]) within a second of its joining the
    /// line: its work is told ([`Elector::until_handover_due`]) and given
    /// up to a TTL to finish, then dropped; the term moves with a new
    /// token, the old
    /// leader's work stopped and its writes refused from the move on. The
    /// old leader then campaigns again. See docs/library.md, "Leader
    /// election".
    #[must_use]
    pub fn prefer(mut self, candidate: impl Into<String>) -> Elector {
        let candidate = candidate.into();
        if campaigns_in_line(Some(&candidate), &self.how.get_holder()) {
            self.how = self.how.fair(true);
        }
        self.preferred = Some(candidate);
        self
    }

    /// Campaigns for the name and, each time this candidate leads, runs
    /// `work` with the term's [`HeldLease`] (its token, its fenced
    /// transactions, its loss signal), renewed in the background. When the
    /// lease is lost, `work` is dropped at its next await point and the
    /// campaign starts again. If `work` returns first, the term goes on
    /// (this candidate still leads) until the lease is lost or the
    /// candidate resigns. Returns once [`Elector::resign`] is called (the
    /// term's lease is released first, so the next candidate leads at
    /// once), or when the manager shuts down.
    ///
    /// Database errors while campaigning are logged and retried with
    /// backoff (from 50 ms up to 3.2 s), except those that waiting cannot
    /// mend. Run it once per elector at a time (two runs of one elector
    /// would campaign as the same candidate).
    ///
    /// # Errors
    ///
    /// At once, [`Error::SchemaMissing`] when the schema is not migrated,
    /// [`Error::NotPermitted`] when the role may not campaign, and
    /// [`Error::Database`] for another error of SQLSTATE class 42 (see
    /// [`sqlstate::is_permanent`](crate::sqlstate::is_permanent)); other
    /// errors are retried.
    ///
    /// # Cancel safety
    ///
    /// Dropped, the campaign stops, `work` is dropped with it, and the
    /// term's lease is released in the background once the last clone of
    /// its [`HeldLease`] is gone.
    pub async fn run<F>(&self, work: F) -> Result<()>
    where
        F: AsyncFnMut(HeldLease),
    {
        let _running = Running(self);
        tokio::select! {
            biased;
            outcome = self.campaign(work) => outcome,
            () = self.follow() => Ok(()),
        }
    }

    /// Observes the name for as long as the elector runs: who leads, and
    /// the step-down requests. Returns when the manager shuts down.
    async fn follow(&self) {
        let mut failures: u32 = 0;
        loop {
            match self.manager.observe(&self.name).await {
                Ok(mut observer) => {
                    while let Ok(change) = observer.next().await {
                        self.heard(change);
                    }
                    return;
                }
                Err(Error::ShutDown) => return,
                Err(error) => {
                    failures = failures.saturating_add(1);
                    tracing::debug!(name = self.name, %error, "cannot observe the election; retrying");
                    tokio::time::sleep(backoff::reconnect(failures)).await;
                }
            }
        }
    }

    /// Takes in one observed change of the lease.
    fn heard(&self, change: Change) {
        let ended = match &change {
            Change::Current(status) if status.held => status.token.and_then(Token::previous),
            Change::Current(status) => status.token,
            Change::Acquired { token, .. } => token.previous(),
            Change::Released { token } | Change::Expired { token } => Some(*token),
            _ => None,
        };
        if let Some(ended) = ended {
            self.ended.send_if_modified(|up_to| {
                let later = up_to.is_none_or(|t| t < ended);
                if later {
                    *up_to = Some(ended);
                }
                later
            });
        }
        match change {
            Change::Current(status) => {
                let leader = match (&status.holder, status.token) {
                    (Some(holder), Some(token)) if status.held => Some(Leader {
                        holder: holder.clone(),
                        token,
                        value: status.value.clone(),
                    }),
                    _ => None,
                };
                if let (Some(by), Some(token)) = (status.step_down_requested_by, status.token) {
                    self.asked.send_replace(Some((token, by)));
                }
                self.leader.send_replace(leader);
            }
            Change::Acquired { token, holder, .. } => {
                self.leader.send_replace(Some(Leader {
                    holder,
                    token,
                    value: None,
                }));
            }
            Change::ValueChanged { token, value } => {
                self.leader.send_if_modified(|leader| match leader {
                    Some(leader) if leader.token == token => {
                        leader.value = value;
                        true
                    }
                    _ => false,
                });
            }
            Change::StepDownRequested { token, by } => {
                self.asked.send_replace(Some((token, by)));
            }
            Change::Released { token } | Change::Expired { token } => {
                self.leader.send_if_modified(|leader| {
                    let ended = leader.as_ref().is_some_and(|l| l.token == token);
                    if ended {
                        *leader = None;
                    }
                    ended
                });
            }
        }
    }

    /// The campaign loop of [`Elector::run`]: win a term, lead it until
    /// it ends, and again, until the candidate resigns.
    async fn campaign<F>(&self, mut work: F) -> Result<()>
    where
        F: AsyncFnMut(HeldLease),
    {
        while let Some(held) = self.win().await? {
            *self.lock_held() = Some(held.clone());
            self.terms.fetch_add(1, Ordering::Relaxed);
            let token = held.token();
            self.state.send_replace(Leadership::Leading { token });
            let ended = self.lead(&held, &mut work).await;
            self.forget_term();
            if self.after_term(ended, held).await {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Campaigns until this candidate wins a term: `None` if it resigned
    /// or the manager shut down first; an error that retrying cannot mend.
    async fn win(&self) -> Result<Option<HeldLease>> {
        let mut failures: u32 = 0;
        loop {
            if self.resigned.is_cancelled() {
                return Ok(None);
            }
            self.state.send_replace(Leadership::Candidate);
            let campaign = self.manager.hold(&self.name, self.how.clone());
            let error = tokio::select! {
                biased;
                () = self.resigned.cancelled() => return Ok(None),
                held = campaign => match held {
                    Ok(held) => return Ok(Some(held)),
                    Err(error) => error,
                },
            };
            match after_failure(&error) {
                Retry::Now => {}
                Retry::Stop => return Ok(None),
                Retry::Fail => return Err(error),
                Retry::Later => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(name = self.name, %error, "campaign failed; retrying");
                    tokio::select! {
                        () = self.resigned.cancelled() => return Ok(None),
                        () = tokio::time::sleep(backoff::reconnect(failures)) => {}
                    }
                }
            }
        }
    }

    /// Leads the term of `held` (runs `work` on it) until the term ends;
    /// how it ended.
    async fn lead<F>(&self, held: &HeldLease, work: &mut F) -> Ended
    where
        F: AsyncFnMut(HeldLease),
    {
        let token = held.token();
        let mut stepping_down = self.stepping_down.subscribe();
        let mut observed_end = self.ended.subscribe();
        let mut ends = std::pin::pin!(async {
            tokio::select! {
                biased;
                () = self.resigned.cancelled() => Ended::Resigned,
                reason = held.lost() => Ended::Lost(reason),
                _ = stepping_down.wait_for(|t| *t == Some(token)) => Ended::SteppedDown,
                _ = observed_end.wait_for(|t| *t >= Some(token)) => Ended::Observed,
                successor = self.offer(held) => Ended::HandingOver(successor),
            }
        });
        let mut work = std::pin::pin!(work(held.clone()));
        let ended = tokio::select! {
            biased;
            ended = &mut ends => ended,
            // The work is done (or gave up, say after a refused fenced
            // write): the term goes on until it is lost or resigned.
            () = &mut work => return ends.await,
        };
        if matches!(ended, Ended::HandingOver(_)) {
            // The work is told first, and has up to a TTL to finish (a
            // command to stop) before it is dropped and the term moves;
            // the lease is renewed meanwhile.
            self.handing_over.send_replace(Some(token));
            tokio::select! {
                () = &mut work => {}
                _ = held.lost() => {}
                () = tokio::time::sleep(self.how.get_ttl()) => {}
            }
        }
        ended
    }

    /// Acts on how the term of `held` ended (releases it when resigning or
    /// stepping down); whether the campaign is over.
    async fn after_term(&self, ended: Ended, held: HeldLease) -> bool {
        let token = held.token();
        match ended {
            Ended::Lost(reason) => {
                tracing::warn!(name = self.name, %token, %reason,
                               "leadership lost: the leader's work was dropped");
                false
            }
            Ended::Observed => {
                // Somebody ended the term (an operator releasing it,
                // say): most likely to move leadership elsewhere.
                tracing::warn!(name = self.name, %token,
                               "leadership ended by another session (observed): the leader's work was dropped");
                self.state.send_replace(Leadership::Candidate);
                self.sit_out(token).await
            }
            Ended::Resigned => {
                if let Err(error) = held.release().await {
                    tracing::warn!(name = self.name, %error, "could not release on resigning");
                }
                true
            }
            Ended::HandingOver(successor) => {
                self.state.send_replace(Leadership::Candidate);
                // Released instead if the candidate stopped waiting.
                match held.hand_over(&successor, self.how.get_ttl()).await {
                    Ok(Some(new)) => {
                        tracing::info!(name = self.name, %token, %new, successor, "handed over to the preferred candidate");
                    }
                    Ok(None) => {
                        tracing::info!(name = self.name, %token, successor, "the preferred candidate stopped waiting; released");
                    }
                    Err(error) => {
                        tracing::warn!(name = self.name, %error, "could not hand over; released");
                    }
                }
                self.sit_out(token).await
            }
            Ended::SteppedDown => {
                self.state.send_replace(Leadership::Candidate);
                if let Err(error) = held.release().await {
                    tracing::warn!(name = self.name, %error, "could not release on stepping down");
                }
                tracing::info!(name = self.name, %token, "stepped down");
                self.sit_out(token).await
            }
        }
    }

    /// Waits until the preferred candidate campaigns (it waits in the
    /// line), asking every [`PREFERRED_POLL`] (a read); its holder name.
    /// Never returns for a leader that prefers nobody else.
    async fn offer(&self, held: &HeldLease) -> String {
        let Some(preferred) = offers_to(self.preferred.as_deref(), &self.how.get_holder()) else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(PREFERRED_POLL).await;
            match self.manager.successor_waits(held, preferred).await {
                Ok(true) => return preferred.to_owned(),
                Ok(false) => {}
                Err(error) => {
                    tracing::debug!(name = self.name, %error, "cannot ask for the preferred candidate; asking again");
                }
            }
        }
    }

    /// Lets another candidate lead after the term of `token`: waits until
    /// one does, or for one TTL if none comes. True if the candidate
    /// resigned meanwhile.
    async fn sit_out(&self, token: Token) -> bool {
        let mut leader = self.leader.subscribe();
        tokio::select! {
            () = self.resigned.cancelled() => true,
            _ = leader.wait_for(|l| l.as_ref().is_some_and(|l| l.token > token)) => false,
            () = tokio::time::sleep(self.how.get_ttl()) => false,
        }
    }

    /// Whether this candidate leads right now, answered locally: it holds
    /// the lease and its local deadline has not passed (see the timing
    /// model in docs/library.md). No database round trip.
    pub fn is_leader(&self) -> bool {
        self.lock_held()
            .as_ref()
            .is_some_and(|held| !held.is_lost())
    }

    /// Where this candidate stands now.
    pub fn leadership(&self) -> Leadership {
        *self.state.borrow()
    }

    /// Every change of [`Elector::leadership`], as a watch channel:
    /// `changed().await` wakes on the next one.
    pub fn watch_leadership(&self) -> watch::Receiver<Leadership> {
        self.state.subscribe()
    }

    /// The current term's lease, if this candidate leads.
    pub fn term(&self) -> Option<HeldLease> {
        self.lock_held().clone()
    }

    /// The leader as last observed (this candidate or another), or `None`
    /// while nobody leads. Followers learn the leader's value (its
    /// address, say) here. Kept up to date while [`Elector::run`] runs,
    /// from notifications where available and by polling otherwise.
    pub fn leader(&self) -> Option<Leader> {
        self.leader.borrow().clone()
    }

    /// Every change of [`Elector::leader`], as a watch channel: a follower
    /// awaits `changed()` to learn of a new leader.
    pub fn watch_leader(&self) -> watch::Receiver<Option<Leader>> {
        self.leader.subscribe()
    }

    /// Who asked this candidate to step down, if it leads and somebody
    /// asked during its current term
    /// ([`LeaseManager::request_step_down`]).
    pub fn step_down_requested(&self) -> Option<String> {
        let Leadership::Leading { token } = self.leadership() else {
            return None;
        };
        match &*self.asked.borrow() {
            Some((asked, by)) if *asked == token => Some(by.clone()),
            _ => None,
        }
    }

    /// Waits until this candidate, leading, is about to hand its term over
    /// to the preferred candidate ([`Elector::prefer`]): the work should
    /// finish now (stop what it started); it is dropped after one TTL
    /// otherwise, and the term then moves.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only waits.
    pub async fn until_handover_due(&self) {
        let mut handing_over = self.handing_over.subscribe();
        let gone = handing_over
            .wait_for(|t| t.is_some() && *t == self.leading_token())
            .await
            .is_err();
        if gone {
            // The elector is gone: nothing will be due.
            std::future::pending::<()>().await;
        }
    }

    /// The token of the term this candidate leads, if any.
    fn leading_token(&self) -> Option<Token> {
        match self.leadership() {
            Leadership::Leading { token } => Some(token),
            _ => None,
        }
    }

    /// Waits until this candidate, leading, is asked to step down during
    /// its current term, and returns who asked. The work decides what to
    /// do: finish and call [`Elector::step_down`], or ignore the request
    /// (the lease stays held: safety first).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only waits.
    pub async fn until_step_down_requested(&self) -> String {
        let mut asked = self.asked.subscribe();
        let mut state = self.state.subscribe();
        loop {
            if let Some(by) = self.step_down_requested() {
                return by;
            }
            tokio::select! {
                changed = asked.changed() => if changed.is_err() { std::future::pending::<()>().await },
                changed = state.changed() => if changed.is_err() { std::future::pending::<()>().await },
            }
        }
    }

    /// Ends the current term, if this candidate leads: the work is
    /// dropped at its next await point, the lease released, and the
    /// candidate campaigns again once another candidate leads (or after
    /// one TTL if none does). Unlike [`Elector::resign`], the elector
    /// goes on.
    pub fn step_down(&self) {
        if let Leadership::Leading { token } = self.leadership() {
            self.stepping_down.send_replace(Some(token));
        }
    }

    /// How many terms this candidate has led.
    pub fn terms(&self) -> u64 {
        self.terms.load(Ordering::Relaxed)
    }

    /// Stops campaigning and, if leading, stops the work and releases the
    /// lease, so that the next candidate leads at once;
    /// [`Elector::run`] then returns. Final: this elector does not campaign
    /// again (make a new one to).
    pub fn resign(&self) {
        self.resigned.cancel();
    }

    /// The lease name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The current term's lease, locked.
    fn lock_held(&self) -> std::sync::MutexGuard<'_, Option<HeldLease>> {
        crate::sync::lock(&self.held)
    }

    /// Forgets the current term's lease (the term ended).
    fn forget_term(&self) {
        self.lock_held().take();
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::*;

    #[test]
    fn a_candidate_campaigns_again_at_once_after_a_wait_ran_out() {
        let at = DateTime::<Utc>::UNIX_EPOCH;
        let held = Error::Held {
            name: "leader".to_owned(),
            holder: "other".to_owned(),
            expires_at: at,
        };
        let pinned = Error::Pinned {
            name: "leader".to_owned(),
            holder: None,
            ended_at: at,
            reason: "a transaction".to_owned(),
        };
        assert_eq!(after_failure(&held), Retry::Now);
        assert_eq!(after_failure(&pinned), Retry::Now);
    }

    #[test]
    fn only_the_preferred_candidate_waits_in_line_and_others_offer_it_their_term() {
        assert!(campaigns_in_line(Some("a"), "a"));
        assert!(!campaigns_in_line(Some("a"), "b"));
        assert!(!campaigns_in_line(None, "a"));
        assert_eq!(offers_to(Some("a"), "b"), Some("a"));
        assert_eq!(offers_to(Some("a"), "a"), None);
        assert_eq!(offers_to(None, "b"), None);
    }

    #[test]
    fn a_candidate_stops_on_shutdown_fails_when_not_permitted_and_backs_off_otherwise() {
        assert_eq!(after_failure(&Error::ShutDown), Retry::Stop);
        let refused = Error::NotPermitted {
            message: "permission denied".to_owned(),
        };
        assert_eq!(after_failure(&refused), Retry::Fail);
        let unreachable = Error::Database(sqlx::Error::PoolTimedOut);
        assert_eq!(after_failure(&unreachable), Retry::Later);
    }
}
