//! The fencing token: which acquisition of a lease. A leaf of the crate:
//! its checked constructors (`Token::new`, `FromStr`) live with the other
//! checks, in `limits.rs`, so that the error type can name tokens without
//! a circle.

/// A fencing token: which acquisition of a lease. Every acquisition of a
/// name gets a token greater than all tokens issued before for that name;
/// tokens start at 1 and are never reused.
///
/// Binds to SQL as a `bigint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(i64);

impl Token {
    /// A token the database issued.
    pub(crate) fn issued(token: i64) -> Token {
        Token(token)
    }

    /// The token as the database stores it.
    pub fn get(self) -> i64 {
        self.0
    }

    /// The token just before this one, if any (tokens start at 1).
    pub(crate) fn previous(self) -> Option<Token> {
        (self.0 > 1).then(|| Token(self.0 - 1))
    }
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<Token> for i64 {
    fn from(token: Token) -> i64 {
        token.0
    }
}

impl PartialEq<i64> for Token {
    fn eq(&self, other: &i64) -> bool {
        self.0 == *other
    }
}

impl PartialEq<Token> for i64 {
    fn eq(&self, other: &Token) -> bool {
        *self == other.0
    }
}

impl PartialOrd<i64> for Token {
    fn partial_cmp(&self, other: &i64) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(other)
    }
}

impl sqlx::Type<sqlx::Postgres> for Token {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <i64 as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

impl<'q> sqlx::Encode<'q, sqlx::Postgres> for Token {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> std::result::Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <i64 as sqlx::Encode<'q, sqlx::Postgres>>::encode_by_ref(&self.0, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_with_plain_integers() {
        let token = Token::issued(5);
        assert_eq!(token, 5);
        assert_eq!(5, token);
        assert!(token > 4);
        assert_eq!(i64::from(token), 5);
        assert_eq!(token.to_string(), "5");
    }
}
