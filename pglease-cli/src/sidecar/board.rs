//! What `--http` reports: the board a command keeps up to date (where it
//! stands, what it holds), and the pure verdicts read off a snapshot of
//! it: healthy, ready, and `/lease`'s JSON.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use pglease::elect::Leader;
use pglease::{HeldLease, RenewalHealth};
use serde_json::json;
use tokio::sync::watch;

use crate::sync::lock;

/// The long-running command a board is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Run,
    Elect,
    Share,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Run => "run",
            Kind::Elect => "elect",
            Kind::Share => "share",
        }
    }

    /// The phases this command goes through, in the order it meets them.
    pub(crate) fn phases(self) -> &'static [Phase] {
        match self {
            Kind::Run => &[
                Phase::Connecting,
                Phase::Waiting,
                Phase::Running,
                Phase::Stopping,
            ],
            Kind::Elect => &[
                Phase::Connecting,
                Phase::Campaigning,
                Phase::Leading,
                Phase::Stopping,
            ],
            Kind::Share => &[
                Phase::Connecting,
                Phase::Joining,
                Phase::Member,
                Phase::Stopping,
            ],
        }
    }
}

/// Where a command stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Connecting to the database.
    Connecting,
    /// `run`: acquiring the leases (or waiting for them).
    Waiting,
    /// `run`: CMD runs under the leases.
    Running,
    /// `elect`: a candidate, not leading.
    Campaigning,
    /// `elect`: leading; CMD runs under the term.
    Leading,
    /// `share`: joining the group.
    Joining,
    /// `share`: a member, running CMD per partition owned.
    Member,
    /// Stopping CMD (a loss, a signal, a step-down, the end).
    Stopping,
}

impl Phase {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Connecting => "connecting",
            Phase::Waiting => "waiting",
            Phase::Running => "running",
            Phase::Campaigning => "campaigning",
            Phase::Leading => "leading",
            Phase::Joining => "joining",
            Phase::Member => "member",
            Phase::Stopping => "stopping",
        }
    }
}

/// What a command tells its board.
struct Inner {
    phase: Phase,
    /// `run`'s leases, `elect`'s term.
    leases: Vec<HeldLease>,
    /// `share`: the group and the member.
    group: Option<(String, String)>,
    /// `share`: the membership held now.
    membership: Option<watch::Receiver<Option<HeldLease>>>,
    /// `share`: the partitions owned, by number.
    partitions: BTreeMap<u32, HeldLease>,
    /// `elect`: the leader as this candidate sees it.
    leader: Option<watch::Receiver<Option<Leader>>>,
}

/// What `run`, `elect` or `share` tells `--http`: kept whether or not
/// anything is served (a few locks a phase change; nothing per renewal).
pub(crate) struct Board {
    kind: Kind,
    inner: Mutex<Inner>,
}

impl Board {
    pub(crate) fn new(kind: Kind) -> Board {
        Board {
            kind,
            inner: Mutex::new(Inner {
                phase: Phase::Connecting,
                leases: Vec::new(),
                group: None,
                membership: None,
                partitions: BTreeMap::new(),
                leader: None,
            }),
        }
    }

    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// Connected: the command's first phase (acquiring, campaigning,
    /// joining).
    pub(crate) fn connected(&self) {
        self.set_phase(match self.kind {
            Kind::Run => Phase::Waiting,
            Kind::Elect => Phase::Campaigning,
            Kind::Share => Phase::Joining,
        });
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        lock(&self.inner).phase = phase;
    }

    /// The leases held now (`run`'s set, `elect`'s term), in `phase`.
    pub(crate) fn hold(&self, phase: Phase, leases: &[HeldLease]) {
        let mut inner = lock(&self.inner);
        inner.phase = phase;
        inner.leases = leases.to_vec();
    }

    /// Nothing held any more, now in `phase`.
    pub(crate) fn drop_leases(&self, phase: Phase) {
        let mut inner = lock(&self.inner);
        inner.phase = phase;
        inner.leases.clear();
    }

    /// `elect`: where to read who leads.
    pub(crate) fn follow_leader(&self, leader: watch::Receiver<Option<Leader>>) {
        lock(&self.inner).leader = Some(leader);
    }

    /// `share`: joined `group` as `member`; its membership lease.
    pub(crate) fn joined(
        &self,
        group: &str,
        member: &str,
        membership: watch::Receiver<Option<HeldLease>>,
    ) {
        let mut inner = lock(&self.inner);
        inner.phase = Phase::Member;
        inner.group = Some((group.to_owned(), member.to_owned()));
        inner.membership = Some(membership);
    }

    /// `share`: partition `k` is owned under `lease`.
    pub(crate) fn owns(&self, k: u32, lease: &HeldLease) {
        lock(&self.inner).partitions.insert(k, lease.clone());
    }

    /// `share`: partition `k` is no longer owned (revoked, lost).
    pub(crate) fn disowns(&self, k: u32) {
        lock(&self.inner).partitions.remove(&k);
    }

    /// Everything the endpoints say, as it is now.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let now = Instant::now();
        let inner = lock(&self.inner);
        let membership = inner
            .membership
            .as_ref()
            .map(|m| m.borrow().as_ref().map(|held| LeaseView::of(held, now)));
        Snapshot {
            kind: self.kind,
            phase: inner.phase,
            leases: inner.leases.iter().map(|h| LeaseView::of(h, now)).collect(),
            group: inner.group.clone(),
            membership,
            partitions: inner
                .partitions
                .iter()
                .map(|(k, h)| (*k, LeaseView::of(h, now)))
                .collect(),
            leader: inner.leader.as_ref().and_then(|l| l.borrow().clone()),
        }
    }
}

/// How a held lease's renewals stand.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Renewal {
    Confirmed,
    /// Failing for `since`; given up in `left` unless one succeeds.
    Failing {
        error: String,
        since: Duration,
        left: Duration,
    },
    Lost(String),
}

/// One held lease at one instant.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LeaseView {
    pub(crate) name: String,
    pub(crate) token: i64,
    pub(crate) holder: String,
    /// The expiry the database last confirmed, on the database's clock.
    pub(crate) expires_at: DateTime<Utc>,
    /// Time left before the local deadline (on this host's monotonic
    /// clock).
    pub(crate) left: Duration,
    pub(crate) renewal: Renewal,
}

impl LeaseView {
    fn of(held: &HeldLease, now: Instant) -> LeaseView {
        let renewal = match (held.loss_reason(), held.renewal_health()) {
            (Some(reason), _) => Renewal::Lost(reason.to_string()),
            (
                None,
                RenewalHealth::Failing {
                    since,
                    deadline,
                    error,
                },
            ) => Renewal::Failing {
                error: error.to_string(),
                since: now.saturating_duration_since(since),
                left: deadline.saturating_duration_since(now),
            },
            (None, _) => Renewal::Confirmed,
        };
        LeaseView {
            name: held.name().to_owned(),
            token: held.token().get(),
            holder: held.lease().holder().to_owned(),
            expires_at: held.expires_at(),
            left: held.deadline().saturating_duration_since(now),
            renewal,
        }
    }

    fn valid(&self) -> bool {
        !matches!(self.renewal, Renewal::Lost(_))
    }

    fn json(&self) -> serde_json::Value {
        let mut value = json!({
            "name": self.name,
            "token": self.token,
            "holder": self.holder,
            "expires_at": self.expires_at.to_rfc3339(),
            "deadline_in_seconds": secs(self.left),
        });
        let (renewal, error, lost) = match &self.renewal {
            Renewal::Confirmed => ("confirmed", None, None),
            Renewal::Failing { error, since, .. } => {
                value["failing_for_seconds"] = json!(secs(*since));
                ("failing", Some(error.as_str()), None)
            }
            Renewal::Lost(reason) => ("lost", None, Some(reason.as_str())),
        };
        value["renewal"] = json!(renewal);
        value["error"] = json!(error);
        value["lost"] = json!(lost);
        value
    }

    /// What is wrong with its renewals, if anything.
    fn trouble(&self) -> Option<String> {
        let (name, token) = (&self.name, self.token);
        match &self.renewal {
            Renewal::Confirmed => None,
            Renewal::Failing { error, since, left } => Some(format!(
                "renewals of {name:?} (token {token}) failing for {:.1} s: {error}; \
                 given up in {:.1} s unless one succeeds",
                since.as_secs_f64(),
                left.as_secs_f64()
            )),
            Renewal::Lost(reason) => Some(format!("lease {name:?} (token {token}) lost: {reason}")),
        }
    }
}

/// Seconds, to the millisecond, as JSON shows them.
fn secs(d: Duration) -> f64 {
    (d.as_millis() as f64) / 1000.0
}

/// A board as it is at one instant.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) kind: Kind,
    pub(crate) phase: Phase,
    pub(crate) leases: Vec<LeaseView>,
    pub(crate) group: Option<(String, String)>,
    /// `share`: `Some(None)` while joining again.
    pub(crate) membership: Option<Option<LeaseView>>,
    pub(crate) partitions: Vec<(u32, LeaseView)>,
    pub(crate) leader: Option<Leader>,
}

/// A verdict: `Ok` (200) or `Err` (503), with the reason in words.
pub(crate) type Verdict = Result<String, String>;

impl Snapshot {
    /// Every lease held, with the membership first.
    fn held(&self) -> impl Iterator<Item = &LeaseView> {
        self.membership
            .iter()
            .flatten()
            .chain(&self.leases)
            .chain(self.partitions.iter().map(|(_, v)| v))
    }

    /// `/healthz` where something is held: unhealthy once any renewal is
    /// failing or any lease is lost. `None` where nothing is held (the
    /// probe then asks whether the database answers).
    pub(crate) fn health(&self) -> Option<Verdict> {
        let mut held = self.held().peekable();
        held.peek()?;
        let mut count = 0;
        for lease in held {
            if let Some(trouble) = lease.trouble() {
                return Some(Err(trouble));
            }
            count += 1;
        }
        Some(Ok(format!(
            "{}: renewals confirmed ({count} lease{} held)",
            self.phase.as_str(),
            if count == 1 { "" } else { "s" }
        )))
    }

    /// `/readyz`: `elect` while it leads, `run` while CMD runs under valid
    /// leases, `share` while it is a member.
    pub(crate) fn readiness(&self) -> Verdict {
        let (wanted, leases): (Phase, Vec<&LeaseView>) = match self.kind {
            Kind::Run => (Phase::Running, self.leases.iter().collect()),
            Kind::Elect => (Phase::Leading, self.leases.iter().collect()),
            Kind::Share => (Phase::Member, self.membership.iter().flatten().collect()),
        };
        let phase = self.phase.as_str();
        if self.phase != wanted {
            return Err(match (&self.leader, self.phase) {
                (Some(leader), Phase::Campaigning) => format!(
                    "campaigning: {:?} leads (token {})",
                    leader.holder, leader.token
                ),
                _ => format!("{phase}, not {}", wanted.as_str()),
            });
        }
        if leases.is_empty() {
            return Err(format!("{phase}, but no lease is held"));
        }
        if let Some(lost) = leases.iter().find(|l| !l.valid()) {
            return Err(lost.trouble().unwrap_or_default());
        }
        let held: Vec<String> = leases
            .iter()
            .map(|l| format!("{:?} (token {})", l.name, l.token))
            .collect();
        Ok(format!("{phase} under {}", held.join(", ")))
    }

    /// `/lease`'s JSON, with the two verdicts (`healthy` as `health`
    /// decided, or from the database check `checked`).
    pub(crate) fn json(&self, healthy: &Verdict) -> serde_json::Value {
        let ready = self.readiness();
        let mut value = json!({
            "command": self.kind.as_str(),
            "state": self.phase.as_str(),
            "healthy": healthy.is_ok(),
            "health": either(healthy),
            "ready": ready.is_ok(),
            "readiness": either(&ready),
            "leases": self.leases.iter().map(LeaseView::json).collect::<Vec<_>>(),
        });
        if self.kind == Kind::Elect {
            value["leader"] = json!(self.leader.as_ref().map(|l| json!({
                "holder": l.holder,
                "token": l.token.get(),
                "value": l.value,
            })));
        }
        if self.kind == Kind::Share {
            let (group, member) = self.group.clone().unzip();
            value["group"] = json!(group);
            value["member"] = json!(member);
            value["membership"] =
                json!(self.membership.iter().flatten().next().map(LeaseView::json));
            value["partitions"] = json!(
                self.partitions
                    .iter()
                    .map(|(k, v)| {
                        let mut p = v.json();
                        p["partition"] = json!(k);
                        p
                    })
                    .collect::<Vec<_>>()
            );
        }
        value
    }
}

fn either(verdict: &Verdict) -> &str {
    match verdict {
        Ok(why) | Err(why) => why,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::Utc;

    use super::{Kind, LeaseView, Phase, Renewal, Snapshot};

    fn lease(name: &str, token: i64, renewal: Renewal) -> LeaseView {
        LeaseView {
            name: name.to_owned(),
            token,
            holder: "h".to_owned(),
            expires_at: Utc::now(),
            left: Duration::from_secs(2),
            renewal,
        }
    }

    fn snapshot(kind: Kind, phase: Phase, leases: Vec<LeaseView>) -> Snapshot {
        Snapshot {
            kind,
            phase,
            leases,
            group: None,
            membership: None,
            partitions: Vec::new(),
            leader: None,
        }
    }

    fn failing() -> Renewal {
        Renewal::Failing {
            error: "connection refused".to_owned(),
            since: Duration::from_millis(1200),
            left: Duration::from_millis(800),
        }
    }

    #[test]
    fn healthy_while_every_renewal_is_confirmed() {
        let ok = snapshot(
            Kind::Run,
            Phase::Running,
            vec![lease("a", 1, Renewal::Confirmed)],
        );
        assert_eq!(
            ok.health(),
            Some(Ok("running: renewals confirmed (1 lease held)".to_owned()))
        );
        let bad = snapshot(
            Kind::Run,
            Phase::Running,
            vec![lease("a", 1, Renewal::Confirmed), lease("b", 2, failing())],
        );
        let why = bad.health().and_then(Result::err).unwrap_or_default();
        assert!(
            why.contains("\"b\" (token 2) failing for 1.2 s: connection refused"),
            "{why}"
        );
        assert!(why.contains("given up in 0.8 s"), "{why}");
        let lost = snapshot(
            Kind::Elect,
            Phase::Stopping,
            vec![lease("a", 1, Renewal::Lost("expired".to_owned()))],
        );
        assert_eq!(
            lost.health(),
            Some(Err("lease \"a\" (token 1) lost: expired".to_owned()))
        );
        // Nothing held: the database is asked instead.
        assert_eq!(
            snapshot(Kind::Elect, Phase::Campaigning, vec![]).health(),
            None
        );
    }

    #[test]
    fn ready_only_in_the_commands_working_phase_under_a_valid_lease() {
        let leading = snapshot(
            Kind::Elect,
            Phase::Leading,
            vec![lease("svc", 7, failing())],
        );
        assert_eq!(
            leading.readiness(),
            Ok("leading under \"svc\" (token 7)".to_owned())
        );
        let campaigning = snapshot(Kind::Elect, Phase::Campaigning, vec![]);
        assert_eq!(
            campaigning.readiness(),
            Err("campaigning, not leading".to_owned())
        );
        let lost = snapshot(
            Kind::Elect,
            Phase::Leading,
            vec![lease("svc", 7, Renewal::Lost("stale".to_owned()))],
        );
        assert!(lost.readiness().is_err());
        let stopping = snapshot(
            Kind::Run,
            Phase::Stopping,
            vec![lease("a", 1, Renewal::Confirmed)],
        );
        assert_eq!(
            stopping.readiness(),
            Err("stopping, not running".to_owned())
        );
        let mut member = snapshot(Kind::Share, Phase::Member, vec![]);
        member.membership = Some(None);
        assert_eq!(
            member.readiness(),
            Err("member, but no lease is held".to_owned())
        );
        member.membership = Some(Some(lease("g/members/m", 3, Renewal::Confirmed)));
        assert!(member.readiness().is_ok());
    }

    #[test]
    fn the_lease_json_says_each_lease_and_both_verdicts() {
        let mut s = snapshot(Kind::Share, Phase::Member, vec![]);
        s.group = Some(("g".to_owned(), "m".to_owned()));
        s.membership = Some(Some(lease("g/members/m", 3, Renewal::Confirmed)));
        s.partitions = vec![(4, lease("g/4", 9, failing()))];
        let health = s.health().unwrap_or_else(|| Ok(String::new()));
        let json = s.json(&health);
        assert_eq!(json["command"], "share");
        assert_eq!(json["ready"], true);
        assert_eq!(json["healthy"], false);
        assert_eq!(json["membership"]["token"], 3);
        assert_eq!(json["partitions"][0]["partition"], 4);
        assert_eq!(json["partitions"][0]["renewal"], "failing");
        assert_eq!(json["partitions"][0]["failing_for_seconds"], 1.2);
        assert_eq!(json["partitions"][0]["error"], "connection refused");
    }
}
