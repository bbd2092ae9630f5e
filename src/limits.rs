//! The limits on what pglease accepts, and their checks, made in Rust
//! before anything is sent (the SQL functions check their own limits
//! again for callers in other languages: see `migrations/0001_schema.sql`).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::human::Human;

/// Longest lease name, holder or resource, in bytes of UTF-8 (the SQL
/// functions' limit too).
pub const MAX_NAME_BYTES: usize = 255;

/// Longest TTL a lease can be acquired or renewed for (the SQL functions'
/// limit too).
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Shortest TTL the library and the command line acquire or renew a lease
/// for. A shorter lease expires in about the time its acquisition takes to
/// reach the holder: the holder would confirm it with a renewal that finds
/// it expired, having drawn a token and left a row and history for
/// nothing. (The SQL functions accept any TTL above zero.)
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// The longest value a lease may carry, in bytes of UTF-8 (8 KiB).
pub const MAX_VALUE_BYTES: usize = 8192;

/// The longest reason a force release may give, in bytes of UTF-8.
pub const MAX_REASON_BYTES: usize = 1000;

/// Checks a lease's value: at most [`MAX_VALUE_BYTES`] bytes, no NUL (it
/// may be empty).
pub(crate) fn check_value(value: &str) -> Result<()> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(Error::invalid(
            "value",
            format!(
                "is {} bytes long; the limit is {MAX_VALUE_BYTES} bytes of UTF-8",
                value.len()
            ),
        ));
    }
    if value.contains('\0') {
        return Err(Error::invalid(
            "value",
            "must not contain NUL bytes (PostgreSQL text cannot store them)",
        ));
    }
    Ok(())
}

/// Checks a name, holder or resource: 1 to [`MAX_NAME_BYTES`] bytes, no NUL.
pub(crate) fn check_text(argument: &'static str, value: &str) -> Result<()> {
    check_text_within(argument, value, MAX_NAME_BYTES)
}

/// Checks text of 1 to `limit` bytes, without NUL.
fn check_text_within(argument: &'static str, value: &str, limit: usize) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(argument, "must not be empty"));
    }
    if value.len() > limit {
        return Err(Error::invalid(
            argument,
            format!(
                "is {} bytes long; the limit is {limit} bytes of UTF-8",
                value.len()
            ),
        ));
    }
    if value.contains('\0') {
        return Err(Error::invalid(
            argument,
            "must not contain NUL bytes (PostgreSQL text cannot store them)",
        ));
    }
    Ok(())
}

/// The most slots a counted lease may have
/// ([`AcquireOptions::limit`](crate::AcquireOptions::limit)).
pub const MAX_SLOTS: u32 = 1000;

/// How many leases `pglease.acquire_all` takes at once, at most.
pub const MAX_SET_NAMES: usize = 100;

/// Most partitions a lease group may have.
pub const MAX_PARTITIONS: u32 = 100_000;

/// Most partitions one statement takes for a group member (a member that
/// should own more takes them over several rounds).
pub const MAX_TAKE: usize = 1000;

/// How many acquirers may wait in one line (first come, first served), at
/// most ([`AcquireOptions::max_waiting`](crate::AcquireOptions::max_waiting)).
pub const MAX_WAITING: u32 = 1000;

/// How long a takeover lets the transactions still fenced on an ended
/// lease end by themselves before it ends their sessions (the schema's
/// `_fenced_grace_ms`): a fenced check that passed just as the lease
/// ended is usually committing then, and ending its session would make
/// the next, unrelated statement on that connection fail. A takeover
/// behind a frozen fenced holder waits this much longer.
pub const FENCED_GRACE: Duration = Duration::from_millis(50);

/// Checks a counted lease's limit, and that its name leaves room for the
/// slot suffix (`#k`) within [`MAX_NAME_BYTES`].
pub(crate) fn check_limit(name: &str, limit: u32) -> Result<()> {
    if !(1..=MAX_SLOTS).contains(&limit) {
        return Err(Error::invalid(
            "limit",
            format!("must be between 1 and {MAX_SLOTS}, got {limit}"),
        ));
    }
    let suffix = format!("#{limit}").len();
    if name.len() + suffix > MAX_NAME_BYTES {
        return Err(Error::invalid(
            "name",
            format!(
                "is {} bytes long; with its slot suffix (#{limit}) a counted lease name may be \
                 at most {} bytes of UTF-8",
                name.len(),
                MAX_NAME_BYTES - suffix
            ),
        ));
    }
    Ok(())
}

/// Checks a force release's reason: 1 to [`MAX_REASON_BYTES`] bytes, no
/// NUL.
pub(crate) fn check_reason(reason: &str) -> Result<()> {
    check_text_within("reason", reason, MAX_REASON_BYTES)
}

/// Checks a TTL ([`MIN_TTL`] to [`MAX_TTL`]) and converts it to whole
/// microseconds, the resolution of a PostgreSQL interval (a
/// sub-microsecond part is rounded up).
pub(crate) fn check_ttl(ttl: Duration) -> Result<i64> {
    if ttl < MIN_TTL {
        return Err(Error::invalid(
            "ttl",
            format!(
                "must be at least {}, got {}: a shorter lease expires in about the time its \
                 acquisition takes to reach the holder",
                Human(MIN_TTL),
                Human(ttl)
            ),
        ));
    }
    check_duration("ttl", ttl)
}

/// [`check_ttl`] for any duration the database adds to its clock (a TTL,
/// a minimum hold), named `argument` in the error.
pub(crate) fn check_duration(argument: &'static str, duration: Duration) -> Result<i64> {
    if duration.is_zero() {
        return Err(Error::invalid(argument, "must be greater than zero"));
    }
    if duration < Duration::from_micros(1) {
        return Err(Error::invalid(
            argument,
            format!(
                "must be at least 1 microsecond (the resolution of a PostgreSQL interval), \
                 got {}",
                Human(duration)
            ),
        ));
    }
    if duration > MAX_TTL {
        return Err(Error::invalid(
            argument,
            format!(
                "must be at most {}, got {}",
                Human(MAX_TTL),
                Human(duration)
            ),
        ));
    }
    // At most 7 days, so this cannot overflow an i64 of microseconds.
    let micros = duration.as_nanos().div_ceil(1_000);
    i64::try_from(micros)
        .map_err(|_| Error::invalid(argument, format!("{} is too large", Human(duration))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema, whose functions check the same limits again.
    const SCHEMA: &str = crate::schema::SOURCE;

    /// The constant a schema limit function returns (`CREATE FUNCTION
    /// pglease.NAME() ... AS $$ SELECT N $$`).
    fn schema_limit(function: &str) -> u64 {
        let start = SCHEMA
            .find(&format!("CREATE FUNCTION pglease.{function}()"))
            .unwrap_or_else(|| panic!("{function} is not in the schema"));
        let body = &SCHEMA[start..];
        let select = body.find("SELECT ").expect("a SELECT") + "SELECT ".len();
        let digits: String = body[select..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().expect("a number")
    }

    #[test]
    fn the_limits_are_the_schemas() {
        assert_eq!(schema_limit("_max_text_bytes"), MAX_NAME_BYTES as u64);
        assert_eq!(schema_limit("_max_ttl_seconds"), MAX_TTL.as_secs());
        assert_eq!(schema_limit("_max_value_bytes"), MAX_VALUE_BYTES as u64);
        assert_eq!(schema_limit("_max_slots"), u64::from(MAX_SLOTS));
        assert_eq!(schema_limit("_max_set_names"), MAX_SET_NAMES as u64);
        assert_eq!(schema_limit("_max_partitions"), u64::from(MAX_PARTITIONS));
        assert_eq!(schema_limit("_max_take"), MAX_TAKE as u64);
        assert_eq!(schema_limit("_max_waiting"), u64::from(MAX_WAITING));
        assert_eq!(
            u128::from(schema_limit("_fenced_grace_ms")),
            FENCED_GRACE.as_millis()
        );
        // force_release tests its reason against the number itself.
        let reason = format!("octet_length(force_release.reason) BETWEEN 1 AND {MAX_REASON_BYTES}");
        assert!(SCHEMA.contains(&reason), "force_release's reason limit");
        assert!(SCHEMA.contains(&format!("the limit is {MAX_REASON_BYTES} bytes")));
    }

    #[test]
    fn ttl_bounds() {
        assert!(check_ttl(Duration::ZERO).is_err());
        assert!(check_ttl(Duration::from_micros(1)).is_err());
        assert!(check_ttl(MIN_TTL - Duration::from_nanos(1)).is_err());
        assert_eq!(check_ttl(MIN_TTL).ok(), Some(100_000));
        assert_eq!(
            check_ttl(MIN_TTL + Duration::from_nanos(1_001)).ok(),
            Some(100_002)
        );
        assert_eq!(check_ttl(Duration::from_millis(1500)).ok(), Some(1_500_000));
        assert!(check_ttl(MAX_TTL).is_ok());
        assert!(check_ttl(MAX_TTL + Duration::from_nanos(1)).is_err());
        assert!(check_ttl(Duration::MAX).is_err());
    }

    #[test]
    fn other_durations_need_only_a_microsecond() {
        assert!(check_duration("after", Duration::from_nanos(999)).is_err());
        assert_eq!(
            check_duration("after", Duration::from_micros(1)).ok(),
            Some(1)
        );
        assert_eq!(
            check_duration("after", Duration::from_nanos(1_001)).ok(),
            Some(2)
        );
    }

    #[test]
    fn text_bounds() {
        assert!(check_text("name", "").is_err());
        assert!(check_text("name", "a\0b").is_err());
        assert!(check_text("name", &"x".repeat(255)).is_ok());
        assert!(check_text("name", &"x".repeat(256)).is_err());
        // 128 two-byte characters are 256 bytes.
        assert!(check_text("name", &"é".repeat(128)).is_err());
    }
}
