//! The scenario engine's judgement, as pure functions: no database.

use std::time::Duration;

use pglease_scenarios::engine::{
    Judgement, Row, Scenario, Seen, Violation, judge, stale_after_new, two_holders,
};

fn rows(writers: &[(i64, &str)]) -> Vec<Row> {
    writers
        .iter()
        .map(|(seq, w)| Row {
            seq: *seq,
            writer: (*w).to_owned(),
        })
        .collect()
}

const MS: Duration = Duration::from_millis(1);

async fn a_row_committed_after_b_took_over_is_stale_whatever_its_place() {
    // A inserted first (seq 1) but committed after B took over: stale.
    assert!(stale_after_new(
        true,
        &rows(&[]),
        &rows(&[(1, "A"), (2, "B")])
    ));
    // A committed after B, in insertion order too.
    assert!(stale_after_new(
        true,
        &rows(&[]),
        &rows(&[(1, "B"), (2, "A")])
    ));
    // A's row was there when B took over: the holder's, not stale.
    assert!(!stale_after_new(
        true,
        &rows(&[(1, "A")]),
        &rows(&[(1, "A"), (2, "B")])
    ));
    // One row there before, another after: stale.
    assert!(stale_after_new(
        true,
        &rows(&[(1, "A")]),
        &rows(&[(1, "A"), (2, "B"), (3, "A")])
    ));
    // Nobody took over: A's writes are the holder's.
    assert!(!stale_after_new(false, &rows(&[]), &rows(&[(1, "A")])));
    // Only B's row: nothing stale.
    assert!(!stale_after_new(true, &rows(&[]), &rows(&[(1, "B")])));
}

async fn two_holders_when_b_holds_before_a_is_told() {
    assert!(two_holders(Some(5 * MS), None));
    assert!(two_holders(Some(5 * MS), Some(6 * MS)));
    assert!(!two_holders(Some(5 * MS), Some(5 * MS)));
    assert!(!two_holders(Some(5 * MS), Some(4 * MS)));
    assert!(!two_holders(None, None));
    assert!(!two_holders(None, Some(MS)));
}

async fn each_scenario_is_judged_by_its_property() {
    let stale = Seen {
        took_over: Some(MS),
        rows: rows(&[(1, "B"), (2, "A")]),
        ..Seen::default()
    };
    for s in [Scenario::PausedHolder, Scenario::KilledConnection] {
        assert_eq!(judge(s, &stale), Judgement::Violated(Violation::StaleWrite));
    }
    // A dead holder writes nothing: only liveness is measured.
    assert_eq!(judge(Scenario::DeadHolder, &stale), Judgement::Safe);
    // Untold while B held: two holders comes first.
    for s in [Scenario::LateRelease, Scenario::SilentRenewal] {
        assert_eq!(judge(s, &stale), Judgement::Violated(Violation::TwoHolders));
    }
    // Told first, then B took over, and A's new work was refused.
    let told = Seen {
        took_over: Some(10 * MS),
        told: Some(2 * MS),
        rows: rows(&[(1, "B")]),
        ..Seen::default()
    };
    for s in [Scenario::LateRelease, Scenario::SilentRenewal] {
        assert_eq!(judge(s, &told), Judgement::Safe);
    }
    // Told first, but A wrote all the same after B took over: stale.
    let told_but_wrote = Seen {
        rows: rows(&[(1, "B"), (2, "A")]),
        ..told.clone()
    };
    for s in [Scenario::LateRelease, Scenario::SilentRenewal] {
        assert_eq!(
            judge(s, &told_but_wrote),
            Judgement::Violated(Violation::StaleWrite)
        );
    }
    // Nobody took over: whatever A wrote is the holder's.
    let alone = Seen {
        rows: rows(&[(1, "A"), (2, "A")]),
        ..Seen::default()
    };
    for s in Scenario::ALL {
        assert_eq!(judge(s, &alone), Judgement::Safe);
    }
    assert!(Judgement::NotApplicable("x").is_safe());
    assert!(!Judgement::Violated(Violation::TwoHolders).is_safe());
    assert_eq!(told.value(), "B");
    assert_eq!(Seen::default().value(), "initial");
}

async fn one_lettering() {
    let letters: Vec<char> = Scenario::ALL.iter().map(|s| s.letter()).collect();
    assert_eq!(letters, ['a', 'b', 'c', 'd', 'e']);
    for s in Scenario::ALL {
        assert!(
            s.label().starts_with(&format!("({}) ", s.letter())),
            "{s:?}"
        );
    }
}

pglease_formations::tests![
    a_row_committed_after_b_took_over_is_stale_whatever_its_place,
    two_holders_when_b_holds_before_a_is_told,
    each_scenario_is_judged_by_its_property,
    one_lettering,
];
