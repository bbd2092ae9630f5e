//! The renewal registry's planning and applying, at chosen instants: no
//! database, no sleeping.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;

use super::registry::{Key, Registry, Renewed};
use super::state::HeldState;
use crate::error::{Error, LossReason};
use crate::lease::{Lease, interval};
use crate::options::ManagerOptions;
use crate::token::Token;

const TTL: Duration = Duration::from_secs(30);

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// A lease of TTL 30 s (renewed every 10 s, deadline at 29.4 s, loss fired
/// at 29.15 s) acquired by a statement sent at `sent`.
fn held(name: &str, token: i64, sent: Instant) -> Arc<HeldState> {
    let timing = ManagerOptions::default().timing(TTL).expect("timing");
    let lease = Lease::new(
        name,
        "h".into(),
        Token::issued(token),
        Utc::now(),
        Utc::now(),
    );
    Arc::new(HeldState::new(
        lease,
        sent,
        timing,
        interval(TTL).expect("ttl"),
    ))
}

fn key(name: &str, token: i64) -> Key {
    (name.to_owned(), token)
}

fn confirmed(name: &str, token: i64) -> Renewed {
    Renewed {
        name: name.to_owned(),
        token,
        expires_at: Some(Utc::now()),
        current_token: None,
        current_holder: None,
        session_ended: false,
        forgotten_in: None,
    }
}

fn refused(name: &str, token: i64, current: i64, holder: Option<&str>) -> Renewed {
    Renewed {
        name: name.to_owned(),
        token,
        expires_at: None,
        current_token: Some(current),
        current_holder: holder.map(str::to_owned),
        session_ended: false,
        forgotten_in: None,
    }
}

fn sorted(mut keys: Vec<Key>) -> Vec<Key> {
    keys.sort();
    keys
}

#[test]
fn nothing_is_sent_before_a_lease_is_due_and_near_ones_go_along() {
    let t0 = Instant::now();
    let registry = Registry::new();
    registry.insert(held("a", 1, t0), t0 + secs(10.0));
    registry.insert(held("b", 1, t0), t0 + secs(14.0));
    registry.insert(held("c", 1, t0), t0 + secs(16.0));

    let plan = registry.schedule(t0 + secs(1.0), true);
    assert!(plan.batch.is_none() && plan.given_up.is_empty());
    assert_eq!(plan.wake, Some(t0 + secs(10.0)));

    // At 10 s "a" is due; "b" (due within half a period) goes along.
    let plan = registry.schedule(t0 + secs(10.0), true);
    let batch = plan.batch.expect("a batch");
    assert_eq!(sorted(batch.keys), vec![key("a", 1), key("b", 1)]);
    assert_eq!(batch.ttls.len(), 2);
    assert_eq!(plan.wake, Some(t0 + secs(16.0)));
    // The statement must give up before the first loss anywhere.
    assert_eq!(batch.first_fire_at, t0 + secs(29.15));

    // In flight: not sent again.
    let plan = registry.schedule(t0 + secs(10.5), true);
    assert!(plan.batch.is_none());
}

#[test]
fn many_leases_go_in_bounded_statements_the_soonest_due_first() {
    use super::registry::MAX_RENEW_BATCH;
    let t0 = Instant::now();
    let registry = Registry::new();
    let n = MAX_RENEW_BATCH * 2 + 1;
    // Lease i is due at 10 s + i µs: lease 0 first.
    for i in 0..n {
        let name = format!("l{i}");
        registry.insert(
            held(&name, 1, t0),
            t0 + secs(10.0) + Duration::from_micros(i as u64),
        );
    }
    let at = t0 + secs(10.1);
    let mut sent = Vec::new();
    for statement in 0..3 {
        let batch = registry.schedule(at, true).batch.expect("due");
        let expected = if statement < 2 { MAX_RENEW_BATCH } else { 1 };
        assert_eq!(batch.keys.len(), expected, "statement {statement}");
        assert_eq!(batch.ttls.len(), expected);
        let rows = batch
            .keys
            .iter()
            .map(|(name, token)| confirmed(name, *token))
            .collect();
        registry.apply(&batch.keys, at, Ok(rows), at);
        sent.push(batch.keys);
    }
    // Each statement took the 5,000 due soonest of those left.
    for (statement, keys) in sent.iter().enumerate() {
        let mut numbers: Vec<usize> = keys
            .iter()
            .map(|(name, _)| name[1..].parse().expect("a number"))
            .collect();
        numbers.sort_unstable();
        let first = statement * MAX_RENEW_BATCH;
        assert_eq!(numbers, (first..first + keys.len()).collect::<Vec<_>>());
    }
    // Every lease went once.
    assert_eq!(sent.iter().map(Vec::len).sum::<usize>(), n);
    assert!(registry.schedule(at, true).batch.is_none());
}

#[test]
fn leases_left_for_later_statements_are_skipped_when_gone_and_deadlines_still_fire() {
    use super::registry::MAX_RENEW_BATCH;
    let t0 = Instant::now();
    let registry = Registry::new();
    let n = MAX_RENEW_BATCH + 3;
    let mut states = Vec::new();
    for i in 0..n {
        let state = held(&format!("l{i}"), 1, t0);
        states.push(Arc::clone(&state));
        registry.insert(state, t0 + secs(10.0) + Duration::from_micros(i as u64));
    }
    let at = t0 + secs(10.1);
    let first = registry.schedule(at, true).batch.expect("due");
    assert_eq!(first.keys.len(), MAX_RENEW_BATCH);
    // Of the three left, one is released and one lost meanwhile.
    registry.forget(&states[MAX_RENEW_BATCH].lease);
    states[MAX_RENEW_BATCH + 1].fire(LossReason::Released, at);
    let rows = first
        .keys
        .iter()
        .map(|(name, token)| confirmed(name, *token))
        .collect();
    registry.apply(&first.keys, at, Ok(rows), at);
    let second = registry.schedule(at, true).batch.expect("the one left");
    assert_eq!(
        second.keys,
        vec![key(&format!("l{}", MAX_RENEW_BATCH + 2), 1)]
    );
    // Unanswered until past the earliest deadline of the leases not in
    // it (29.15 s, never renewed): they are lost, not planned from the
    // leftovers.
    let late = t0 + secs(29.2);
    let plan = registry.schedule(late, false);
    assert!(plan.batch.is_none());
    assert!(!plan.given_up.is_empty());
}

#[test]
fn a_lease_added_wakes_the_renewal_task_only_if_due_before_its_next_plan() {
    let t0 = Instant::now();
    let registry = Registry::new();
    // Nothing planned yet: wake.
    assert!(registry.insert(held("a", 1, t0), t0 + secs(10.0)));
    let plan = registry.schedule(t0 + secs(1.0), true);
    assert_eq!(plan.wake, Some(t0 + secs(10.0)));
    // Due later than the planned look: no wake-up; due sooner: wake-up.
    assert!(!registry.insert(held("b", 1, t0), t0 + secs(12.0)));
    assert!(registry.insert(held("c", 1, t0), t0 + secs(5.0)));
    // With a statement in flight the task plans again when it is answered.
    let plan = registry.schedule(t0 + secs(10.0), true);
    assert!(plan.batch.is_some());
    assert!(!registry.insert(held("d", 1, t0), t0 + secs(20.0)));
}

#[test]
fn a_confirmed_renewal_moves_the_deadline_from_its_send() {
    let t0 = Instant::now();
    let registry = Registry::new();
    let state = held("a", 7, t0);
    registry.insert(Arc::clone(&state), t0 + secs(10.0));
    let sent = t0 + secs(10.0);
    let keys = registry.schedule(sent, true).batch.expect("due").keys;

    let applied = registry.apply(&keys, sent, Ok(vec![confirmed("a", 7)]), sent + secs(0.2));
    assert_eq!(applied.renewed, 1);
    assert!(!applied.failed);
    assert_eq!(state.view.borrow().deadline, sent + secs(29.4));
    // Next renewal a period after the send, not after the answer.
    let plan = registry.schedule(sent + secs(1.0), true);
    assert!(plan.batch.is_none());
    assert_eq!(plan.wake, Some(sent + secs(10.0)));
}

#[test]
fn a_failed_statement_is_retried_soon_and_its_error_becomes_the_reason() {
    let t0 = Instant::now();
    let registry = Registry::new();
    let state = held("a", 1, t0);
    registry.insert(Arc::clone(&state), t0 + secs(10.0));
    let sent = t0 + secs(10.0);
    let keys = registry.schedule(sent, true).batch.expect("due").keys;
    let error = Arc::new(Error::ShutDown);
    let failed_at = sent + secs(1.0);
    let applied = registry.apply(&keys, sent, Err(Arc::clone(&error)), failed_at);
    assert!(applied.failed);

    // Retried within a quarter period (2.5 s), with jitter.
    let plan = registry.schedule(failed_at, true);
    let retry = plan.wake.expect("a retry");
    assert!(
        retry > failed_at && retry <= failed_at + secs(2.5),
        "{retry:?}"
    );
    assert!(registry.schedule(retry, true).batch.is_some());

    // No answer after that, and the deadline comes: lost as unreachable,
    // with the last error, and given up for a background release.
    registry.apply(&keys, retry, Err(Arc::clone(&error)), retry + secs(0.1));
    let plan = registry.schedule(t0 + secs(29.15), true);
    assert_eq!(plan.given_up.len(), 1);
    assert_eq!(
        state.loss(),
        Some(LossReason::Unreachable {
            error: Arc::clone(&error)
        })
    );
    assert!(state.lost.is_cancelled());
    assert_eq!(registry.len(), 0);
}

#[test]
fn a_lease_never_renewed_expires_at_its_deadline_not_before() {
    let t0 = Instant::now();
    let registry = Registry::new();
    let state = held("a", 1, t0);
    // Its renewal is not due before the deadline (a paused task, say).
    registry.insert(Arc::clone(&state), t0 + secs(40.0));
    let plan = registry.schedule(t0 + secs(29.1), true);
    assert!(plan.given_up.is_empty() && state.loss().is_none());
    assert_eq!(plan.wake, Some(t0 + secs(29.15)));
    let plan = registry.schedule(t0 + secs(29.15), true);
    assert_eq!(plan.given_up.len(), 1);
    assert_eq!(state.loss(), Some(LossReason::Expired));
    assert_eq!(state.view.borrow().lost_at, Some(t0 + secs(29.15)));
}

#[test]
fn a_statement_hanging_for_others_makes_a_lease_unreachable() {
    let t0 = Instant::now();
    let registry = Registry::new();
    let state = held("a", 1, t0);
    registry.insert(Arc::clone(&state), t0 + secs(40.0));
    let plan = registry.schedule(t0 + secs(29.2), false);
    assert!(plan.batch.is_none());
    match state.loss() {
        Some(LossReason::Unreachable { error }) => {
            assert!(
                matches!(*error, Error::Timeout { after: None, .. }),
                "{error}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_renewal_in_flight_at_the_deadline_is_reported_as_timed_out() {
    let t0 = Instant::now();
    let registry = Registry::new();
    let state = held("a", 1, t0);
    registry.insert(Arc::clone(&state), t0 + secs(10.0));
    assert!(registry.schedule(t0 + secs(10.0), true).batch.is_some());
    registry.schedule(t0 + secs(29.15), false);
    match state.loss() {
        Some(LossReason::Unreachable { error }) => assert!(
            matches!(*error, Error::Timeout { after: Some(after), .. } if after == secs(19.15)),
            "{error}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn refusals_say_taken_over_or_released_and_are_not_released_again() {
    let t0 = Instant::now();
    let registry = Registry::new();
    let (a, b, c) = (held("a", 3, t0), held("b", 5, t0), held("c", 1, t0));
    for state in [&a, &b, &c] {
        registry.insert(Arc::clone(state), t0 + secs(10.0));
    }
    let sent = t0 + secs(10.0);
    let keys = registry.schedule(sent, true).batch.expect("due").keys;
    let rows = vec![
        confirmed("c", 1),
        refused("a", 3, 4, Some("other")),
        refused("b", 5, 5, None),
    ];
    let applied = registry.apply(&keys, sent, Ok(rows), sent + secs(0.1));
    assert_eq!(applied.renewed, 1);
    assert_eq!(
        a.loss(),
        Some(LossReason::Stale {
            current_token: Some(Token::issued(4)),
            current_holder: Some("other".into()),
        })
    );
    assert_eq!(b.loss(), Some(LossReason::Released));
    assert_eq!(c.loss(), None);
    assert_eq!(registry.len(), 1);
    // The database no longer accepts them: nothing to release.
    assert!(
        registry
            .schedule(sent + secs(0.2), true)
            .given_up
            .is_empty()
    );
}

#[test]
fn a_lease_whose_row_is_missing_is_sent_again() {
    let t0 = Instant::now();
    let registry = Registry::new();
    registry.insert(held("a", 1, t0), t0 + secs(10.0));
    let sent = t0 + secs(10.0);
    let keys = registry.schedule(sent, true).batch.expect("due").keys;
    registry.apply(&keys, sent, Ok(Vec::new()), sent + secs(0.1));
    let batch = registry
        .schedule(sent + secs(0.2), true)
        .batch
        .expect("again");
    assert_eq!(batch.keys, vec![key("a", 1)]);
}

#[test]
fn a_holder_that_saw_its_deadline_is_dropped_and_given_up() {
    let t0 = Instant::now();
    let registry = Registry::new();
    let state = held("a", 1, t0);
    registry.insert(Arc::clone(&state), t0 + secs(40.0));
    // The holder's own check fires the loss first.
    assert_eq!(state.loss_by(t0 + secs(29.3)), Some(LossReason::Expired));
    let plan = registry.schedule(t0 + secs(29.3), true);
    assert_eq!(plan.given_up.len(), 1);
    assert_eq!(registry.len(), 0);
    // A released lease is dropped without a release.
    let released = held("b", 1, t0);
    registry.insert(Arc::clone(&released), t0 + secs(40.0));
    released.fire(LossReason::Released, t0 + secs(1.0));
    assert!(registry.schedule(t0 + secs(1.0), true).given_up.is_empty());
    assert_eq!(registry.len(), 0);
}

#[test]
fn a_late_or_failed_renewal_starts_an_outage_once_and_a_confirmation_ends_it() {
    let t0 = Instant::now();
    let registry = Registry::new();
    let (a, b) = (held("a", 1, t0), held("b", 1, t0));
    registry.insert(Arc::clone(&a), t0 + secs(10.0));
    // Not due with a's statement: not in flight, so not late with it.
    registry.insert(Arc::clone(&b), t0 + secs(20.0));
    let sent = t0 + secs(10.0);
    let keys = registry.schedule(sent, true).batch.expect("due").keys;
    assert_eq!(keys, [key("a", 1)]);
    let error = Arc::new(Error::ShutDown);
    // Unanswered a second later: a counts as failing from then, b not.
    assert_eq!(registry.late(&error, sent + secs(1.0)), 1);
    assert!(a.view.borrow().failing.is_some());
    assert!(b.view.borrow().failing.is_none());
    // Late again, then failed: the same outage, not a new one.
    assert_eq!(registry.late(&error, sent + secs(1.5)), 0);
    let applied = registry.apply(&keys, sent, Err(Arc::clone(&error)), sent + secs(2.0));
    assert_eq!(applied.started_failing, 0);
    // Confirmed: over, with how long it lasted (from the first late look).
    let retry = sent + secs(3.0);
    let keys = registry.schedule(retry, true).batch.expect("a retry").keys;
    let applied = registry.apply(&keys, retry, Ok(vec![confirmed("a", 1)]), retry + secs(0.5));
    assert_eq!(applied.recovered, [secs(2.5)]);
    assert!(a.view.borrow().failing.is_none());
    assert!(a.loss().is_none());
}
