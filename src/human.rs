//! Durations as people read them in messages. A leaf: errors, checks and
//! connection messages all use it.

use std::time::Duration;

/// A duration as a person reads it in a message: `382 ms`, `1.5 s`,
/// `2 min 5 s`, `3 h 20 min`, `10 days` (rounded; `Debug` gave
/// `382.175464ms` and `864000s`).
pub(crate) struct Human(pub(crate) Duration);

impl std::fmt::Display for Human {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.0;
        let secs = d.as_secs();
        if d < Duration::from_millis(1) {
            write!(f, "{} µs", d.as_micros())
        } else if d < Duration::from_secs(10) && d.subsec_millis() != 0 && secs == 0 {
            write!(f, "{} ms", (d.as_secs_f64() * 1000.0).round())
        } else if secs < 60 {
            let tenths = (d.as_secs_f64() * 10.0).round() / 10.0;
            if tenths.fract() == 0.0 {
                write!(f, "{tenths:.0} s")
            } else {
                write!(f, "{tenths:.1} s")
            }
        } else if secs < 3600 {
            match secs % 60 {
                0 => write!(f, "{} min", secs / 60),
                s => write!(f, "{} min {s} s", secs / 60),
            }
        } else if secs < 86_400 {
            match secs % 3600 / 60 {
                0 => write!(f, "{} h", secs / 3600),
                m => write!(f, "{} h {m} min", secs / 3600),
            }
        } else if secs.is_multiple_of(86_400) {
            write!(f, "{} days", secs / 86_400)
        } else {
            write!(f, "{:.1} days", d.as_secs_f64() / 86_400.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_a_person_says_them() {
        let said = |d: Duration| Human(d).to_string();
        assert_eq!(said(Duration::from_nanos(1_500)), "1 µs");
        assert_eq!(said(Duration::from_nanos(382_175_464)), "382 ms");
        assert_eq!(said(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(said(Duration::from_secs(30)), "30 s");
        assert_eq!(said(Duration::from_secs(125)), "2 min 5 s");
        assert_eq!(said(Duration::from_secs(12_000)), "3 h 20 min");
        assert_eq!(said(Duration::from_secs(864_000)), "10 days");
        assert_eq!(said(Duration::from_secs(7 * 86_400)), "7 days");
    }
}
