//! `run --declare` and `elect --declare`: every database session CMD opens
//! declares the lease, with no change to CMD. The database reads the
//! declaration from two settings given when the session starts,
//! `pglease.name` and `pglease.token`, and finds a session declared under
//! a term that has ended by its `application_name`, `pglease:<token>`
//! (see the schema's DECLARED SESSIONS). Both travel in the environment
//! that libpq and the drivers modelled on it read at connection start:
//! `PGOPTIONS` (libpq, so psql, psycopg and diesel; sqlx; lib/pq;
//! node-postgres; pgx from 5.8) and `PGAPPNAME`. What a driver that reads
//! neither (JDBC) needs is in `PGLEASE_OPTIONS` and `PGLEASE_URL_QUERY`.
//!
//! Pure functions of the lease and the environment CMD would inherit.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use pglease::Token;

/// The longest application_name the server keeps (NAMEDATALEN - 1 bytes);
/// longer ones are cut.
const MAX_APPNAME_BYTES: usize = 63;

/// The environment variables that make CMD's sessions declare lease
/// `name` under `token`, given the `PGOPTIONS` and `PGAPPNAME` CMD would
/// otherwise inherit (kept: ours are added after them).
pub(crate) fn variables(
    name: &str,
    token: Token,
    inherited_options: Option<&str>,
    inherited_appname: Option<&str>,
) -> Vec<(String, String)> {
    let ours = options(name, token);
    let pgoptions = match inherited_options.map(str::trim) {
        // A later -c of the same setting wins, so ours come last.
        Some(before) if !before.is_empty() => format!("{before} {ours}"),
        _ => ours.clone(),
    };
    vec![
        ("PGOPTIONS".to_owned(), pgoptions),
        (
            "PGAPPNAME".to_owned(),
            application_name(token, inherited_appname),
        ),
        ("PGLEASE_URL_QUERY".to_owned(), url_query(&ours, token)),
        ("PGLEASE_OPTIONS".to_owned(), ours),
    ]
}

/// `-c pglease.name=NAME -c pglease.token=TOKEN`, escaped as the server
/// splits a startup options string: at white space, a backslash taking
/// the next character as it is.
fn options(name: &str, token: Token) -> String {
    let mut escaped = String::with_capacity(name.len());
    for c in name.chars() {
        if c == '\\' || c.is_whitespace() {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    format!("-c pglease.name={escaped} -c pglease.token={token}")
}

/// `pglease:<token>`, then the inherited name after a space, cut to what
/// the server keeps (on a character boundary).
fn application_name(token: Token, inherited: Option<&str>) -> String {
    let mut name = format!("pglease:{token}");
    if let Some(before) = inherited.map(str::trim).filter(|b| !b.is_empty()) {
        name.push(' ');
        for c in before.chars() {
            if name.len() + c.len_utf8() > MAX_APPNAME_BYTES {
                break;
            }
            name.push(c);
        }
    }
    name
}

/// Every byte but the unreserved ones of RFC 3986 is encoded.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `options=<the options>&application_name=pglease:<token>`,
/// percent-encoded, to append to a URL's query: libpq's and the drivers'
/// that read their settings from the URL only (JDBC, which ignores
/// `application_name` and takes `ApplicationName` instead).
fn url_query(options: &str, token: Token) -> String {
    format!(
        "options={}&application_name={}",
        utf8_percent_encode(options, QUERY_VALUE),
        utf8_percent_encode(&application_name(token, None), QUERY_VALUE)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(t: i64) -> Token {
        Token::new(t).expect("a token")
    }

    fn get<'a>(vars: &'a [(String, String)], key: &str) -> &'a str {
        vars.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {key}"))
    }

    #[test]
    fn a_plain_name_is_declared_as_it_is() {
        let vars = variables("migrations", token(42), None, None);
        assert_eq!(
            get(&vars, "PGOPTIONS"),
            "-c pglease.name=migrations -c pglease.token=42"
        );
        assert_eq!(get(&vars, "PGAPPNAME"), "pglease:42");
        assert_eq!(
            get(&vars, "PGLEASE_OPTIONS"),
            "-c pglease.name=migrations -c pglease.token=42"
        );
        assert_eq!(
            get(&vars, "PGLEASE_URL_QUERY"),
            "options=-c%20pglease.name%3Dmigrations%20-c%20pglease.token%3D42\
             &application_name=pglease%3A42"
        );
    }

    #[test]
    fn spaces_and_backslashes_in_a_name_are_escaped() {
        assert_eq!(
            options("a b\\c\td", token(7)),
            "-c pglease.name=a\\ b\\\\c\\\td -c pglease.token=7"
        );
    }

    #[test]
    fn inherited_options_are_kept_before_ours() {
        let vars = variables("m", token(3), Some(" -c work_mem=64MB "), None);
        assert_eq!(
            get(&vars, "PGOPTIONS"),
            "-c work_mem=64MB -c pglease.name=m -c pglease.token=3"
        );
        let vars = variables("m", token(3), Some("  "), None);
        assert_eq!(
            get(&vars, "PGOPTIONS"),
            "-c pglease.name=m -c pglease.token=3"
        );
    }

    #[test]
    fn an_inherited_application_name_follows_ours_cut_to_what_the_server_keeps() {
        assert_eq!(
            application_name(token(12), Some("billing-migrate")),
            "pglease:12 billing-migrate"
        );
        let long = "é".repeat(40);
        let name = application_name(token(12), Some(&long));
        assert!(name.len() <= MAX_APPNAME_BYTES, "{name}");
        assert!(name.starts_with("pglease:12 é"));
        // Cut on a character boundary: 63 - 11 = 52 bytes, 26 of "é".
        assert_eq!(name.len(), 11 + 52);
        let max = application_name(token(i64::MAX), Some("x"));
        assert_eq!(max, format!("pglease:{} x", i64::MAX));
    }
}
