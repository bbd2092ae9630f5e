//! TLS as libpq sets it up: `sslmode`, `sslrootcert` (a file, or
//! `system`), `sslcert` and `sslkey`, with libpq's defaults under
//! `~/.postgresql/`, decided here without I/O ([`Approach::decide`] takes what
//! the files are) and carried out by `target.rs`, one or two attempts per
//! connection as libpq makes them.
//!
//! Where sqlx cannot do what libpq does, the difference is stated once, in
//! docs/design.md ("TLS: what differs from libpq"): a root file is added
//! to the platform's roots instead of replacing them.

use std::path::{Path, PathBuf};

use sqlx::postgres::PgSslMode;

/// What one connection attempt sends: sqlx's sslmode, comparable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// No TLS.
    Plain,
    /// TLS if the server offers it, not verified (sqlx's `prefer`).
    Prefer,
    /// TLS, not verified.
    Encrypted,
    /// TLS, the chain verified.
    VerifyCa,
    /// TLS, the chain and the name verified.
    VerifyFull,
}

impl Attempt {
    /// sqlx's spelling.
    pub(crate) fn sqlx(self) -> PgSslMode {
        match self {
            Attempt::Plain => PgSslMode::Disable,
            Attempt::Prefer => PgSslMode::Prefer,
            Attempt::Encrypted => PgSslMode::Require,
            Attempt::VerifyCa => PgSslMode::VerifyCa,
            Attempt::VerifyFull => PgSslMode::VerifyFull,
        }
    }

    /// Whether it encrypts whatever the server offers.
    pub(crate) fn encrypts(self) -> bool {
        !matches!(self, Attempt::Plain | Attempt::Prefer)
    }
}

use crate::error::{Error, Result};

/// libpq's `sslmode`: whether TLS is used, and what of the server's
/// certificate is verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// Without TLS first; with TLS if the server refuses that.
    Allow,
    /// With TLS first (libpq's default); without if the server does not
    /// offer it, the handshake fails or the server refuses the login over
    /// TLS.
    Prefer,
    /// TLS only; the certificate is verified against a root certificate
    /// file when one exists (as `verify-ca`), not at all otherwise.
    Require,
    /// TLS only, the certificate signed by a trusted root.
    VerifyCa,
    /// TLS only, the certificate signed by a trusted root and naming the
    /// host connected to.
    VerifyFull,
}

impl SslMode {
    /// All of them, weakest first, as written in a connection string.
    pub const ALL: [SslMode; 6] = [
        SslMode::Disable,
        SslMode::Allow,
        SslMode::Prefer,
        SslMode::Require,
        SslMode::VerifyCa,
        SslMode::VerifyFull,
    ];

    /// The spelling in a connection string.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// `value` as libpq reads it; `what` names where it came from
    /// (`sslmode`, `PGSSLMODE`) in the message.
    pub(crate) fn parse(value: &str, what: &str) -> Result<SslMode> {
        SslMode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == value)
            .ok_or_else(|| {
                Error::invalid(
                    "url",
                    format!(
                        "{what}={value} is not one libpq knows (disable, allow, prefer, \
                         require, verify-ca, verify-full)"
                    ),
                )
            })
    }
}

impl std::fmt::Display for SslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The TLS settings of a connection string (or the environment), as
/// written: nothing is decided or read from disk yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    pub(crate) mode: Option<SslMode>,
    /// `sslrootcert`: a file, or `system`.
    pub(crate) root: Option<String>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
}

/// What the files a approach depends on are: whether each exists, and the
/// client key's permissions. Read by [`Files::read`]; made up in tests.
#[derive(Debug, Clone, Default)]
pub(crate) struct Files {
    /// The home directory (`~/.postgresql/` holds libpq's defaults).
    pub(crate) home: Option<PathBuf>,
    /// The paths that exist, of those asked about.
    pub(crate) existing: Vec<PathBuf>,
    /// The client key's mode bits and whether root owns it.
    pub(crate) key_mode: Option<(u32, bool)>,
}

impl Files {
    /// The facts for `settings`, from the file system.
    pub(crate) fn read(settings: &TlsSettings) -> Files {
        #[allow(deprecated)] // fixed in Rust 1.85, undeprecated in 1.87
        let home = std::env::home_dir();
        let mut files = Files {
            home,
            ..Files::default()
        };
        let root = match settings.root.as_deref() {
            Some("system") => None,
            Some(file) => Some(PathBuf::from(file)),
            None => files.default_file("root.crt"),
        };
        let cert = settings
            .cert
            .clone()
            .or_else(|| files.default_file("postgresql.crt"));
        let key = settings
            .key
            .clone()
            .or_else(|| files.default_file("postgresql.key"));
        for path in [root, cert].into_iter().flatten() {
            if path.is_file() {
                files.existing.push(path);
            }
        }
        if let Some(key) = key
            && let Ok(meta) = std::fs::metadata(&key)
        {
            files.existing.push(key);
            files.key_mode = Some(mode_of(&meta));
        }
        files
    }

    fn default_file(&self, name: &str) -> Option<PathBuf> {
        self.home
            .as_ref()
            .map(|home| home.join(".postgresql").join(name))
    }

    fn exists(&self, path: &Path) -> bool {
        self.existing.iter().any(|p| p == path)
    }
}

#[cfg(unix)]
fn mode_of(meta: &std::fs::Metadata) -> (u32, bool) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    (meta.permissions().mode() & 0o777, meta.uid() == 0)
}

#[cfg(not(unix))]
fn mode_of(_: &std::fs::Metadata) -> (u32, bool) {
    (0o600, false)
}

/// What the server's certificate is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Roots {
    /// Nothing is verified.
    None,
    /// A root certificate file (`sslrootcert`, or `~/.postgresql/root.crt`).
    File(PathBuf),
    /// The platform's trusted roots (`sslrootcert=system`).
    System,
}

/// How a connection to one TCP host is made, decided from the settings and
/// the files: the first attempt, the one libpq would make after it fails,
/// and what TLS attempts verify and present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Approach {
    /// The sslmode in force (libpq's default `prefer`, or `verify-full` with
    /// `sslrootcert=system`).
    pub(crate) mode: SslMode,
    pub(crate) first: Attempt,
    /// The second attempt and when it is made: after the first failed in
    /// the ways [`Approach::retry_after`] names.
    pub(crate) second: Option<Attempt>,
    pub(crate) roots: Roots,
    /// The client certificate and key, presented when the server asks.
    pub(crate) client: Option<(PathBuf, PathBuf)>,
}

/// How a connection attempt failed, as far as libpq's retries care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The server answered the login with an error.
    Refused,
    /// The server declined TLS, or the handshake failed.
    Tls,
    /// Anything else (not reachable, a timeout, ...).
    Other,
}

impl Approach {
    /// The approach for `settings` given `files`, or why they cannot be used
    /// (libpq's refusals, in its words where it has them).
    pub(crate) fn decide(settings: &TlsSettings, files: &Files) -> Result<Approach> {
        let system = settings.root.as_deref() == Some("system");
        let mode = match settings.mode {
            Some(mode) if system && mode < SslMode::VerifyFull => {
                return Err(Error::invalid(
                    "url",
                    format!(
                        "weak sslmode \"{mode}\" may not be used with sslrootcert=system \
                         (use \"verify-full\")"
                    ),
                ));
            }
            Some(mode) => mode,
            None if system => SslMode::VerifyFull,
            None => SslMode::Prefer,
        };
        let root_file = match settings.root.as_deref() {
            Some("system") => None,
            Some(file) => Some(PathBuf::from(file)),
            None => files.default_file("root.crt"),
        };
        let roots = match root_file {
            _ if system => Roots::System,
            Some(file) if files.exists(&file) => Roots::File(file),
            missing => {
                if mode >= SslMode::VerifyCa {
                    let file = missing.map_or_else(
                        || "~/.postgresql/root.crt".to_owned(),
                        |f| f.display().to_string(),
                    );
                    return Err(Error::invalid(
                        "url",
                        format!(
                            "root certificate file \"{file}\" does not exist; either provide \
                             the file (sslrootcert=FILE), use the system's trusted roots with \
                             sslrootcert=system, or change sslmode to disable server \
                             certificate verification"
                        ),
                    ));
                }
                Roots::None
            }
        };
        let client = Approach::client(settings, files)?;
        // A TLS attempt verifies the chain whenever there are roots to
        // verify against (libpq: also for require, prefer and allow), and
        // the name only for verify-full.
        let tls = match (&roots, mode) {
            (_, SslMode::VerifyFull) => Attempt::VerifyFull,
            (Roots::None, _) => Attempt::Encrypted,
            _ => Attempt::VerifyCa,
        };
        let (first, second) = match mode {
            SslMode::Disable => (Attempt::Plain, None),
            SslMode::Allow => (Attempt::Plain, Some(tls)),
            SslMode::Prefer => (tls, Some(Attempt::Plain)),
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => (tls, None),
        };
        Ok(Approach {
            mode,
            first,
            second,
            roots,
            client,
        })
    }

    /// The client certificate and key: `sslcert` and `sslkey`, else
    /// `~/.postgresql/postgresql.crt` and `.key`, used when the certificate
    /// exists; its key must exist too and be private, as libpq requires.
    fn client(settings: &TlsSettings, files: &Files) -> Result<Option<(PathBuf, PathBuf)>> {
        let Some(cert) = settings
            .cert
            .clone()
            .or_else(|| files.default_file("postgresql.crt"))
            .filter(|cert| files.exists(cert))
        else {
            return Ok(None);
        };
        let Some(key) = settings
            .key
            .clone()
            .or_else(|| files.default_file("postgresql.key"))
        else {
            return Ok(None);
        };
        if !files.exists(&key) {
            return Err(Error::invalid(
                "url",
                format!(
                    "certificate present, but not private key file \"{}\" (sslkey)",
                    key.display()
                ),
            ));
        }
        match files.key_mode {
            Some((mode, by_root)) if mode & if by_root { 0o037 } else { 0o077 } != 0 => {
                Err(Error::invalid(
                    "url",
                    format!(
                        "private key file \"{}\" has group or world access; file must have \
                         permissions u=rw (0600) or less if owned by the current user, or \
                         permissions u=rw,g=r (0640) or less if owned by root",
                        key.display()
                    ),
                ))
            }
            _ => Ok(Some((cert, key))),
        }
    }

    /// Whether, after the first attempt failed as `failure`, libpq makes the
    /// second: `allow` when the server refused the login without TLS,
    /// `prefer` when TLS could not be set up or the login was refused over
    /// it.
    pub(crate) fn retry_after(&self, failure: Failure) -> Option<Attempt> {
        let second = self.second?;
        match (self.mode, failure) {
            (SslMode::Allow, Failure::Refused) => Some(second),
            (SslMode::Prefer, Failure::Refused | Failure::Tls) => Some(second),
            _ => None,
        }
    }

    /// The mode a pool's later connections use once `used` has worked:
    /// `prefer` without roots stays sqlx's prefer (TLS when the server
    /// offers it), everything else what worked.
    pub(crate) fn settled(&self, used: Attempt) -> Attempt {
        match (self.mode, used) {
            (SslMode::Prefer, Attempt::Encrypted) => Attempt::Prefer,
            (_, used) => used,
        }
    }

    /// What a message says about the roots a certificate was checked
    /// against.
    pub(crate) fn describe_roots(&self) -> String {
        match &self.roots {
            Roots::None => "nothing (no root certificate file)".to_owned(),
            Roots::File(file) => format!(
                "sslrootcert={} (and the system's trusted roots)",
                file.display()
            ),
            Roots::System => "the system's trusted roots (sslrootcert=system)".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(mode: Option<SslMode>, root: Option<&str>) -> TlsSettings {
        TlsSettings {
            mode,
            root: root.map(str::to_owned),
            ..TlsSettings::default()
        }
    }

    fn files(existing: &[&str]) -> Files {
        Files {
            home: Some(PathBuf::from("/home/u")),
            existing: existing.iter().map(PathBuf::from).collect(),
            key_mode: Some((0o600, false)),
        }
    }

    fn approach(mode: Option<SslMode>, root: Option<&str>, existing: &[&str]) -> Result<Approach> {
        Approach::decide(&settings(mode, root), &files(existing))
    }

    #[test]
    fn each_sslmode_makes_libpqs_attempts() {
        use Attempt as P;
        let cases = [
            (SslMode::Disable, P::Plain, None),
            (SslMode::Allow, P::Plain, Some(P::Encrypted)),
            (SslMode::Prefer, P::Encrypted, Some(P::Plain)),
            (SslMode::Require, P::Encrypted, None),
        ];
        for (mode, first, second) in cases {
            let approach = approach(Some(mode), None, &[]).expect("approach");
            assert_eq!((approach.first, approach.second), (first, second), "{mode}");
            assert_eq!(approach.roots, Roots::None, "{mode}");
        }
        // The default is prefer.
        assert_eq!(
            approach(None, None, &[]).expect("approach").mode,
            SslMode::Prefer
        );
    }

    #[test]
    fn a_root_file_makes_every_tls_attempt_verify_the_chain() {
        use Attempt as P;
        let root = "/home/u/.postgresql/root.crt";
        for (mode, first, second) in [
            (SslMode::Allow, P::Plain, Some(P::VerifyCa)),
            (SslMode::Prefer, P::VerifyCa, Some(P::Plain)),
            (SslMode::Require, P::VerifyCa, None),
            (SslMode::VerifyCa, P::VerifyCa, None),
            (SslMode::VerifyFull, P::VerifyFull, None),
        ] {
            let approach = approach(Some(mode), None, &[root]).expect("approach");
            assert_eq!((approach.first, approach.second), (first, second), "{mode}");
            assert_eq!(approach.roots, Roots::File(root.into()), "{mode}");
        }
        let given = approach(
            Some(SslMode::VerifyFull),
            Some("/etc/ca.pem"),
            &["/etc/ca.pem"],
        );
        assert_eq!(
            given.expect("approach").roots,
            Roots::File("/etc/ca.pem".into())
        );
    }

    #[test]
    fn verifying_without_a_root_file_is_refused_as_libpq_refuses_it() {
        for mode in [SslMode::VerifyCa, SslMode::VerifyFull] {
            let e = approach(Some(mode), None, &[]).expect_err("no root");
            assert!(
                e.to_string()
                    .contains("\"/home/u/.postgresql/root.crt\" does not exist"),
                "{e}"
            );
            let e = approach(Some(mode), Some("/nope.pem"), &[]).expect_err("missing root");
            assert!(
                e.to_string().contains("\"/nope.pem\" does not exist"),
                "{e}"
            );
            assert!(e.to_string().contains("sslrootcert=system"), "{e}");
        }
        // A missing file only matters where verification is asked for.
        let approach = approach(Some(SslMode::Require), Some("/nope.pem"), &[]).expect("approach");
        assert_eq!(approach.first, Attempt::Encrypted);
    }

    #[test]
    fn sslrootcert_system_means_verify_full() {
        let p = approach(None, Some("system"), &[]).expect("approach");
        assert_eq!(
            (p.mode, p.first, p.roots),
            (SslMode::VerifyFull, Attempt::VerifyFull, Roots::System)
        );
        for weak in [
            SslMode::Disable,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
        ] {
            let e = approach(Some(weak), Some("system"), &[]).expect_err("weak");
            assert!(
                e.to_string().contains(&format!("weak sslmode \"{weak}\"")),
                "{e}"
            );
        }
    }

    #[test]
    fn retries_follow_libpq() {
        let allow = approach(Some(SslMode::Allow), None, &[]).expect("approach");
        assert_eq!(
            allow.retry_after(Failure::Refused),
            Some(Attempt::Encrypted)
        );
        assert_eq!(allow.retry_after(Failure::Other), None);
        let prefer = approach(Some(SslMode::Prefer), None, &[]).expect("approach");
        assert_eq!(prefer.retry_after(Failure::Tls), Some(Attempt::Plain));
        assert_eq!(prefer.retry_after(Failure::Refused), Some(Attempt::Plain));
        assert_eq!(prefer.retry_after(Failure::Other), None);
        let require = approach(Some(SslMode::Require), None, &[]).expect("approach");
        assert_eq!(require.retry_after(Failure::Tls), None);
        assert_eq!(prefer.settled(Attempt::Encrypted), Attempt::Prefer);
        assert_eq!(prefer.settled(Attempt::Plain), Attempt::Plain);
    }

    #[test]
    fn a_client_certificate_needs_a_private_key() {
        let cert = "/home/u/.postgresql/postgresql.crt";
        let key = "/home/u/.postgresql/postgresql.key";
        let mut facts = files(&[cert, key]);
        let p = Approach::decide(&TlsSettings::default(), &facts).expect("approach");
        assert_eq!(p.client, Some((cert.into(), key.into())));
        facts.key_mode = Some((0o644, false));
        let e = Approach::decide(&TlsSettings::default(), &facts).expect_err("readable key");
        assert!(e.to_string().contains("group or world access"), "{e}");
        facts.key_mode = Some((0o640, true));
        assert!(Approach::decide(&TlsSettings::default(), &facts).is_ok());
        let e = Approach::decide(&TlsSettings::default(), &files(&[cert])).expect_err("no key");
        assert!(e.to_string().contains("not private key file"), "{e}");
        // No certificate: no client authentication, whatever the key.
        let p = Approach::decide(&TlsSettings::default(), &files(&[key])).expect("approach");
        assert_eq!(p.client, None);
    }

    #[test]
    fn sslmode_spellings() {
        for mode in SslMode::ALL {
            assert_eq!(
                SslMode::parse(mode.as_str(), "sslmode").expect("parse"),
                mode
            );
        }
        let e = SslMode::parse("requir", "sslmode").expect_err("typo");
        assert!(
            e.to_string()
                .contains("sslmode=requir is not one libpq knows"),
            "{e}"
        );
    }
}
