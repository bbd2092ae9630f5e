//! Who should own which partition: a pure, clock-free function of the
//! partition count, the live members and the current owners, which every
//! member computes the same way from the same read.
//!
//! The target is balanced, sticky and bounded:
//!
//! - **Balanced.** With `M` partitions and `N` members, each member's
//!   quota is `M / N` or `M / N + 1` (the `M % N` members that own the most
//!   now get the larger one; ties go to the smaller member name), and the
//!   target gives every partition to exactly one member, each exactly its
//!   quota.
//! - **Sticky.** A member keeps as many of its current partitions as its
//!   quota allows (its lowest-numbered ones); only the rest move.
//! - **Bounded movement.** From a balanced assignment, a new member takes
//!   only its quota (at most `ceil(M / (N + 1))`), and only from members
//!   above theirs; a member that leaves or dies frees only its own
//!   partitions, each going to a member below its quota.
//!
//! A partition without a live owner (free, or owned by someone who is not
//! a member) goes to the member below its quota with the highest
//! rendezvous weight for that partition (a hash of the member's name and
//! the partition number), so free partitions spread evenly and the same
//! member wins the same partition in every process.

/// The target owner of each partition, as an index into `members`.
///
/// `members` lists the live members, sorted and without duplicates;
/// `owners[k]` is partition `k`'s current valid owner, if any (any name:
/// one that is not in `members` counts as no owner). Partitions beyond
/// `owners.len()` are free. Empty when there are no members.
pub(crate) fn target(partitions: usize, members: &[&str], owners: &[Option<&str>]) -> Vec<usize> {
    let n = members.len();
    if n == 0 {
        return Vec::new();
    }
    // Who owns each partition now, among the members.
    let current: Vec<Option<usize>> = (0..partitions)
        .map(|k| {
            owners
                .get(k)
                .copied()
                .flatten()
                .and_then(|owner| members.binary_search(&owner).ok())
        })
        .collect();
    let mut counts = vec![0usize; n];
    for &i in current.iter().flatten() {
        counts[i] += 1;
    }

    // Quotas: the members that own the most get the larger ones.
    let (base, extra) = (partitions / n, partitions % n);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
    let mut quota = vec![base; n];
    for &i in order.iter().take(extra) {
        quota[i] += 1;
    }

    // Each member keeps its lowest-numbered partitions up to its quota.
    let mut target: Vec<Option<usize>> = vec![None; partitions];
    let mut kept = vec![0usize; n];
    for (k, owner) in current.iter().enumerate() {
        if let Some(i) = *owner
            && kept[i] < quota[i]
        {
            kept[i] += 1;
            target[k] = Some(i);
        }
    }

    // The rest go, in partition order, to the member below its quota
    // with the highest rendezvous weight.
    let seeds: Vec<u64> = members.iter().map(|m| fnv1a(m.as_bytes())).collect();
    target
        .iter()
        .enumerate()
        .map(|(k, assigned)| match *assigned {
            Some(i) => i,
            None => {
                let i = (0..n)
                    .filter(|&i| kept[i] < quota[i])
                    .max_by_key(|&i| (weight(seeds[i], k), std::cmp::Reverse(i)))
                    .expect("the quotas add up to the partition count");
                kept[i] += 1;
                i
            }
        })
        .collect()
}

/// FNV-1a, 64 bits: the same in every process and on every platform.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A member's rendezvous weight for partition `k` (splitmix64's finaliser
/// over the member's seed and the partition number).
fn weight(seed: u64, k: usize) -> u64 {
    let mut z = seed ^ (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("m{i:03}")).collect()
    }

    fn refs(names: &[String]) -> Vec<&str> {
        names.iter().map(String::as_str).collect()
    }

    /// The owners a target gives, by name.
    fn owners_of<'a>(members: &[&'a str], target: &[usize]) -> Vec<Option<&'a str>> {
        target.iter().map(|&i| Some(members[i])).collect()
    }

    fn assert_balanced(partitions: usize, members: &[&str], target: &[usize]) {
        assert_eq!(target.len(), partitions);
        let n = members.len();
        let mut counts = vec![0usize; n];
        for &i in target {
            counts[i] += 1;
        }
        let (low, high) = (partitions / n, partitions.div_ceil(n));
        assert!(
            counts.iter().all(|&c| c == low || c == high),
            "{counts:?} not within {low}..={high}"
        );
    }

    fn moved(before: &[Option<&str>], after: &[Option<&str>]) -> usize {
        before
            .iter()
            .zip(after)
            .filter(|(b, a)| b.is_some() && b != a)
            .count()
    }

    #[test]
    fn no_members_no_target() {
        assert!(target(4, &[], &[]).is_empty());
    }

    #[test]
    fn free_partitions_are_spread_evenly_and_the_same_everywhere() {
        for (m, n) in [(16, 5), (1, 3), (3, 3), (1000, 7), (10, 1), (7, 10)] {
            let members = names(n);
            let members = refs(&members);
            let first = target(m, &members, &[]);
            assert_balanced(m, &members, &first);
            assert_eq!(first, target(m, &members, &vec![None; m]));
        }
    }

    #[test]
    fn a_balanced_assignment_stays_as_it_is() {
        let members = names(5);
        let members = refs(&members);
        let first = target(16, &members, &[]);
        let owners = owners_of(&members, &first);
        assert_eq!(target(16, &members, &owners), first);
    }

    #[test]
    fn a_join_moves_only_its_quota_and_only_to_the_newcomer() {
        for (m, n) in [(16, 5), (5, 3), (3, 3), (1000, 5), (7, 1), (100, 99)] {
            let all = names(n + 1);
            let before_members: Vec<&str> = refs(&all[..n]);
            let before = owners_of(&before_members, &target(m, &before_members, &[]));
            let members = refs(&all);
            let after_target = target(m, &members, &before);
            assert_balanced(m, &members, &after_target);
            let after = owners_of(&members, &after_target);
            let newcomer = members[n];
            for (b, a) in before.iter().zip(&after) {
                assert!(b == a || *a == Some(newcomer), "moved {b:?} -> {a:?}");
            }
            assert!(moved(&before, &after) <= m.div_ceil(n + 1));
        }
    }

    #[test]
    fn a_leave_or_death_moves_only_the_leavers_partitions() {
        for (m, n, gone) in [(16, 5, 2), (16, 5, 0), (5, 3, 1), (1000, 10, 9), (2, 2, 1)] {
            let all = names(n);
            let members = refs(&all);
            let before = owners_of(&members, &target(m, &members, &[]));
            let left = members[gone];
            let rest: Vec<&str> = members.iter().copied().filter(|&x| x != left).collect();
            let after_target = target(m, &rest, &before);
            assert_balanced(m, &rest, &after_target);
            let after = owners_of(&rest, &after_target);
            for (b, a) in before.iter().zip(&after) {
                assert!(b == a || *b == Some(left), "moved {b:?} -> {a:?}");
            }
        }
    }

    #[test]
    fn owners_that_are_not_members_count_as_none() {
        let members = ["a", "b"];
        let owners = [Some("ghost"), Some("a"), None, Some("ghost")];
        let t = target(4, &members, &owners);
        assert_balanced(4, &members, &t);
        assert_eq!(t[1], 0, "a keeps its partition");
    }

    #[test]
    fn a_lopsided_start_is_evened_out_moving_only_the_excess() {
        // One member took everything while it was alone.
        let members = ["a", "b", "c", "d"];
        let owners: Vec<Option<&str>> = vec![Some("a"); 14];
        let t = target(14, &members, &owners);
        assert_balanced(14, &members, &t);
        let after = owners_of(&members, &t);
        // a keeps the larger quota (it owns the most) and moves the rest.
        assert_eq!(moved(&owners, &after), 14 - 4);
    }

    proptest::proptest! {
        /// From any owners at all (any members, strangers, free), the
        /// target is balanced, keeps every member's partitions up to its
        /// quota, and is then stable; a join from there moves only to the
        /// newcomer, at most ceil(M / (N + 1)); a leave only the leaver's.
        #[test]
        fn any_start_is_balanced_sticky_and_bounded(
            m in 1usize..200,
            n in 1usize..12,
            seed in proptest::collection::vec(0usize..14, 0..200),
            gone in 0usize..12,
        ) {
            let all = names(n + 1);
            let members = refs(&all[..n]);
            let pool: Vec<&str> = refs(&all).into_iter().chain(["stranger"]).collect();
            let owners: Vec<Option<&str>> =
                seed.iter().take(m).map(|&i| pool.get(i).copied()).collect();
            let t = target(m, &members, &owners);
            assert_balanced(m, &members, &t);
            let settled = owners_of(&members, &t);
            // Sticky: a member keeps min(what it had, its new count).
            for (i, member) in members.iter().enumerate() {
                let had = owners.iter().filter(|o| **o == Some(*member)).count();
                let kept = owners
                    .iter()
                    .zip(&settled)
                    .filter(|(o, s)| **o == Some(*member) && **s == Some(*member))
                    .count();
                let now = t.iter().filter(|&&x| x == i).count();
                proptest::prop_assert_eq!(kept, had.min(now));
            }
            proptest::prop_assert_eq!(target(m, &members, &settled), t.clone());
            // A join.
            let joined = refs(&all);
            let after = owners_of(&joined, &target(m, &joined, &settled));
            let newcomer = joined[n];
            for (b, a) in settled.iter().zip(&after) {
                proptest::prop_assert!(b == a || *a == Some(newcomer));
            }
            proptest::prop_assert!(moved(&settled, &after) <= m.div_ceil(n + 1));
            // A leave.
            if n > 1 {
                let left = members[gone % n];
                let rest: Vec<&str> = members.iter().copied().filter(|&x| x != left).collect();
                let after = owners_of(&rest, &target(m, &rest, &settled));
                for (b, a) in settled.iter().zip(&after) {
                    proptest::prop_assert!(b == a || *b == Some(left));
                }
            }
        }
    }

    #[test]
    fn the_weights_do_not_depend_on_the_process() {
        // Pinned: every member in every process and version computes these.
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(weight(0, 0), 0);
        let members = ["a", "b", "c"];
        assert_eq!(target(6, &members, &[]), target(6, &members, &[]));
    }
}
