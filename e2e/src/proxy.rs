//! A TCP proxy between a client and a server on loopback that can swallow the server's replies
//! (publishes reach nats-server but their acknowledgements are lost), cut the path both ways
//! for good while every connection stays open, as a dead network does (nothing gets through
//! and neither side is told), or take the server down for a while: every connection closed, and
//! each new one closed as soon as it is made.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The proxy; it stops accepting, and drops its connections, when dropped.
#[derive(Debug)]
pub struct Proxy {
    /// The port clients connect to.
    pub port: u16,
    modes: Arc<Modes>,
    accept: JoinHandle<()>,
}

#[derive(Debug, Default)]
struct Modes {
    swallow: AtomicBool,
    cut: AtomicBool,
    down: AtomicBool,
    /// Cancelled to close every connection made before it.
    close: Mutex<CancellationToken>,
}

impl Modes {
    fn close(&self) -> std::sync::MutexGuard<'_, CancellationToken> {
        self.close.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Proxy {
    /// Forwards `127.0.0.1:{port}` to `127.0.0.1:{upstream}`.
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy port");
        let port = listener.local_addr().expect("address").port();
        let modes = Arc::new(Modes::default());
        let shared = modes.clone();
        let accept = tokio::spawn(async move {
            let mut pipes = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                while pipes.try_join_next().is_some() {}
                if shared.down.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let close = shared.close().clone();
                for (from, to, replies) in [
                    (client_read, server_write, false),
                    (server_read, client_write, true),
                ] {
                    let (modes, close) = (shared.clone(), close.clone());
                    pipes.spawn(async move {
                        tokio::select! {
                            () = forward(from, to, modes, replies) => {}
                            () = close.cancelled() => {}
                        }
                    });
                }
            }
        });
        Self {
            port,
            modes,
            accept,
        }
    }

    /// While down, every connection is closed and each new one is closed as soon as it is made,
    /// as by a server that is restarting; once up again, connections are carried as before.
    pub fn set_down(&self, down: bool) {
        self.modes.down.store(down, Ordering::SeqCst);
        if down {
            std::mem::take(&mut *self.modes.close()).cancel();
        }
    }

    /// `nats://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// While on, bytes from the server are read and dropped.
    pub fn swallow_replies(&self, on: bool) {
        self.modes.swallow.store(on, Ordering::SeqCst);
    }

    /// From now on bytes either way are read and dropped, and a side that closes is not told
    /// to the other: the connections look alive and carry nothing. There is no way back (the
    /// bytes dropped are gone); drop the proxy to close them.
    pub fn cut(&self) {
        self.modes.cut.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Dropping the accept task drops its JoinSet, which aborts every pipe.
        self.accept.abort();
    }
}

/// Copies `from` to `to` until either side closes, dropping what the modes say to drop.
async fn forward(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    modes: Arc<Modes>,
    replies: bool,
) {
    let mut buffer = vec![0_u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let cut = modes.cut.load(Ordering::SeqCst);
        let dropped = cut || (replies && modes.swallow.load(Ordering::SeqCst));
        if !dropped && to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    if modes.cut.load(Ordering::SeqCst) {
        // A dead network does not carry the close either.
        std::future::pending::<()>().await;
    }
}
