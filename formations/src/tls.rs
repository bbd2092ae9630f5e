//! The server users have in production: TLS only (`hostssl`, nothing
//! else over TCP), `scram-sha-256` passwords, a CA and a server
//! certificate made at test time, and a database owned by a role that is
//! neither a superuser nor a member of `pg_signal_backend`, as managed
//! services give. A throwaway cluster from the installed server binaries,
//! with `openssl` (Debian's package `openssl`) for the certificates;
//! removed when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use pglease::provision::TempCluster;
use pglease::provision::host::{self, ServerUser};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::SetupError;

/// A running TLS-only server (see the module's documentation).
///
/// ```no_run
/// # async fn f() -> Result<(), pglease::testing::SetupError> {
/// use pglease_formations::TlsServer;
///
/// let server = TlsServer::start().await?;
/// let url = server.url("sslmode=verify-full"); // with sslrootcert=<its CA>
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TlsServer {
    cluster: TempCluster,
    certs: PathBuf,
}

impl TlsServer {
    /// The database's owner: not a superuser, not in `pg_signal_backend`.
    pub const USER: &'static str = "app_owner";
    /// Its password (stored as `scram-sha-256`).
    pub const PASSWORD: &'static str = "s3cret:pa\\ss";
    /// The database it owns.
    pub const DATABASE: &'static str = "app";

    /// Whether the machine can make one: the server binaries and `openssl`.
    ///
    /// # Errors
    ///
    /// [`SetupError::Unavailable`] saying what is missing.
    pub fn available() -> Result<(), SetupError> {
        TempCluster::binaries()?;
        if Command::new("openssl").arg("version").output().is_err() {
            return Err(SetupError::Unavailable(
                "needs openssl to make the test CA (apt-get install openssl)".to_owned(),
            ));
        }
        Ok(())
    }

    /// Makes the CA and certificates, starts the server, creates the owner
    /// and its database, then allows only TLS over TCP and waits until a
    /// verified connection as the owner succeeds.
    ///
    /// # Errors
    ///
    /// [`SetupError::Unavailable`] without the binaries or `openssl`;
    /// [`SetupError::Server`] with the step that failed.
    pub async fn start() -> Result<TlsServer, SetupError> {
        TlsServer::available()?;
        let cluster = TempCluster::start().await?;
        let user = ServerUser::find()?;
        let certs = cluster.path().join("certs");
        std::fs::create_dir(&certs)
            .map_err(|e| SetupError::Server(format!("create {}: {e}", certs.display())))?;
        make_certificates(&certs, &user)?;
        let server = TlsServer { cluster, certs };
        let mut admin = server
            .admin()
            .connect()
            .await
            .map_err(|e| SetupError::Server(format!("connect over the socket: {e}")))?;
        let data = server.cluster.path().join("data");
        let hba = "# Written by pglease's TLS formation: TLS only over TCP.\n\
                   local all postgres trust\n\
                   hostssl all all 127.0.0.1/32 scram-sha-256\n\
                   hostssl all all ::1/128 scram-sha-256\n";
        std::fs::write(data.join("pg_hba.conf"), hba)
            .map_err(|e| SetupError::Server(format!("write pg_hba.conf: {e}")))?;
        let quote = |p: &Path| p.display().to_string().replace('\'', "''");
        let statements = [
            format!(
                "CREATE ROLE {} LOGIN PASSWORD '{}'",
                TlsServer::USER,
                TlsServer::PASSWORD.replace('\'', "''")
            ),
            format!(
                "CREATE DATABASE {} OWNER {}",
                TlsServer::DATABASE,
                TlsServer::USER
            ),
            "ALTER SYSTEM SET ssl = on".to_owned(),
            format!(
                "ALTER SYSTEM SET ssl_cert_file = '{}'",
                quote(&certs_path(&server.certs, "server.crt"))
            ),
            format!(
                "ALTER SYSTEM SET ssl_key_file = '{}'",
                quote(&certs_path(&server.certs, "server.key"))
            ),
            "SELECT pg_reload_conf()".to_owned(),
        ];
        for statement in &statements {
            sqlx::raw_sql(sqlx::AssertSqlSafe(statement.as_str()))
                .execute(&mut admin)
                .await
                .map_err(|e| SetupError::Server(format!("{statement}: {e}")))?;
        }
        let _ = admin.close().await;
        server.wait_for_tls().await?;
        Ok(server)
    }

    /// The reload is asynchronous: until it has happened, the server
    /// offers no TLS (or still allows plain connections).
    async fn wait_for_tls(&self) -> Result<(), SetupError> {
        let started = Instant::now();
        let target = pglease::connect::Target::parse(&self.url("sslmode=verify-full"))
            .map_err(|e| SetupError::Server(e.to_string()))?;
        loop {
            let error = match target.connect(Duration::from_secs(5)).await {
                Ok((connection, _)) => {
                    let _ = connection.close().await;
                    return Ok(());
                }
                Err(e) => e,
            };
            if started.elapsed() > Duration::from_secs(30) {
                return Err(SetupError::Server(format!(
                    "no verified TLS connection within 30 s: {error}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Allows plain connections over TCP too (`host ... scram-sha-256`
    /// after the `hostssl` lines), for a benchmark's baseline without TLS
    /// on the same server; waits until one succeeds.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] with the step that failed.
    pub async fn allow_plain(&self) -> Result<(), SetupError> {
        let hba = self.cluster.path().join("data").join("pg_hba.conf");
        let mut rules = std::fs::read_to_string(&hba)
            .map_err(|e| SetupError::Server(format!("read pg_hba.conf: {e}")))?;
        rules.push_str("host all all 127.0.0.1/32 scram-sha-256\n");
        std::fs::write(&hba, rules)
            .map_err(|e| SetupError::Server(format!("write pg_hba.conf: {e}")))?;
        let mut admin = self
            .admin()
            .connect()
            .await
            .map_err(|e| SetupError::Server(format!("connect over the socket: {e}")))?;
        sqlx::raw_sql("SELECT pg_reload_conf()")
            .execute(&mut admin)
            .await
            .map_err(|e| SetupError::Server(format!("reload: {e}")))?;
        let _ = admin.close().await;
        let plain = pglease::connect::Target::parse(&self.url("sslmode=disable"))
            .map_err(|e| SetupError::Server(e.to_string()))?;
        let started = Instant::now();
        loop {
            match plain.connect(Duration::from_secs(5)).await {
                Ok((connection, _)) => {
                    let _ = connection.close().await;
                    return Ok(());
                }
                Err(e) if started.elapsed() > Duration::from_secs(30) => {
                    return Err(SetupError::Server(format!(
                        "no plain connection within 30 s of the reload: {e}"
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Options for the superuser over the server's socket (trusted).
    pub fn admin(&self) -> PgConnectOptions {
        PgConnectOptions::new_without_pgpass()
            .socket(self.cluster.path())
            .port(self.cluster.port())
            .username("postgres")
            .database("postgres")
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.cluster.port()
    }

    /// The CA that signed the server's certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        certs_path(&self.certs, "ca.crt")
    }

    /// Another CA, which signed nothing the server presents.
    pub fn wrong_ca(&self) -> PathBuf {
        certs_path(&self.certs, "wrong-ca.crt")
    }

    /// The owner's URL for host `localhost` (the name the certificate
    /// carries, with 127.0.0.1), the password in it, `sslrootcert` the CA,
    /// then `query` (`sslmode=verify-full`, ...).
    pub fn url(&self, query: &str) -> String {
        self.url_without_password(&format!("{query}&sslrootcert={}", self.ca().display()))
            .replacen(
                &format!("{}@", TlsServer::USER),
                &format!("{}:{}@", TlsServer::USER, encoded_password()),
                1,
            )
    }

    /// The owner's URL without a password (for a password file or
    /// `PGPASSWORD`), with `query` as it is.
    pub fn url_without_password(&self, query: &str) -> String {
        format!(
            "postgres://{}@localhost:{}/{}?{query}",
            TlsServer::USER,
            self.port(),
            TlsServer::DATABASE
        )
    }

    /// A password file's line for the owner on this server, escaped as
    /// libpq reads it.
    pub fn passfile_line(&self) -> String {
        format!(
            "localhost:{}:{}:{}:{}\n",
            self.port(),
            TlsServer::DATABASE,
            TlsServer::USER,
            TlsServer::PASSWORD
                .replace('\\', "\\\\")
                .replace(':', "\\:")
        )
    }
}

fn encoded_password() -> String {
    TlsServer::PASSWORD
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) fn certs_path(certs: &Path, name: &str) -> PathBuf {
    certs.join(name)
}

/// A CA, a server certificate it signs (for `localhost` and 127.0.0.1,
/// P-256 keys: fast handshakes), and a second CA that signs nothing; the
/// server's key given to the server's user, private.
pub(crate) fn make_certificates(certs: &Path, user: &ServerUser) -> Result<(), SetupError> {
    let run = |args: &[&str]| -> Result<(), SetupError> {
        host::output(Command::new("openssl").args(args).current_dir(certs))
            .map(|_| ())
            .map_err(|e| SetupError::Server(format!("openssl {}: {e}", args.join(" "))))
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    for ca in ["ca", "wrong-ca"] {
        let (key, crt, subject) = (
            format!("{ca}.key"),
            format!("{ca}.crt"),
            format!("/CN=pglease test {ca}"),
        );
        let mut args = vec!["req", "-x509", "-days", "2", "-subj", &subject];
        args.extend(ec);
        args.extend(["-keyout", &key, "-out", &crt]);
        args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
        args.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
        run(&args)?;
    }
    let mut args = vec!["req", "-subj", "/CN=localhost", "-keyout", "server.key"];
    args.extend(ec);
    args.extend(["-out", "server.csr"]);
    run(&args)?;
    std::fs::write(
        certs.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n\
         basicConstraints=critical,CA:FALSE\n\
         keyUsage=critical,digitalSignature\n\
         extendedKeyUsage=serverAuth\n",
    )
    .map_err(|e| SetupError::Server(format!("write server.ext: {e}")))?;
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        "server.crt",
        "-extfile",
        "server.ext",
    ])?;
    let key = certs.join("server.key");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| SetupError::Server(format!("chmod server.key: {e}")))?;
    for path in [certs.to_owned(), key, certs.join("server.crt")] {
        user.give(&path)?;
    }
    Ok(())
}
