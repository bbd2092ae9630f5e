//! Every statement the library sends, in one place. Each is one round trip
//! and at most one commit; the clock and lock each relies on are described
//! at the function it calls, in `migrations/`.

use crate::token::Token;

/// Acquire if free or expired. Database clock (`clock_timestamp()` after the
/// row lock); read-only when the lease is held; ends the sessions still
/// fenced on an ended lease; answers within about 2 s, with a note saying
/// why an ended lease could not be taken.
pub(crate) const ACQUIRE: &str = "SELECT token, expires_at, holder, checked_at, note \
     FROM pglease.acquire($1, $2, $3)";

/// Extend a valid lease; NULL when lost. Database clock at the row update.
pub(crate) const RENEW: &str = "SELECT pglease.renew($1, $2, $3)";

/// Renew many leases in one statement and one commit (the background
/// renewal tick). Database clock at each row update.
pub(crate) const RENEW_MANY: &str = "SELECT name, token, expires_at, renewed, current_token, \
     current_holder FROM pglease.renew_many($1, $2, $3)";

/// End a valid lease; false when it was not valid. Notifies
/// `pglease_release` when it ends one that a session watches.
pub(crate) const RELEASE: &str = "SELECT pglease.release($1, $2)";

/// On the listening connection: be notified when a lease is released
/// (false while a release of it is committing: try again).
pub(crate) const WATCH: &str = "SELECT pglease.watch($1)";

/// On the listening connection: undo one `WATCH`.
pub(crate) const UNWATCH: &str = "SELECT pglease.unwatch($1)";

/// Check a token inside a transaction and hold FOR KEY SHARE on the lease
/// row until the transaction ends.
pub(crate) const ASSERT_HELD: &str = "SELECT pglease.assert_held($1, $2)";

/// `BEGIN` and [`ASSERT_HELD`] as one simple query (one round trip). The
/// simple protocol takes no parameters, so the name goes in as an escape
/// string literal (`E'...'`, whose meaning does not depend on
/// `standard_conforming_strings`) and the token as a number.
pub(crate) fn begin_fenced(name: &str, token: Token) -> String {
    let mut statement = String::with_capacity(name.len() + 64);
    statement.push_str("BEGIN; SELECT pglease.assert_held(E'");
    for c in name.chars() {
        if matches!(c, '\\' | '\'') {
            statement.push('\\');
        }
        statement.push(c);
    }
    statement.push_str("', ");
    statement.push_str(&token.get().to_string());
    statement.push_str("::bigint)");
    statement
}

/// Separate-resource fencing: accept iff the token is the highest seen.
pub(crate) const ADVANCE: &str = "SELECT pglease.advance($1, $2)";

/// The status view's columns as `LeaseStatus` reads them.
macro_rules! status_select {
    ($rest:literal) => {
        concat!(
            "SELECT name, holder, token, expires_at, ",
            "(extract(epoch FROM remaining) * 1000000)::bigint AS remaining_us, held ",
            "FROM pglease.status ",
            $rest
        )
    };
}

/// One lease as the status view shows it (database clock at the read).
pub(crate) const INSPECT: &str = status_select!("WHERE name = $1");

/// Every lease ever acquired, by name.
pub(crate) const LIST: &str = status_select!("ORDER BY name");

/// Make a table reject writes from transactions that do not hold a lease.
pub(crate) const PROTECT: &str = "SELECT pglease.protect($1::regclass, $2)";

/// Remove that protection; true if the table was protected.
pub(crate) const UNPROTECT: &str = "SELECT pglease.unprotect($1::regclass)";

/// The latest migration applied to the schema.
pub(crate) const SCHEMA_VERSION: &str =
    "SELECT max(version) FROM pglease._pglease_migrations WHERE success";

/// Whether the owner of the functions may end stale fenced sessions.
pub(crate) const CAN_END_STALE: &str = "SELECT pglease.can_end_stale_transactions()";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_into_the_begin_statement() {
        let token = Token::issued(42);
        assert_eq!(
            begin_fenced(r"it's a\name", token),
            r"BEGIN; SELECT pglease.assert_held(E'it\'s a\\name', 42::bigint)"
        );
        assert_eq!(
            begin_fenced("plain", token),
            "BEGIN; SELECT pglease.assert_held(E'plain', 42::bigint)"
        );
    }
}
