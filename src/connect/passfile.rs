//! libpq's password file (`passfile`, `PGPASSFILE`, else `~/.pgpass`):
//! read again for every connection pglease opens, so that a password
//! rewritten there (a rotated secret, a cloud IAM token) is used by the
//! next connection. Lines are `hostname:port:database:username:password`,
//! `*` matches anything, `\` escapes `:` and `\`, the first matching line
//! wins, and a file that group or others may access is ignored, as libpq
//! ignores it.

use std::path::{Path, PathBuf};

/// What one connection is for, as the file's fields match it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Login<'a> {
    /// The host as given; a socket directory matches `localhost`.
    pub(crate) host: &'a str,
    pub(crate) port: u16,
    /// The database, which defaults to the user's name.
    pub(crate) database: &'a str,
    pub(crate) user: &'a str,
}

/// The result of looking a login up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// A password, and the file it came from.
    Found(String, PathBuf),
    /// No file, or no line for the login.
    None,
    /// The file was not read, and why (said when the login then fails).
    Ignored(String),
}

/// The file libpq would read: `passfile`, else `PGPASSFILE`, else
/// `~/.pgpass`.
pub(crate) fn location(given: Option<&Path>) -> Option<PathBuf> {
    if let Some(given) = given {
        return Some(given.to_owned());
    }
    if let Some(env) = std::env::var_os("PGPASSFILE").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(env));
    }
    #[allow(deprecated)] // fixed in Rust 1.85, undeprecated in 1.87
    std::env::home_dir().map(|home| home.join(".pgpass"))
}

/// Looks `login` up in the file at `path`, read now.
pub(crate) fn lookup(path: &Path, login: Login<'_>) -> Lookup {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(_) => return Lookup::None,
    };
    if !meta.is_file() {
        return Lookup::Ignored(format!(
            "the password file \"{}\" is not a plain file",
            path.display()
        ));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            let why = format!(
                "the password file \"{}\" has group or world access and was ignored; \
                 permissions should be u=rw (0600) or less: chmod 0600 {}",
                path.display(),
                path.display()
            );
            tracing::warn!("{why}");
            return Lookup::Ignored(why);
        }
    }
    match std::fs::read_to_string(path) {
        Ok(text) => match find(&text, login) {
            Some(password) => Lookup::Found(password, path.to_owned()),
            None => Lookup::None,
        },
        Err(e) => Lookup::Ignored(format!(
            "the password file \"{}\" could not be read: {e}",
            path.display()
        )),
    }
}

/// The password of the first line of `text` that matches `login`.
pub(crate) fn find(text: &str, login: Login<'_>) -> Option<String> {
    // libpq compares a socket directory (or no host) as "localhost".
    let host = if login.host.is_empty() || login.host.starts_with('/') {
        "localhost"
    } else {
        login.host
    };
    let port = login.port.to_string();
    let wanted = [host, port.as_str(), login.database, login.user];
    text.lines()
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let fields = split(line);
            if fields.len() < 5 {
                return None;
            }
            let matches = fields[..4]
                .iter()
                .zip(wanted)
                .all(|(field, wanted)| field == "*" || field == wanted);
            matches.then(|| fields[4].clone())
        })
}

/// The fields of a line: split at unescaped `:`, with `\x` read as `x`.
/// The password is everything after the fourth separator.
fn split(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields
                .last_mut()
                .into_iter()
                .for_each(|f| f.extend(chars.next())),
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().into_iter().for_each(|f| f.push(c)),
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login<'a>(host: &'a str, port: u16, database: &'a str, user: &'a str) -> Login<'a> {
        Login {
            host,
            port,
            database,
            user,
        }
    }

    #[test]
    fn the_first_matching_line_wins_with_wildcards() {
        let text = "# comment\n\
                    db1:5432:app:alice:first\n\
                    *:5432:*:alice:second\n\
                    *:*:*:*:any\n";
        assert_eq!(
            find(text, login("db1", 5432, "app", "alice")).as_deref(),
            Some("first")
        );
        assert_eq!(
            find(text, login("db2", 5432, "x", "alice")).as_deref(),
            Some("second")
        );
        assert_eq!(
            find(text, login("db2", 6000, "x", "alice")).as_deref(),
            Some("any")
        );
        assert_eq!(
            find("db1:5432:app:alice\n", login("db1", 5432, "app", "alice")),
            None
        );
        assert_eq!(find("", login("db1", 5432, "app", "alice")), None);
    }

    #[test]
    fn a_socket_directory_matches_localhost() {
        let text = "localhost:5432:*:bob:sock\n";
        assert_eq!(
            find(text, login("/var/run/postgresql", 5432, "d", "bob")).as_deref(),
            Some("sock")
        );
        assert_eq!(find(text, login("127.0.0.1", 5432, "d", "bob")), None);
    }

    #[test]
    fn escapes_and_colons_in_the_password() {
        let text = r"h\:x:5432:d:u:pa\:ss\\w:rd";
        assert_eq!(
            find(text, login("h:x", 5432, "d", "u")).as_deref(),
            Some(r"pa:ss\w:rd")
        );
        assert_eq!(
            find("h:5432:d:u:p\r\n", login("h", 5432, "d", "u")).as_deref(),
            Some("p")
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_file_others_may_read_is_ignored_with_why() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pglease-passfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("pgpass");
        std::fs::write(&path, "*:*:*:*:secret\n").expect("write");
        let any = login("h", 5432, "d", "u");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        match lookup(&path, any) {
            Lookup::Ignored(why) => assert!(why.contains("chmod 0600"), "{why}"),
            other => panic!("expected Ignored, got {other:?}"),
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_eq!(
            lookup(&path, any),
            Lookup::Found("secret".into(), path.clone())
        );
        assert_eq!(lookup(&dir.join("none"), any), Lookup::None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
