//! Lease groups (`LeaseManager::join`, SQL `pglease.join_group` and the
//! functions beside it): members share a group's partitions evenly, a
//! join moves only the newcomer's share, and only to it, a revoked owner
//! gets its grace and is fenced when it overruns it, a leave (or a
//! dropped member) hands the leaver's partitions over under new tokens,
//! and only the roles that may use the group's names
//! act in it. Deaths (a member killed or frozen) are tested with member
//! processes in `group_churn.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::Row;
use tokio::time::Instant;

use pglease::{Error, GroupEvent, GroupMember, GroupOptions, HeldLease, LeaseManager, Revoke};

use crate::common::{TestDb, fence, sqlstate_of};

const TTL: Duration = Duration::from_secs(2);
const SETTLE: Duration = Duration::from_secs(10);

/// What one member owns, kept up to date from its events.
struct Tracked {
    member: GroupMember,
    owned: BTreeMap<u32, HeldLease>,
    /// Revokes kept unanswered (`answer` false).
    pending: Vec<Revoke>,
    answer: bool,
    /// Its own manager, where a test counts its statements.
    manager: Option<LeaseManager>,
}

impl Tracked {
    async fn join(m: &LeaseManager, name: &str, options: GroupOptions) -> Tracked {
        let member = m
            .join("orders", options.member(name))
            .await
            .expect("join");
        Tracked {
            member,
            owned: BTreeMap::new(),
            pending: Vec::new(),
            answer: true,
            manager: None,
        }
    }

    fn apply(&mut self, event: GroupEvent) {
        match event {
            GroupEvent::Assigned { partition, lease } => {
                assert!(
                    self.owned.insert(partition, lease).is_none(),
                    "assigned twice"
                );
            }
            GroupEvent::Revoking(revoke) => {
                self.owned.remove(&revoke.partition());
                if self.answer {
                    revoke.done();
                } else {
                    self.pending.push(revoke);
                }
            }
            GroupEvent::Lost { partition, .. } => {
                self.owned.remove(&partition);
            }
            _ => {}
        }
    }

    fn tokens(&self) -> BTreeMap<u32, i64> {
        self.owned.iter().map(|(k, l)| (*k, l.token().get())).collect()
    }
}

/// Applies the events each member has ready (waiting up to 10 ms each).
async fn pump(members: &mut [&mut Tracked]) {
    for t in members.iter_mut() {
        if let Ok(Some(event)) =
            tokio::time::timeout(Duration::from_millis(10), t.member.next_event()).await
        {
            t.apply(event);
        }
    }
}

/// Reads every member's events until `done` holds of the partitions
/// each owns.
async fn until_owned(
    members: &mut [&mut Tracked],
    what: &str,
    done: impl Fn(&[Vec<u32>]) -> bool,
) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let owned: Vec<Vec<u32>> = members.iter().map(|t| t.owned.keys().copied().collect()).collect();
        if done(&owned) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not within {SETTLE:?}: {owned:?}");
        pump(members).await;
    }
}

/// Reads every member's events until `done(counts)`.
async fn until(members: &mut [&mut Tracked], what: &str, done: impl Fn(&[usize]) -> bool) {
    until_owned(members, what, |owned| {
        done(&owned.iter().map(Vec::len).collect::<Vec<_>>())
    })
    .await;
}

/// Reads every member's events until they own exactly partitions 0 to
/// `partitions` - 1, each member its share.
async fn until_shared(members: &mut [&mut Tracked], what: &str, partitions: usize) {
    let balanced = balanced(partitions);
    until_owned(members, what, |owned| {
        let mut all: Vec<u32> = owned.concat();
        all.sort_unstable();
        all == (0..partitions as u32).collect::<Vec<_>>()
            && balanced(&owned.iter().map(Vec::len).collect::<Vec<_>>())
    })
    .await;
}

/// Every one of `partitions` owned, each member its share.
fn balanced(partitions: usize) -> impl Fn(&[usize]) -> bool {
    move |counts| {
        let n = counts.len();
        counts.iter().sum::<usize>() == partitions
            && counts
                .iter()
                .all(|&c| c == partitions / n || c == partitions.div_ceil(n))
    }
}

async fn members_share_partitions_evenly_and_a_join_moves_only_to_the_newcomer() {
    let db = TestDb::new().await;
    let options = GroupOptions::partitions(16).ttl(TTL);
    let (ma, mb, mc, md) = (db.manager(), db.manager(), db.manager(), db.manager());
    let mut a = Tracked::join(&ma, "a", options.clone()).await;
    let mut b = Tracked::join(&mb, "b", options.clone()).await;
    let mut c = Tracked::join(&mc, "c", options.clone()).await;
    until(&mut [&mut a, &mut b, &mut c], "three members", balanced(16)).await;
    let status = ma.group("orders").await.expect("the group");
    assert_eq!(status.partitions, 16);
    assert_eq!(status.members.len(), 3);
    assert!(status.owners.iter().all(Option::is_some), "every partition owned");
    let before: BTreeMap<u32, i64> = [&a, &b, &c].iter().flat_map(|t| t.tokens()).collect();

    let mut d = Tracked::join(&md, "d", options.clone()).await;
    let joined = Instant::now();
    until(&mut [&mut a, &mut b, &mut c, &mut d], "a fourth member", balanced(16)).await;
    println!("a join settled in {:?}", joined.elapsed());
    // Only the newcomer's share moved, and only to it, under new tokens.
    assert_eq!(d.owned.len(), 4);
    for t in [&a, &b, &c] {
        for (k, token) in t.tokens() {
            assert_eq!(before[&k], token, "partition {k} stayed with its owner");
        }
    }
    for (k, token) in d.tokens() {
        assert!(token > before[&k], "partition {k}: a new token");
        let stale = ma
            .begin_fenced(fence(&pglease::partition_name("orders", k), before[&k]))
            .await;
        assert!(
            matches!(stale, Err(Error::NotHeld { .. })),
            "the old owner's token is refused: {stale:?}"
        );
    }
    // Each partition lease is an ordinary lease.
    let row = sqlx::query("SELECT holder, token FROM pglease.status WHERE name = 'orders/0'")
        .fetch_one(db.pool())
        .await
        .expect("status of a partition");
    let holder: String = row.get("holder");
    assert!(["a", "b", "c", "d"].contains(&holder.as_str()));
}

/// The owner keeps its write open and does not answer the revoke: the
/// partition moves at the grace's end anyway, and the open write can no
/// longer commit. An owner that answers at once hands over at once.
async fn a_revoked_owner_gets_its_grace_and_is_fenced_when_it_overruns_it() {
    let db = TestDb::new().await;
    sqlx::raw_sql("CREATE TABLE w (k integer, token bigint)")
        .execute(db.pool())
        .await
        .expect("a table");
    let grace = Duration::from_millis(800);
    let options = GroupOptions::partitions(2).ttl(TTL).grace(grace);
    let (ma, mb) = (db.manager(), db.manager());
    let mut a = Tracked::join(&ma, "a", options.clone()).await;
    until(&mut [&mut a], "a alone", |c| c == [2]).await;
    a.answer = false;
    // A write in flight on each partition.
    let mut open = Vec::new();
    for lease in a.owned.values() {
        let mut tx = lease.begin_fenced().await.expect("a fenced write");
        sqlx::query("INSERT INTO w VALUES (0, $1)")
            .bind(lease.token())
            .execute(&mut *tx)
            .await
            .expect("the write");
        open.push(tx);
    }
    let before = a.tokens();
    let mut b = Tracked::join(&mb, "b", options.clone()).await;
    let joined = Instant::now();
    until(&mut [&mut a, &mut b], "the newcomer's share", |c| c == [1, 1]).await;
    let took = joined.elapsed();
    println!("moved after {took:?} with a grace of {grace:?}");
    assert!(took >= grace, "not before the grace ended: {took:?}");
    assert_eq!(a.pending.len(), 1, "one revoke, unanswered");
    // The write on the moved partition cannot commit; the other can.
    let moved = *b.owned.keys().next().expect("b owns one");
    let mut outcomes = Vec::new();
    for tx in open {
        outcomes.push(tx.commit().await.is_ok());
    }
    let kept = *a.owned.keys().next().expect("a keeps one");
    let committed: Vec<i64> = sqlx::query_scalar("SELECT token FROM w")
        .fetch_all(db.pool())
        .await
        .expect("the writes");
    assert_eq!(outcomes.iter().filter(|ok| **ok).count(), 1, "{outcomes:?}");
    assert_eq!(committed, vec![a.owned[&kept].token().get()]);
    assert!(b.owned[&moved].token().get() > before[&moved], "a new token");

}

/// A leave hands every partition over under a new token; the leaver's
/// tokens are refused from then on; the history names the successor.
async fn a_graceful_leave_hands_the_partitions_over_under_new_tokens() {
    let db = TestDb::new().await;
    let options = GroupOptions::partitions(6).ttl(TTL);
    let (ma, mb) = (db.manager(), db.manager());
    let mut a = Tracked::join(&ma, "a", options.clone()).await;
    let mut b = Tracked::join(&mb, "b", options.clone()).await;
    until(&mut [&mut a, &mut b], "two members", balanced(6)).await;
    let old = a.tokens();
    let Tracked { member, .. } = a;
    let left = Instant::now();
    member.leave().await.expect("leave");
    until(&mut [&mut b], "all to b", |c| c == [6]).await;
    println!("a leave of {} partitions settled in {:?}", old.len(), left.elapsed());
    let new = b.tokens();
    for (k, token) in &old {
        assert!(new[k] > *token, "partition {k}: a new token");
        let stale = ma
            .begin_fenced(fence(&pglease::partition_name("orders", *k), *token))
            .await;
        assert!(matches!(stale, Err(Error::NotHeld { .. })), "{stale:?}");
        let detail: String = sqlx::query_scalar(
            "SELECT detail FROM pglease.history WHERE name = $1 AND token = $2 AND event = 'released'",
        )
        .bind(pglease::partition_name("orders", *k))
        .bind(token)
        .fetch_one(db.pool())
        .await
        .expect("the history");
        assert_eq!(detail, "handed over to b");
    }
    let status = mb.group("orders").await.expect("the group");
    assert_eq!(
        status.members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
        ["b"]
    );
    let summary = mb.admin().groups().await.expect("the groups");
    assert_eq!(summary.len(), 1);
    assert_eq!((summary[0].members, summary[0].owned), (1, 6));
    let diagnosis = mb
        .admin()
        .doctor(&pglease::doctor::DoctorOptions::default())
        .await
        .expect("doctor");
    let groups: Vec<_> = diagnosis.checks.iter().filter(|c| c.name == "group").collect();
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0].verdict, pglease::doctor::Verdict::Ok, "{groups:?}");
    assert!(groups[0].detail.contains("6 partitions, 1 live members, 6 owned"), "{groups:?}");

    // A member dropped leaves too: its partitions go back to b.
    let mut c = Tracked::join(&ma, "c", options.clone()).await;
    until(&mut [&mut b, &mut c], "b and c", balanced(6)).await;
    drop(c);
    until(&mut [&mut b], "all to b again", |n| n == [6]).await;
}

/// A settled group costs each member, per second, about one renewal
/// statement per renewal period and one members-only read of the group
/// per membership period (counted by each member's manager over a stable
/// stretch of five members).
async fn a_settled_group_costs_each_member_a_bounded_number_of_statements() {
    let db = TestDb::new().await;
    let options = GroupOptions::partitions(16).ttl(TTL);
    let mut members = Vec::new();
    for name in ["a", "b", "c", "d", "e"] {
        let m = db.manager_with(name, Default::default()).await;
        members.push(Tracked::join(&m, name, options.clone()).await);
        members.last_mut().expect("just pushed").manager = Some(m);
    }
    {
        let mut tracked: Vec<&mut Tracked> = members.iter_mut().collect();
        until(&mut tracked, "five members", balanced(16)).await;
    }
    let stats = |members: &Vec<Tracked>| {
        members
            .iter()
            .map(|t| t.manager.as_ref().expect("a manager").stats())
            .fold((0, 0), |(g, r), s| (g + s.group_statements, r + s.renewal_statements))
    };
    let first = stats(&members);
    let stretch = Duration::from_secs(6);
    let started = Instant::now();
    {
        let mut tracked: Vec<&mut Tracked> = members.iter_mut().collect();
        while started.elapsed() < stretch {
            pump(&mut tracked).await;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let last = stats(&members);
    let per_member = |n: u64| n as f64 / 5.0 / seconds;
    let (group, renewals) = (per_member(last.0 - first.0), per_member(last.1 - first.1));
    println!(
        "figures: a settled group of 5 members and 16 partitions (TTL {TTL:?}), per member per \
         second: {group:.2} group statements (reads), {renewals:.2} renewal statements"
    );
    // Renewals: one statement per renewal period (a third of the TTL);
    // reads: one per membership period (the soonest other member's
    // expiry, at least two thirds of the TTL away); each with room for
    // one more in the stretch.
    let period = TTL.as_secs_f64() / 3.0;
    assert!(
        renewals > 0.0 && renewals <= 1.0 / period + 1.0 / seconds,
        "renewals {renewals:.2}/s"
    );
    assert!(group <= 1.0 / (2.0 * period) + 1.0 / seconds, "reads {group:.2}/s");
}

/// The partition count changes under live members: they release the
/// partitions beyond a smaller count and share out a larger one; only the
/// role that created the group (or an administrator) changes it.
async fn a_changed_partition_count_is_shared_out_by_the_live_members() {
    let db = TestDb::new().await;
    let options = GroupOptions::partitions(8).ttl(TTL);
    let (ma, mb) = (db.manager(), db.manager());
    let mut a = Tracked::join(&ma, "a", options.clone()).await;
    let mut b = Tracked::join(&mb, "b", options.clone()).await;
    until(&mut [&mut a, &mut b], "8 over two", balanced(8)).await;
    assert_eq!(ma.admin().set_group_partitions("orders", 5).await.expect("shrink"), 8);
    until_shared(&mut [&mut a, &mut b], "5 over two", 5).await;
    assert_eq!(ma.admin().set_group_partitions("orders", 12).await.expect("grow"), 5);
    until_shared(&mut [&mut a, &mut b], "12 over two", 12).await;
    let status = ma.group("orders").await.expect("the group");
    assert_eq!(status.partitions, 12);
    assert!(status.owners.iter().all(Option::is_some));
    // A member joining now joins with the new count.
    let c = mb.join("orders", GroupOptions::partitions(12).ttl(TTL).member("c")).await;
    assert!(c.is_ok(), "{c:?}");
    let refused = ma.admin().set_group_partitions("orders", 0).await;
    assert!(
        matches!(refused, Err(Error::InvalidInput { argument: "partitions", .. })),
        "{refused:?}"
    );
    let missing = ma.admin().set_group_partitions("nothing", 3).await;
    assert!(matches!(missing, Err(Error::InvalidInput { .. })), "{missing:?}");
}

/// Authority: a role outside the group's name grant cannot join, read or
/// hand over; a membership token must be valid to take partitions; the
/// same member cannot join twice; bad input is refused before anything
/// is sent.
async fn only_permitted_roles_act_in_a_group_and_bad_input_is_refused() {
    let db = TestDb::new().await;
    let roles = db.login_roles(&["owner", "other"], &[]).await;
    sqlx::query("SELECT pglease.grant_names('orders', $1)")
        .bind(&roles[0])
        .execute(db.pool())
        .await
        .expect("grant the group's names");
    let owner = db.manager_as(&roles[0], Default::default()).await;
    let other = db.manager_as(&roles[1], Default::default()).await;
    let options = GroupOptions::partitions(4).ttl(TTL);
    let mut a = Tracked::join(&owner, "a", options.clone()).await;
    until(&mut [&mut a], "a alone", |c| c == [4]).await;

    let refused = other.join("orders", options.clone().member("x")).await;
    assert!(matches!(refused, Err(Error::NotPermitted { .. })), "{refused:?}");
    let refused = other.group("orders").await;
    assert!(matches!(refused, Err(Error::NotPermitted { .. })), "{refused:?}");
    let mut conn = db.connect_as(&roles[1]).await;
    let (k, lease) = a.owned.iter().next().expect("a partition");
    let sql = format!(
        "SELECT pglease.hand_over_partition('orders', {k}, {}, 'x', '2 s')",
        lease.token()
    );
    assert_eq!(sqlstate_of(&mut conn, &sql).await.as_deref(), Some("42501"));
    assert_eq!(
        sqlstate_of(&mut conn, "SELECT pglease.set_group_partitions('orders', 9)")
            .await
            .as_deref(),
        Some("42501")
    );
    let mut as_owner = db.connect_as(&roles[0]).await;
    let sql = "SELECT * FROM pglease.take_partitions('orders', 'a', 999999, '{0}', '2 s')";
    assert_eq!(sqlstate_of(&mut as_owner, sql).await.as_deref(), Some("LE001"));

    // The same member again, while it is live.
    let twice = owner.join("orders", options.clone().member("a")).await;
    assert!(matches!(twice, Err(Error::Held { .. })), "{twice:?}");
    // A partition count other than the group's.
    let other_count = owner
        .join("orders", GroupOptions::partitions(5).ttl(TTL).member("b"))
        .await;
    assert!(
        matches!(&other_count, Err(Error::InvalidInput { argument: "partitions", .. })),
        "{other_count:?}"
    );
    // Refused before anything is sent.
    let statements = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pglease._members")
            .fetch_one(db.pool())
            .await
            .expect("count")
    };
    let members = statements().await;
    for (options, argument) in [
        (GroupOptions::partitions(0), "partitions"),
        (GroupOptions::partitions(pglease::limits::MAX_PARTITIONS + 1), "partitions"),
        (GroupOptions::partitions(4).member(""), "member"),
        (GroupOptions::partitions(4).ttl(Duration::ZERO), "ttl"),
        (GroupOptions::partitions(4).member("x".repeat(250)), "group"),
    ] {
        let refused = owner.join("orders", options).await;
        assert!(
            matches!(&refused, Err(Error::InvalidInput { argument: a, .. }) if *a == argument),
            "{argument}: {refused:?}"
        );
    }
    let refused = owner.join("", GroupOptions::partitions(4)).await;
    assert!(matches!(refused, Err(Error::InvalidInput { argument: "group", .. })), "{refused:?}");
    assert_eq!(statements().await, members, "nothing written");
}

pglease_formations::tests![
    members_share_partitions_evenly_and_a_join_moves_only_to_the_newcomer,
    a_revoked_owner_gets_its_grace_and_is_fenced_when_it_overruns_it,
    a_graceful_leave_hands_the_partitions_over_under_new_tokens,
    a_settled_group_costs_each_member_a_bounded_number_of_statements,
    a_changed_partition_count_is_shared_out_by_the_live_members,
    only_permitted_roles_act_in_a_group_and_bad_input_is_refused,
];
