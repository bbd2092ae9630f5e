//! Connection defaults that follow libpq, so that `pglease` finds the same
//! server `psql` finds.

use sqlx::postgres::PgConnectOptions;

/// Connection options from the libpq environment (`PGHOST`, `PGPORT`,
/// `PGUSER`, `PGPASSWORD`, `PGDATABASE`, ...), defaulting like libpq: the
/// local socket or `localhost:5432`, and the operating-system user name.
///
/// `sqlx` alone falls back to a placeholder user name when `$USER` is not
/// set (as in many service managers and CI runners); this looks the user
/// up by uid instead, as libpq does.
pub fn libpq_defaults() -> PgConnectOptions {
    let options = PgConnectOptions::new();
    if std::env::var_os("PGUSER").is_some() {
        return options;
    }
    match os_user() {
        Some(user) => options.username(&user),
        None => options,
    }
}

fn os_user() -> Option<String> {
    for var in ["USER", "LOGNAME"] {
        if let Ok(user) = std::env::var(var)
            && !user.is_empty()
        {
            return Some(user);
        }
    }
    passwd_user()
}

#[cfg(unix)]
fn passwd_user() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    // The owner of /proc/self is this process's effective uid.
    let uid = std::fs::metadata("/proc/self").ok()?.uid();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let entry_uid: u32 = fields.nth(1)?.parse().ok()?;
        (entry_uid == uid).then(|| name.to_owned())
    })
}

#[cfg(not(unix))]
fn passwd_user() -> Option<String> {
    None
}
