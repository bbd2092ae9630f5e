//! The fencing token: which acquisition of a lease.

use crate::error::{Error, Result};
use crate::input::check_positive_token;

/// A fencing token: which acquisition of a lease. Every acquisition of a
/// name gets a token greater than all tokens issued before for that name;
/// tokens start at 1 and are never reused.
///
/// Binds to SQL as a `bigint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(i64);

impl Token {
    /// A token read from elsewhere (a database row, `PGLEASE_TOKEN`, a
    /// message). Tokens start at 1.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (argument `token`) for zero or less, which
    /// was never issued and can only be a mistake.
    pub fn new(token: i64) -> Result<Token> {
        check_positive_token(token)?;
        Ok(Token(token))
    }

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

impl std::str::FromStr for Token {
    type Err = Error;

    fn from_str(s: &str) -> Result<Token> {
        let token: i64 = s
            .trim()
            .parse()
            .map_err(|e| Error::invalid("token", format!("{s:?} is not a whole number ({e})")))?;
        Token::new(token)
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
    fn tokens_start_at_one_and_parse_from_text() {
        assert!(Token::new(0).is_err());
        assert_eq!(" 7 ".parse::<Token>().expect("token").get(), 7);
        assert!(matches!(
            "x".parse::<Token>(),
            Err(Error::InvalidInput {
                argument: "token",
                ..
            })
        ));
    }

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
