//! The scenario engine's judgement, as pure functions: no database.

use std::time::Duration;

use pglease_cli::compare::engine::{
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

async fn a_row_committed_after_bs_write_is_stale_whatever_its_place() {
    // A inserted first (seq 1) but committed after B's write: stale.
    assert!(stale_after_new(
        &rows(&[(2, "B")]),
        &rows(&[(1, "A"), (2, "B")])
    ));
    // A committed after B, in insertion order too.
    assert!(stale_after_new(
        &rows(&[(1, "B")]),
        &rows(&[(1, "B"), (2, "A")])
    ));
    // A's row was already there when B wrote: not stale.
    assert!(!stale_after_new(
        &rows(&[(1, "A"), (2, "B")]),
        &rows(&[(1, "A"), (2, "B")])
    ));
    // B never wrote: A's write is the holder's.
    assert!(!stale_after_new(&rows(&[]), &rows(&[(1, "A")])));
    // Only B's row: nothing stale.
    assert!(!stale_after_new(&rows(&[(1, "B")]), &rows(&[(1, "B")])));
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
        after_b: rows(&[(1, "B")]),
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
        after_b: rows(&[(1, "B")]),
        rows: rows(&[(1, "B")]),
        ..Seen::default()
    };
    assert_eq!(judge(Scenario::SilentRenewal, &told), Judgement::Safe);
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

tests![
    a_row_committed_after_bs_write_is_stale_whatever_its_place,
    two_holders_when_b_holds_before_a_is_told,
    each_scenario_is_judged_by_its_property,
    one_lettering,
];
