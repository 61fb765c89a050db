//! A TCP proxy between a client and a server on loopback that can swallow the server's replies
//! (publishes reach nats-server but their acknowledgements are lost), or cut the path both ways
//! for good while every connection stays open, as a dead network does: nothing gets through
//! and neither side is told.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

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
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                pipes.spawn(forward(client_read, server_write, shared.clone(), false));
                pipes.spawn(forward(server_read, client_write, shared.clone(), true));
            }
        });
        Self {
            port,
            modes,
            accept,
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
