//! Fencing for resources outside the leases' database: the resource keeps
//! the highest token it has accepted and refuses any lower one (the
//! separate-resource model). `pglease.admit` keeps that mark in
//! the database; [`HighWaterMark`] keeps it in the resource's own process.
//!
//! What this model cannot detect: a holder whose lease has expired but
//! whose token is still the highest the resource has seen is accepted. Only
//! a newer token, once it has reached the resource, fences the old one out.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::token::Token;

/// The highest token a resource has accepted, for a service that fences
/// its writers itself (an HTTP service, a file store). Persist
/// [`HighWaterMark::highest`] with the data if the mark must survive a
/// restart: a mark that goes back to zero accepts stale tokens again.
#[derive(Debug, Default)]
pub struct HighWaterMark {
    highest: AtomicI64,
}

impl HighWaterMark {
    /// A mark that has seen no token.
    pub fn new() -> Self {
        Self::default()
    }

    /// A mark restored from storage.
    pub fn starting_at(highest: i64) -> Self {
        HighWaterMark {
            highest: AtomicI64::new(highest),
        }
    }

    /// Accepts `token` iff it is at least the highest seen, and records it:
    /// the same rule as `pglease.admit`. Safe to call from many threads.
    pub fn admit(&self, token: Token) -> bool {
        let token = token.get();
        self.highest
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |highest| {
                (token >= highest).then_some(token)
            })
            .is_ok()
    }

    /// The highest token accepted so far.
    pub fn highest(&self) -> i64 {
        self.highest.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(token: i64) -> Token {
        Token::issued(token)
    }

    #[test]
    fn admits_equal_and_higher_tokens_only() {
        let mark = HighWaterMark::new();
        assert!(mark.admit(t(5)));
        assert!(
            mark.admit(t(5)),
            "the holder of the highest token keeps writing"
        );
        assert!(!mark.admit(t(4)), "a lower token is stale");
        assert!(mark.admit(t(9)));
        assert!(!mark.admit(t(5)));
        assert_eq!(mark.highest(), 9);
        assert!(!HighWaterMark::starting_at(9).admit(t(8)));
    }
}
