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
use crate::lease::Acquire;
use crate::manager::LeaseManager;
use crate::token::Token;

/// How long one campaign statement waits before it is sent again (a
/// campaign waits for as long as it takes; this only bounds one wait).
const CAMPAIGN: Duration = Duration::from_secs(3600);

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

/// One candidate in the election of a lease name, made by
/// [`LeaseManager::elector`]. [`Elector::run`] campaigns and runs the
/// leader's work; [`Elector::is_leader`], [`Elector::leadership`] and
/// [`Elector::subscribe`] tell where it stands; [`Elector::resign`] hands
/// over. See docs/library.md, "Leader election".
#[derive(Debug)]
pub struct Elector {
    manager: LeaseManager,
    name: String,
    how: Acquire,
    state: watch::Sender<Leadership>,
    held: Mutex<Option<HeldLease>>,
    resigned: CancellationToken,
    terms: AtomicU64,
}

/// How a term ended.
enum Ended {
    Lost(LossReason),
    Resigned,
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
    /// [`Error::InvalidInput`] for a bad name, holder, value or TTL, or a
    /// TTL too short for the manager's renewal timing.
    pub fn elector(&self, name: &str, how: Acquire) -> Result<Elector> {
        how.check(name)?;
        self.options().timing(how.lease_ttl())?;
        Ok(Elector {
            manager: self.clone(),
            name: name.to_owned(),
            how: how.wait(CAMPAIGN),
            state: watch::Sender::new(Leadership::Stopped),
            held: Mutex::new(None),
            resigned: CancellationToken::new(),
            terms: AtomicU64::new(0),
        })
    }
}

impl Elector {
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
    /// backoff (from 50 ms up to 3.2 s). Run it once per elector at a time
    /// (two runs of one elector would campaign as the same candidate).
    ///
    /// # Errors
    ///
    /// None for now; the `Result` leaves room for errors that end a
    /// campaign.
    ///
    /// # Cancel safety
    ///
    /// Dropped, the campaign stops, `work` is dropped with it, and the
    /// term's lease is released in the background once the last clone of
    /// its [`HeldLease`] is gone.
    pub async fn run<F>(&self, mut work: F) -> Result<()>
    where
        F: AsyncFnMut(HeldLease),
    {
        let _running = Running(self);
        let mut failures: u32 = 0;
        loop {
            if self.resigned.is_cancelled() {
                return Ok(());
            }
            self.state.send_replace(Leadership::Candidate);
            let campaign = self.manager.hold(&self.name, self.how.clone());
            let held = tokio::select! {
                biased;
                () = self.resigned.cancelled() => return Ok(()),
                held = campaign => held,
            };
            let held = match held {
                Ok(held) => {
                    failures = 0;
                    held
                }
                // One wait ran out: campaign again.
                Err(Error::Held { .. } | Error::Pinned { .. }) => continue,
                Err(Error::ShutDown) => return Ok(()),
                Err(error) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(name = self.name, %error, "campaign failed; retrying");
                    tokio::select! {
                        () = self.resigned.cancelled() => return Ok(()),
                        () = tokio::time::sleep(backoff::reconnect(failures)) => continue,
                    }
                }
            };
            *self.lock_held() = Some(held.clone());
            self.terms.fetch_add(1, Ordering::Relaxed);
            self.state.send_replace(Leadership::Leading {
                token: held.token(),
            });
            let ended = {
                let mut ends = std::pin::pin!(async {
                    tokio::select! {
                        biased;
                        () = self.resigned.cancelled() => Ended::Resigned,
                        reason = held.lost() => Ended::Lost(reason),
                    }
                });
                tokio::select! {
                    biased;
                    ended = &mut ends => ended,
                    // The work is done (or gave up, say after a refused fenced
                    // write): the term goes on until it is lost or resigned.
                    () = work(held.clone()) => ends.await,
                }
            };
            self.forget_term();
            match ended {
                Ended::Lost(reason) => {
                    tracing::info!(name = self.name, token = %held.token(), ?reason, "leadership lost");
                }
                Ended::Resigned => {
                    if let Err(error) = held.release().await {
                        tracing::warn!(name = self.name, %error, "could not release on resigning");
                    }
                    return Ok(());
                }
            }
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
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.state.subscribe()
    }

    /// The current term's lease, if this candidate leads.
    pub fn term(&self) -> Option<HeldLease> {
        self.lock_held().clone()
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

    fn lock_held(&self) -> std::sync::MutexGuard<'_, Option<HeldLease>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn forget_term(&self) {
        self.lock_held().take();
    }
}
