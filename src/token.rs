//! The fencing token: which acquisition of a lease. A leaf of the crate:
//! its checked constructors fail with [`InvalidToken`], its own error,
//! which the crate's error type takes in (`?` makes it
//! `Error::InvalidInput` for argument `token`), so that the error type can
//! name tokens without a circle.

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

// Tokens are issued from 1 upwards, so zero or less was never issued and
// can only be a mistake: the checked ways to make one from outside.
impl Token {
    /// A token read from elsewhere (a database row, `PGLEASE_TOKEN`, a
    /// message). Tokens start at 1.
    ///
    /// # Errors
    ///
    /// [`InvalidToken`] for zero or less, which was never issued and can
    /// only be a mistake (with `?` in a function that returns
    /// [`pglease::Result`](crate::Result), it becomes
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for argument
    /// `token`).
    pub fn new(token: i64) -> Result<Token, InvalidToken> {
        if token <= 0 {
            return Err(InvalidToken(format!("must be positive, got {token}")));
        }
        Ok(Token(token))
    }
}

impl std::str::FromStr for Token {
    type Err = InvalidToken;

    /// A token from its decimal text, spaces around it ignored.
    fn from_str(s: &str) -> Result<Token, InvalidToken> {
        let digits = s.trim();
        let token: i64 = digits.parse().map_err(|e: std::num::ParseIntError| {
            let quoted = if s.len() <= 40 {
                format!("{s:?}")
            } else {
                format!("a {}-byte text", s.len())
            };
            InvalidToken(match e.kind() {
                std::num::IntErrorKind::Empty => "is empty".to_owned(),
                std::num::IntErrorKind::PosOverflow => {
                    format!("{quoted} is larger than any token (at most {})", i64::MAX)
                }
                std::num::IntErrorKind::NegOverflow => format!("must be positive, got {digits}"),
                _ => format!("{quoted} is not a whole number (digits only)"),
            })
        })?;
        Token::new(token)
    }
}

/// A token that cannot have been issued: zero or less, or text that is
/// not a whole number ([`Token::new`], [`Token`]'s `FromStr`). It reads
/// as `invalid token: ` and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidToken(String);

impl InvalidToken {
    /// Why the token was rejected.
    pub fn reason(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for InvalidToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid token: {}", self.0)
    }
}

impl std::error::Error for InvalidToken {}

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

    #[test]
    fn tokens_start_at_one_and_parse_from_text() {
        assert_eq!(
            Token::new(0),
            Err(InvalidToken("must be positive, got 0".to_owned()))
        );
        assert!(Token::new(-1).is_err());
        assert_eq!(" 7 ".parse::<Token>().expect("token").get(), 7);
        let text = "x".parse::<Token>().expect_err("not a number");
        assert!(
            text.reason().starts_with("\"x\" is not a whole number"),
            "{text}"
        );
        assert!(text.to_string().starts_with("invalid token: "), "{text}");
    }
}
