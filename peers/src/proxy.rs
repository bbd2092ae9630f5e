//! A TCP proxy in front of the server that can be frozen: while frozen it
//! forwards nothing in either direction, but keeps every connection open,
//! as a network that stops answering (or a paused process) does. Bytes
//! sent meanwhile are delivered when it thaws.

use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::watch;

/// Where the server listens.
#[derive(Debug, Clone)]
pub enum Target {
    /// TCP.
    Tcp(SocketAddr),
    /// A unix socket (`DIR/.s.PGSQL.PORT`).
    Unix(PathBuf),
}

/// The proxy; it stops when dropped.
pub struct Proxy {
    port: u16,
    frozen: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `target`.
    pub async fn start(target: Target) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (frozen, watching) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let target = target.clone();
                let watching = watching.clone();
                tokio::spawn(async move {
                    let _ = client.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    match target {
                        Target::Tcp(addr) => {
                            let Ok(server) = TcpStream::connect(addr).await else {
                                return;
                            };
                            let _ = server.set_nodelay(true);
                            let (server_read, server_write) = server.into_split();
                            pump_both(
                                client_read,
                                client_write,
                                server_read,
                                server_write,
                                watching,
                            )
                            .await;
                        }
                        Target::Unix(path) => {
                            let Ok(server) = UnixStream::connect(path).await else {
                                return;
                            };
                            let (server_read, server_write) = server.into_split();
                            pump_both(
                                client_read,
                                client_write,
                                server_read,
                                server_write,
                                watching,
                            )
                            .await;
                        }
                    }
                });
            }
        });
        Ok(Proxy { port, frozen, task })
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops forwarding (connections stay open).
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Forwards again, first what was held back.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump_both(
    client_read: impl AsyncRead + Unpin,
    client_write: impl AsyncWrite + Unpin,
    server_read: impl AsyncRead + Unpin,
    server_write: impl AsyncWrite + Unpin,
    frozen: watch::Receiver<bool>,
) {
    tokio::select! {
        () = pump(client_read, server_write, frozen.clone()) => {}
        () = pump(server_read, client_write, frozen) => {}
    }
}

/// Copies `from` to `to`, holding each chunk while frozen.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => {
                // A frozen network delivers no close either.
                let _ = frozen.wait_for(|f| !f).await;
                return;
            }
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !f).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}
