//! The change notifications the trigger `pglease_changed` sends (see the
//! payload format in migrations/0001_schema.sql), parsed. A payload is a
//! hint of what changed, from whoever can NOTIFY on the channel.

use chrono::{DateTime, Utc};

use crate::token::Token;

/// A parsed notification (see the payload format in
/// migrations/0001_schema.sql).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Heard {
    Acquired {
        token: Token,
        expires_at: DateTime<Utc>,
        holder: String,
    },
    Released {
        token: Token,
    },
    /// `value: None` when the value was too long to be notified.
    Value {
        token: Token,
        value: Option<Option<String>>,
    },
    StepDown {
        token: Token,
        by: String,
    },
}

/// The name a notification is about, and what it says; `None` if it is
/// not one pglease sends.
pub(super) fn parse(payload: &str) -> Option<(&str, Heard)> {
    let (kind, rest) = payload.split_once(' ')?;
    let (token, rest) = rest.split_once(' ')?;
    let token = Token::issued(token.parse().ok()?);
    let (chars, rest) = rest.split_once(' ')?;
    let chars: usize = chars.parse().ok()?;
    let end = rest
        .char_indices()
        .nth(chars)
        .map_or(rest.len(), |(i, _)| i);
    let (name, rest) = rest.split_at(end);
    if name.chars().count() != chars {
        return None;
    }
    let heard = match kind {
        "a" => {
            let (micros, holder) = rest.split_once(' ')?;
            let expires_at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
            Heard::Acquired {
                token,
                expires_at,
                holder: holder.to_owned(),
            }
        }
        "r" => Heard::Released { token },
        "v" => {
            let (flag, value) = rest.split_once(' ')?;
            let value = match flag {
                "=" => Some(Some(value.to_owned())),
                "-" => Some(None),
                "*" => None,
                _ => return None,
            };
            Heard::Value { token, value }
        }
        "s" => Heard::StepDown {
            token,
            by: rest.to_owned(),
        },
        _ => return None,
    };
    Some((name, heard))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_parse_with_any_name() {
        let name = "odd name \t with\nspaces 3 ü";
        let n = name.chars().count();
        let payload = format!("a 42 {n} {name}1700000000000000 host:1 x");
        let (got, heard) = parse(&payload).unwrap();
        assert_eq!(got, name);
        assert_eq!(
            heard,
            Heard::Acquired {
                token: Token::issued(42),
                expires_at: DateTime::from_timestamp_micros(1_700_000_000_000_000).unwrap(),
                holder: "host:1 x".to_owned(),
            }
        );
        assert_eq!(
            parse(&format!("r 7 {n} {name}")).unwrap().1,
            Heard::Released {
                token: Token::issued(7)
            }
        );
        assert_eq!(
            parse(&format!("v 7 {n} {name}=  a b")).unwrap().1,
            Heard::Value {
                token: Token::issued(7),
                value: Some(Some(" a b".to_owned()))
            }
        );
        assert_eq!(
            parse(&format!("v 7 {n} {name}- ")).unwrap().1,
            Heard::Value {
                token: Token::issued(7),
                value: Some(None)
            }
        );
        assert_eq!(
            parse(&format!("s 7 {n} {name}ops")).unwrap().1,
            Heard::StepDown {
                token: Token::issued(7),
                by: "ops".to_owned()
            }
        );
        assert!(parse("x 7 1 a").is_none());
        assert!(parse("r 7 5 abc").is_none());
        assert!(parse("r seven 1 a").is_none());
    }
}
