//! One TCP forwarder for every formation and the peers: [`Forwarder`],
//! which says what each of its behaviours is for.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sqlx::postgres::PgConnectOptions;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::SetupError;
use crate::sync::lock;
use pglease::provision::host;

/// Where a [`Forwarder`] carries its connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A unix socket (a server's is `DIR/.s.PGSQL.PORT`).
    Unix(PathBuf),
}

impl Target {
    /// `port` of 127.0.0.1, where the formations' servers listen.
    pub fn port(port: u16) -> Target {
        Target::Tcp(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// The server `options` connect to (a test database's, say): its unix
    /// socket where the host is a directory, else its TCP address.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] if the host name does not resolve.
    pub fn of(options: &PgConnectOptions) -> Result<Target, SetupError> {
        let (host, port) = (options.get_host(), options.get_port());
        if host.starts_with('/') {
            return Ok(Target::Unix(PathBuf::from(format!(
                "{host}/.s.PGSQL.{port}"
            ))));
        }
        std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
            .ok()
            .and_then(|mut found| found.next())
            .map(Target::Tcp)
            .ok_or_else(|| SetupError::Server(format!("{host}:{port} does not resolve")))
    }
}

/// The switch every connection watches. A connection belongs to the
/// generation it was accepted in; cutting or re-pointing starts a new
/// one, and a connection of an older generation forwards nothing more,
/// even if it is woken by the same change that opens the forwarder.
#[derive(Debug, Clone)]
struct Switch {
    target: Option<Target>,
    open: bool,
    generation: u64,
}

/// A TCP forwarder on a port of 127.0.0.1 that carries each connection to
/// a target (a TCP address or a unix socket), with a switch that freezes,
/// opens and cuts what passes through, and a target that can be changed
/// while it runs.
///
/// What each behaviour is for:
///
/// - **Frozen** ([`Forwarder::freeze`]): nothing is forwarded in either
///   direction and every connection stays open, as with a network that
///   stops answering or a paused process. A close (end of stream, or a
///   reset) is held back too: a frozen network delivers no close either.
///   [`Forwarder::open`] delivers what was held back, then the rest. The
///   Patroni formation freezes a node's replication stream so that the
///   commits made meanwhile are lost in a crash; the peers freeze a
///   holder's network.
/// - **Cut** ([`Forwarder::cut`]): every connection is dropped, with what
///   it held back, and the forwarder opens: a crashed host's connections
///   are gone, and its replacement's are not frozen.
/// - **Re-pointed** ([`Forwarder::repoint`]): new connections go to the new
///   target and the current ones are dropped, so that clients reconnect,
///   as they do when a virtual address moves to the promoted standby. A
///   forwarder may start without a target ([`Forwarder::start_unpointed`])
///   when its port must be known first (a Patroni node's configuration
///   names its replication address before the node's own port is chosen);
///   until the first `repoint` it closes what it accepts.
/// - **No delay of its own**: `TCP_NODELAY` on both sides, so that a small
///   write is not held behind an unacknowledged one (Nagle's algorithm)
///   and the forwarder adds no latency to a request and its answer.
/// - **A half-close is passed on** as such: when one side ends its
///   stream, the other side's write end is shut down and the other
///   direction carries on until it ends too.
///
/// Dropping the forwarder stops it and drops its connections.
#[derive(Debug)]
pub struct Forwarder {
    port: u16,
    switch: watch::Sender<Switch>,
    connections: Arc<Mutex<JoinSet<()>>>,
    accept: JoinHandle<()>,
}

impl Forwarder {
    /// Starts forwarding to `target`, open, on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] if no port of 127.0.0.1 can be bound.
    pub async fn start(target: Target) -> Result<Forwarder, SetupError> {
        Forwarder::listen(Some(target)).await
    }

    /// Starts with no target: every connection it accepts is closed at
    /// once until [`Forwarder::repoint`] gives it one. For a port that
    /// must be written somewhere before its target's port is chosen.
    ///
    /// # Errors
    ///
    /// [`SetupError::Server`] if no port of 127.0.0.1 can be bound.
    pub async fn start_unpointed() -> Result<Forwarder, SetupError> {
        Forwarder::listen(None).await
    }

    async fn listen(target: Option<Target>) -> Result<Forwarder, SetupError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| SetupError::Server(format!("bind a forwarder: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| SetupError::Server(format!("a forwarder's address: {e}")))?
            .port();
        let (switch, _) = watch::channel(Switch {
            target,
            open: true,
            generation: 0,
        });
        let connections = Arc::new(Mutex::new(JoinSet::new()));
        let accept = tokio::spawn(accept(listener, switch.clone(), Arc::clone(&connections)));
        Ok(Forwarder {
            port,
            switch,
            connections,
            accept,
        })
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Connect options through the forwarder (user and database
    /// `postgres`, as the formations' servers have them).
    pub fn options(&self) -> PgConnectOptions {
        host::local_options(self.port)
    }

    /// Forwards nothing more, in either direction, until
    /// [`Forwarder::open`] or [`Forwarder::cut`]; connections stay open,
    /// and new ones are accepted and connected to the target, but carry
    /// nothing either. What arrives meanwhile, a close included, is held
    /// back.
    pub fn freeze(&self) {
        self.switch.send_modify(|switch| switch.open = false);
    }

    /// Forwards again, first what was held back.
    pub fn open(&self) {
        self.switch.send_modify(|switch| switch.open = true);
    }

    /// Drops every connection, and what it held back, and opens.
    pub fn cut(&self) {
        self.switch.send_modify(|switch| {
            switch.generation += 1;
            switch.open = true;
        });
        lock(&self.connections).abort_all();
    }

    /// Carries new connections to `target` and drops the current ones, so
    /// that their clients reconnect (to `target`). Frozen stays frozen.
    pub fn repoint(&self, target: Target) {
        self.switch.send_modify(|switch| {
            switch.generation += 1;
            switch.target = Some(target);
        });
        lock(&self.connections).abort_all();
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.accept.abort();
        lock(&self.connections).abort_all();
    }
}

/// Accepts connections on `listener` for as long as the forwarder runs,
/// each carried on a task of `connections` to the target of the moment.
async fn accept(
    listener: TcpListener,
    switch: watch::Sender<Switch>,
    connections: Arc<Mutex<JoinSet<()>>>,
) {
    while let Ok((client, _)) = listener.accept().await {
        // Target and generation read together: a connection accepted as
        // the forwarder is re-pointed either goes to the new target or
        // belongs to the old generation, which forwards nothing.
        let Switch {
            target, generation, ..
        } = switch.borrow().clone();
        let watching = switch.subscribe();
        let mut connections = lock(&connections);
        // Finished connections' tasks, reaped so that the set stays small.
        while connections.try_join_next().is_some() {}
        connections.spawn(carry(client, target, generation, watching));
    }
}

/// Connects `client` to `target` and forwards both ways until both
/// directions have ended; with no target, closes it.
async fn carry(
    client: TcpStream,
    target: Option<Target>,
    generation: u64,
    switch: watch::Receiver<Switch>,
) {
    let _ = client.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    match target {
        None => {}
        Some(Target::Tcp(address)) => {
            let Ok(server) = TcpStream::connect(address).await else {
                return;
            };
            let _ = server.set_nodelay(true);
            let (server_read, server_write) = server.into_split();
            tokio::join!(
                pump(client_read, server_write, generation, switch.clone()),
                pump(server_read, client_write, generation, switch),
            );
        }
        Some(Target::Unix(path)) => {
            let Ok(server) = UnixStream::connect(path).await else {
                return;
            };
            let (server_read, server_write) = server.into_split();
            tokio::join!(
                pump(client_read, server_write, generation, switch.clone()),
                pump(server_read, client_write, generation, switch),
            );
        }
    }
}

/// Copies `from` to `to` while the forwarder is open. Each chunk read,
/// and an end of stream or an error, waits until it is open; while it
/// waits nothing more is read, so the rest stays in the socket's buffers.
/// Ending drops `to`, which shuts its write side down: the other end sees
/// the close. A connection of an older generation (cut, or re-pointed)
/// ends without forwarding more.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    generation: u64,
    mut switch: watch::Receiver<Switch>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = from.read(&mut buffer).await;
        if !passable(&mut switch, generation).await {
            return;
        }
        let read = match read {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

/// Waits until the forwarder is open; whether a connection of
/// `generation` may forward then (false: it was cut or re-pointed, or the
/// forwarder is gone).
async fn passable(switch: &mut watch::Receiver<Switch>, generation: u64) -> bool {
    switch
        .wait_for(|switch| switch.open || switch.generation != generation)
        .await
        .is_ok_and(|switch| switch.generation == generation)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream, UnixListener};

    use super::{Forwarder, Target};

    /// How long a test waits for what must happen (a bound against a
    /// hang, not a pause), and how long it watches for what must not.
    const BOUND: Duration = Duration::from_secs(10);
    const QUIET: Duration = Duration::from_millis(300);

    async fn listener() -> (TcpListener, Target) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        (listener, Target::port(port))
    }

    /// A client through `forwarder` and the server end `target` accepted.
    async fn pair(forwarder: &Forwarder, target: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(("127.0.0.1", forwarder.port()))
            .await
            .expect("connect to the forwarder");
        let (server, _) = tokio::time::timeout(BOUND, target.accept())
            .await
            .expect("the forwarder connects to its target")
            .expect("accept");
        (client, server)
    }

    /// Reads exactly `want.len()` bytes from `stream` and checks them.
    async fn receive(stream: &mut (impl AsyncReadExt + Unpin), want: &[u8]) {
        let mut got = vec![0u8; want.len()];
        tokio::time::timeout(BOUND, stream.read_exact(&mut got))
            .await
            .expect("the bytes arrive")
            .expect("read");
        assert_eq!(got, want);
    }

    /// Whether `stream` is closed: it reads an end of stream or an error,
    /// and no byte.
    async fn closed(stream: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(BOUND, stream.read(&mut byte)).await {
            Ok(Ok(0) | Err(_)) => true,
            Ok(Ok(_)) | Err(_) => false,
        }
    }

    /// Whether nothing (no byte, no close) arrives on `stream` for
    /// [`QUIET`].
    async fn quiet(stream: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        tokio::time::timeout(QUIET, stream.read(&mut byte))
            .await
            .is_err()
    }

    #[tokio::test]
    async fn frozen_holds_bytes_both_ways_and_delivers_them_on_open() {
        let (target, to) = listener().await;
        let forwarder = Forwarder::start(to).await.expect("start");
        let (mut client, mut server) = pair(&forwarder, &target).await;
        client.write_all(b"before").await.expect("write");
        receive(&mut server, b"before").await;

        forwarder.freeze();
        client.write_all(b"held").await.expect("write");
        server.write_all(b"back").await.expect("write");
        assert!(quiet(&mut server).await, "nothing passes while frozen");
        assert!(quiet(&mut client).await, "nor the other way");

        forwarder.open();
        receive(&mut server, b"held").await;
        receive(&mut client, b"back").await;
    }

    #[tokio::test]
    async fn frozen_holds_a_close_until_open() {
        let (target, to) = listener().await;
        let forwarder = Forwarder::start(to).await.expect("start");
        let (mut client, mut server) = pair(&forwarder, &target).await;

        forwarder.freeze();
        client.shutdown().await.expect("close the client's side");
        assert!(
            quiet(&mut server).await,
            "a frozen network delivers no close"
        );

        forwarder.open();
        assert!(closed(&mut server).await, "the close arrives on open");
        server.write_all(b"after").await.expect("write");
        receive(&mut client, b"after").await;
    }

    #[tokio::test]
    async fn cut_drops_connections_and_what_they_held_and_opens() {
        let (target, to) = listener().await;
        let forwarder = Forwarder::start(to).await.expect("start");
        let (mut client, mut server) = pair(&forwarder, &target).await;

        forwarder.freeze();
        client.write_all(b"lost").await.expect("write");
        forwarder.cut();
        assert!(closed(&mut server).await, "the server's side is dropped");
        assert!(closed(&mut client).await, "so is the client's");

        let (mut client, mut server) = pair(&forwarder, &target).await;
        client.write_all(b"open").await.expect("write");
        receive(&mut server, b"open").await;
    }

    #[tokio::test]
    async fn repoint_sends_new_connections_to_the_new_target_and_drops_the_old() {
        let (first, to_first) = listener().await;
        let (second, to_second) = listener().await;
        let forwarder = Forwarder::start(to_first).await.expect("start");
        let (mut old_client, mut old_server) = pair(&forwarder, &first).await;

        forwarder.repoint(to_second);
        assert!(
            closed(&mut old_client).await,
            "the old connection is dropped"
        );
        assert!(closed(&mut old_server).await);
        let (mut client, mut server) = pair(&forwarder, &second).await;
        client.write_all(b"new").await.expect("write");
        receive(&mut server, b"new").await;
        server.write_all(b"back").await.expect("write");
        receive(&mut client, b"back").await;
    }

    #[tokio::test]
    async fn unpointed_closes_what_it_accepts_until_pointed() {
        let (target, to) = listener().await;
        let forwarder = Forwarder::start_unpointed().await.expect("start");
        let mut early = TcpStream::connect(("127.0.0.1", forwarder.port()))
            .await
            .expect("connect");
        assert!(closed(&mut early).await);

        forwarder.repoint(to);
        let (mut client, mut server) = pair(&forwarder, &target).await;
        client.write_all(b"pointed").await.expect("write");
        receive(&mut server, b"pointed").await;
    }

    #[tokio::test]
    async fn a_unix_target_works() {
        let dir = std::env::temp_dir().join(format!(
            "pglease-forward-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the socket");
        let path = dir.join("socket");
        let _ = std::fs::remove_file(&path);
        let target = UnixListener::bind(&path).expect("bind the unix socket");
        let forwarder = Forwarder::start(Target::Unix(path)).await.expect("start");
        let mut client = TcpStream::connect(("127.0.0.1", forwarder.port()))
            .await
            .expect("connect");
        let (mut server, _) = tokio::time::timeout(BOUND, target.accept())
            .await
            .expect("the forwarder connects to the socket")
            .expect("accept");
        client.write_all(b"over tcp").await.expect("write");
        receive(&mut server, b"over tcp").await;
        server.write_all(b"over unix").await.expect("write");
        receive(&mut client, b"over unix").await;
        drop(forwarder);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
