//! What a member does after reading its group: pure and clock-free (the
//! durations are the database's, as the read reports them), so that every
//! decision is unit-tested without a database.

use std::collections::BTreeSet;
use std::time::Duration;

use super::assign;

/// A partition's valid owner, as the group's read reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The owner's member name (the partition lease's holder).
    pub(crate) member: String,
    /// The partition lease's token.
    pub(crate) token: i64,
    /// How long the lease stays valid unless renewed (database clock).
    pub(crate) remaining: Duration,
    /// Handed over to `member`, not picked up yet.
    pub(crate) handed: bool,
}

/// A live member, as the group's read reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Live {
    /// Its name.
    pub(crate) name: String,
    /// Its membership lease's token.
    pub(crate) token: i64,
    /// How long its membership stays valid unless renewed (database
    /// clock).
    pub(crate) remaining: Duration,
}

/// One read of a group (`pglease.group_state`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Read {
    /// The partition count.
    pub(crate) partitions: usize,
    /// The live members, sorted by name (bytes).
    pub(crate) members: Vec<Live>,
    /// Each partition's valid owner; `None` when the read asked for the
    /// members only.
    pub(crate) owners: Option<Vec<Option<Owner>>>,
}

impl Read {
    /// The live members' names.
    pub(crate) fn member_names(&self) -> Vec<&str> {
        self.members.iter().map(|m| m.name.as_str()).collect()
    }
}

/// What a member should do now.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Partitions to take: free ones the target gives this member, and
    /// ones handed over to it.
    pub(crate) take: Vec<usize>,
    /// Partitions it holds that the target gives another member (or that
    /// no longer exist): to revoke, then hand over.
    pub(crate) revoke: Vec<usize>,
    /// Partitions the target gives it that another holds: it waits for
    /// their handover (or their owner's expiry).
    pub(crate) awaited: usize,
    /// Partitions nobody owns now that the target gives another member:
    /// reads made at other moments may target them elsewhere, so a member
    /// looks again soon while any is left.
    pub(crate) unowned: usize,
    /// Partitions whose owner is no longer a live member: they free
    /// themselves at their expiry (`look_in` says when), and the read
    /// then must name the owners again.
    pub(crate) gone: usize,
    /// The soonest the read says something may change by itself: another
    /// member's membership, or the lease of a partition it waits for whose
    /// owner is gone, could expire then.
    pub(crate) look_in: Option<Duration>,
}

impl Plan {
    /// Looks again no later than `after` from the read.
    fn look_at_most(&mut self, after: Duration) {
        self.look_in = Some(self.look_in.map_or(after, |soonest| soonest.min(after)));
    }
}

/// The members the target shares the partitions among: the live ones,
/// without `me` while it leaves.
fn sharing<'a>(read: &'a Read, me: &str, leaving: bool) -> Vec<&'a str> {
    read.member_names()
        .into_iter()
        .filter(|&m| !(leaving && m == me))
        .collect()
}

/// The target owner of each partition, by name (empty without members).
pub(crate) fn target<'a>(read: &'a Read, me: &str, leaving: bool) -> Vec<&'a str> {
    let members = sharing(read, me, leaving);
    let owners: Vec<Option<&str>> = read
        .owners
        .iter()
        .flatten()
        .map(|o| o.as_ref().map(|o| o.member.as_str()))
        .collect();
    assign::target(read.partitions, &members, &owners)
        .into_iter()
        .map(|i| members[i])
        .collect()
}

/// The plan for member `me` (`leaving`: it gives up every partition),
/// which holds `held` and is revoking `revoking` of them, after a full
/// `read` (one with owners).
pub(crate) fn plan(
    read: &Read,
    me: &str,
    leaving: bool,
    held: &BTreeSet<usize>,
    revoking: &BTreeSet<usize>,
) -> Plan {
    let target = target(read, me, leaving);
    let owners = read.owners.as_deref().unwrap_or_default();
    let live: BTreeSet<&str> = read.members.iter().map(|m| m.name.as_str()).collect();
    let mut plan = Plan {
        look_in: read
            .members
            .iter()
            .filter(|m| m.name != me)
            .map(|m| m.remaining)
            .min(),
        ..Plan::default()
    };
    for (k, &to) in target.iter().enumerate() {
        let owner = owners.get(k).and_then(Option::as_ref);
        // A partition whose owner is gone frees itself at its expiry,
        // whoever the target gives it to: look then.
        if let Some(o) = owner
            && !live.contains(o.member.as_str())
            && !(leaving && o.member == me)
        {
            plan.gone += 1;
            plan.look_at_most(o.remaining);
        }
        if to == me {
            if held.contains(&k) {
                continue;
            }
            match owner {
                None => plan.take.push(k),
                Some(o) if o.member == me && o.handed => plan.take.push(k),
                Some(o) => {
                    plan.awaited += 1;
                    // Not handed over by an owner that is no longer a
                    // member (see above), nor by this member's earlier
                    // self: the lease's expiry frees the partition.
                    if o.member == me {
                        plan.look_at_most(o.remaining);
                    }
                }
            }
        } else {
            if owner.is_none() {
                plan.unowned += 1;
            }
            if held.contains(&k) && !revoking.contains(&k) {
                plan.revoke.push(k);
            }
        }
    }
    // Partitions beyond the count (it shrank), or everything without a
    // target (no member left but this leaving one).
    plan.revoke.extend(
        held.iter()
            .copied()
            .filter(|&k| k >= target.len() && !revoking.contains(&k)),
    );
    plan
}

/// Who partition `k` goes to when its owner `me` gives it up: the
/// target's member, or `None` (release it) when that is `me` or nobody.
pub(crate) fn successor(read: &Read, me: &str, leaving: bool, k: usize) -> Option<String> {
    target(read, me, leaving)
        .get(k)
        .filter(|&&to| to != me)
        .map(|&to| to.to_owned())
}

/// Whether a members-only read shows the same members (the same
/// memberships) as the last full read: if not, the owners must be read
/// again.
pub(crate) fn same_members(last: &Read, now: &Read) -> bool {
    last.partitions == now.partitions
        && last.members.len() == now.members.len()
        && last
            .members
            .iter()
            .zip(&now.members)
            .all(|(a, b)| a.name == b.name && a.token == b.token)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn read(partitions: usize, members: &[&str], owners: &[Option<(&str, bool)>]) -> Read {
        Read {
            partitions,
            members: members
                .iter()
                .enumerate()
                .map(|(i, m)| Live {
                    name: (*m).to_owned(),
                    token: 100 + i as i64,
                    remaining: 10 * SEC,
                })
                .collect(),
            owners: Some(
                (0..partitions)
                    .map(|k| {
                        owners.get(k).copied().flatten().map(|(m, handed)| Owner {
                            member: m.to_owned(),
                            token: k as i64 + 1,
                            remaining: 3 * SEC,
                            handed,
                        })
                    })
                    .collect(),
            ),
        }
    }

    fn set(items: &[usize]) -> BTreeSet<usize> {
        items.iter().copied().collect()
    }

    #[test]
    fn a_lone_member_takes_every_free_partition() {
        let r = read(4, &["a"], &[]);
        let p = plan(&r, "a", false, &set(&[]), &set(&[]));
        assert_eq!(p.take, vec![0, 1, 2, 3]);
        assert!(p.revoke.is_empty());
        assert_eq!(p.look_in, None);
    }

    #[test]
    fn a_member_revokes_what_a_newcomer_should_own_and_the_newcomer_waits() {
        let owners = [Some(("a", false)); 4];
        let r = read(4, &["a", "b"], &owners);
        let a = plan(&r, "a", false, &set(&[0, 1, 2, 3]), &set(&[]));
        assert_eq!(a.take, Vec::<usize>::new());
        assert_eq!(a.revoke.len(), 2);
        let b = plan(&r, "b", false, &set(&[]), &set(&[]));
        assert!(b.take.is_empty(), "b never takes a held partition");
        assert_eq!(b.awaited, 2);
        // a is a live member: b waits for its handover, not its expiry.
        assert_eq!(b.look_in, Some(10 * SEC));
        for &k in &a.revoke {
            assert_eq!(successor(&r, "a", false, k).as_deref(), Some("b"));
        }
        // Revoking already: not revoked twice.
        let again = plan(
            &r,
            "a",
            false,
            &set(&[0, 1, 2, 3]),
            &a.revoke.iter().copied().collect(),
        );
        assert!(again.revoke.is_empty());
    }

    #[test]
    fn a_handed_partition_is_picked_up_by_its_new_owner_only() {
        let owners = [Some(("a", false)), Some(("b", true))];
        let r = read(2, &["a", "b"], &owners);
        assert_eq!(plan(&r, "b", false, &set(&[]), &set(&[])).take, vec![1]);
        assert!(plan(&r, "a", false, &set(&[0]), &set(&[])).take.is_empty());
    }

    #[test]
    fn a_dead_owners_partitions_are_looked_at_when_they_expire() {
        // c died: its membership is gone, its partition lease still valid.
        let owners = [Some(("a", false)), Some(("c", false))];
        let r = read(2, &["a", "b"], &owners);
        let b = plan(&r, "b", false, &set(&[]), &set(&[]));
        assert!(b.take.is_empty());
        assert_eq!(b.awaited, 1);
        assert_eq!(b.look_in, Some(3 * SEC));
    }

    #[test]
    fn a_free_partition_targeted_elsewhere_is_counted_and_a_gone_owners_expiry_watched() {
        // c died: its partition 1 is still valid; partition 2 is free.
        let owners = [
            Some(("a", false)),
            Some(("c", false)),
            None,
            Some(("b", false)),
        ];
        let r = read(4, &["a", "b"], &owners);
        for me in ["a", "b"] {
            let p = plan(&r, me, false, &set(&[]), &set(&[]));
            // Whoever the target gives them to, each member watches c's
            // expiry and sees the free partition.
            assert_eq!(p.look_in, Some(3 * SEC), "{me}");
            let t = target(&r, me, false);
            let free_elsewhere = [1usize, 2]
                .iter()
                .filter(|&&k| t[k] != me && owners[k].is_none())
                .count();
            assert_eq!(p.unowned, free_elsewhere, "{me}");
            assert_eq!(p.gone, 1, "{me}");
        }
    }

    #[test]
    fn a_leaving_member_revokes_everything_to_the_others() {
        let owners = [Some(("a", false)), Some(("b", false)), Some(("a", false))];
        let r = read(3, &["a", "b", "c"], &owners);
        let a = plan(&r, "a", true, &set(&[0, 2]), &set(&[]));
        assert_eq!(a.revoke, vec![0, 2]);
        assert!(a.take.is_empty());
        for k in [0, 2] {
            let to = successor(&r, "a", true, k);
            assert!(matches!(to.as_deref(), Some("b" | "c")), "{to:?}");
        }
        // The last member leaving releases.
        let alone = read(1, &["a"], &[Some(("a", false))]);
        assert_eq!(
            plan(&alone, "a", true, &set(&[0]), &set(&[])).revoke,
            vec![0]
        );
        assert_eq!(successor(&alone, "a", true, 0), None);
    }

    #[test]
    fn partitions_beyond_a_shrunk_count_are_revoked_and_released() {
        let r = read(2, &["a"], &[Some(("a", false)), Some(("a", false))]);
        let p = plan(&r, "a", false, &set(&[0, 1, 2, 3]), &set(&[]));
        assert_eq!(p.revoke, vec![2, 3]);
        assert_eq!(successor(&r, "a", false, 3), None);
    }

    #[test]
    fn members_only_reads_compare_by_name() {
        let a = read(4, &["a", "b"], &[]);
        let mut b = a.clone();
        b.members[0].remaining = SEC;
        assert!(same_members(&a, &b));
        b.members[1].token += 1;
        assert!(!same_members(&a, &b));
        b.members[1].token -= 1;
        b.owners = None;
        assert!(same_members(&a, &b));
        b.members.pop();
        assert!(!same_members(&a, &b));
    }
}
