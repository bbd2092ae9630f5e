//! A lease group's members as the measure drives them: each on a task of
//! its own that joins, answers every revoke at once (no work to finish)
//! and writes each event on a shared [`Board`]: who owns which partition,
//! and when each partition was assigned.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pglease::{Error, GroupEvent, GroupOptions, HeldLease, LeaseManager};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// What the members' events said, by member index.
#[derive(Default)]
pub(crate) struct Board {
    /// Each partition's owner.
    owner: Vec<Option<usize>>,
    /// Every assignment: member, partition, when its event came.
    assigned: Vec<(usize, u32, Instant)>,
    /// Revokes answered.
    revoked: usize,
    /// Partitions lost.
    lost: usize,
}

impl Board {
    fn assign(&mut self, member: usize, partition: u32) {
        self.owner[partition as usize] = Some(member);
        self.assigned.push((member, partition, Instant::now()));
    }

    fn give_up(&mut self, member: usize, partition: u32) {
        let owner = &mut self.owner[partition as usize];
        if *owner == Some(member) {
            *owner = None;
        }
    }
}

/// A member's task: it answers `Some(the instant leave was called)` once
/// it has left, `None` once the manager stopped it.
type MemberTask = JoinHandle<Result<Option<Instant>, Error>>;

struct Member {
    leave: oneshot::Sender<()>,
    task: MemberTask,
}

/// One group's members, by index (in the order they joined).
pub(crate) struct Group {
    name: String,
    partitions: u32,
    ttl: Duration,
    board: Arc<Mutex<Board>>,
    /// `None` once the member left.
    members: Vec<Option<Member>>,
}

/// Assignments from one point of a group's log on.
pub(crate) struct Moves {
    /// Every assignment after the mark: member, partition, when.
    pub(crate) assigned: Vec<(usize, u32, Instant)>,
    /// Revokes answered after the mark.
    pub(crate) revoked: usize,
    /// Partitions lost after the mark.
    pub(crate) lost: usize,
}

/// A point in a group's log, for [`Group::since`].
#[derive(Clone, Copy)]
pub(crate) struct Mark {
    assigned: usize,
    revoked: usize,
    lost: usize,
}

impl Group {
    pub(crate) fn new(name: &str, partitions: u32, ttl: Duration) -> Group {
        Group {
            name: name.to_owned(),
            partitions,
            ttl,
            board: Arc::new(Mutex::new(Board {
                owner: vec![None; partitions as usize],
                ..Board::default()
            })),
            members: Vec::new(),
        }
    }

    fn board(&self) -> std::sync::MutexGuard<'_, Board> {
        self.board.lock().expect("board")
    }

    /// Starts a member `member` joining through `m` (it joins on its own
    /// task: this returns at once); its index.
    pub(crate) fn join(&mut self, m: &LeaseManager, member: &str) -> usize {
        let index = self.members.len();
        let (leave, mut leaving) = oneshot::channel();
        let options = GroupOptions::partitions(self.partitions)
            .ttl(self.ttl)
            .member(member);
        let (m, group, board) = (m.clone(), self.name.clone(), self.board.clone());
        let task = tokio::spawn(async move {
            let mut member = m.join(&group, options).await?;
            // Kept while owned: a partition's last handle dropped is released.
            let mut held: BTreeMap<u32, HeldLease> = BTreeMap::new();
            loop {
                tokio::select! {
                    biased;
                    _ = &mut leaving => {
                        let at = Instant::now();
                        member.leave().await?;
                        return Ok(Some(at));
                    }
                    event = member.next_event() => match event {
                        None => return Ok(None),
                        Some(GroupEvent::Assigned { partition, lease }) => {
                            board.lock().expect("board").assign(index, partition);
                            held.insert(partition, lease);
                        }
                        Some(GroupEvent::Revoking(revoke)) => {
                            let partition = revoke.partition();
                            {
                                let mut board = board.lock().expect("board");
                                board.give_up(index, partition);
                                board.revoked += 1;
                            }
                            held.remove(&partition);
                            // Answered at once: no work to finish.
                            revoke.done();
                        }
                        Some(GroupEvent::Lost { partition, .. }) => {
                            let mut board = board.lock().expect("board");
                            board.give_up(index, partition);
                            board.lost += 1;
                            held.remove(&partition);
                        }
                        Some(_) => {}
                    }
                }
            }
        });
        self.members.push(Some(Member { leave, task }));
        index
    }

    /// The members that have not left.
    pub(crate) fn live(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].is_some())
            .collect()
    }

    /// The partitions `member` owns now.
    pub(crate) fn owned_by(&self, member: usize) -> Vec<u32> {
        self.board()
            .owner
            .iter()
            .enumerate()
            .filter(|(_, o)| **o == Some(member))
            .map(|(k, _)| k as u32)
            .collect()
    }

    /// Member `member` leaves (`GroupMember::leave`: its revokes count as
    /// done): when the call began, once it has returned.
    pub(crate) async fn leave(&mut self, member: usize) -> Result<Instant, Error> {
        let Member { leave, task } = self.members[member].take().expect("a live member");
        let _ = leave.send(());
        let at = task.await.expect("member task")?;
        Ok(at.expect("the member left"))
    }

    /// A point in the log, to read what came after it with [`Group::since`].
    pub(crate) fn mark(&self) -> Mark {
        let board = self.board();
        Mark {
            assigned: board.assigned.len(),
            revoked: board.revoked,
            lost: board.lost,
        }
    }

    /// What happened since `mark`.
    pub(crate) fn since(&self, mark: Mark) -> Moves {
        let board = self.board();
        Moves {
            assigned: board.assigned[mark.assigned..].to_vec(),
            revoked: board.revoked - mark.revoked,
            lost: board.lost - mark.lost,
        }
    }

    /// Waits (at most `limit`) until the live members own every
    /// partition, each its share (rounded down or up); the instant of the
    /// last assignment then; else each live member's count.
    pub(crate) async fn settled(&self, limit: Duration) -> Result<Instant, Vec<usize>> {
        let live = self.live();
        let deadline = Instant::now() + limit;
        loop {
            if let Some(at) = self.settled_now(&live) {
                return Ok(at);
            }
            for member in self.members.iter().flatten() {
                assert!(!member.task.is_finished(), "a member stopped");
            }
            if Instant::now() > deadline {
                let board = self.board();
                return Err(live
                    .iter()
                    .map(|&i| board.owner.iter().filter(|o| **o == Some(i)).count())
                    .collect());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// [`Group::settled`], or a panic naming the counts.
    pub(crate) async fn settle(&self, limit: Duration) -> Instant {
        match self.settled(limit).await {
            Ok(at) => at,
            Err(counts) => panic!(
                "group {} not settled within {limit:?}: {counts:?}",
                self.name
            ),
        }
    }

    /// The instant of the last assignment, if `live` own every partition,
    /// each its share.
    fn settled_now(&self, live: &[usize]) -> Option<Instant> {
        let board = self.board();
        let mut counts = vec![0usize; self.members.len()];
        let mut is_live = vec![false; self.members.len()];
        for &i in live {
            is_live[i] = true;
        }
        for owner in &board.owner {
            match owner {
                Some(i) if is_live[*i] => counts[*i] += 1,
                _ => return None,
            }
        }
        let partitions = self.partitions as usize;
        let (low, high) = (partitions / live.len(), partitions.div_ceil(live.len()));
        live.iter()
            .all(|&i| counts[i] == low || counts[i] == high)
            .then(|| board.assigned.last().map(|a| a.2))
            .flatten()
    }
}
