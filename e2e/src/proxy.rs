//! A TCP proxy between a service and nats-server that can swallow the server's replies, so
//! publishes reach the broker but their acknowledgements are lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The proxy; it stops accepting when dropped.
#[derive(Debug)]
pub struct Proxy {
    /// The port clients connect to.
    pub port: u16,
    swallow: Arc<AtomicBool>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Forwards `127.0.0.1:{port}` to `127.0.0.1:{upstream}`.
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy port");
        let port = listener.local_addr().expect("address").port();
        let swallow = Arc::new(AtomicBool::new(false));
        let flag = swallow.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                tokio::spawn(pipe(client, server, flag.clone()));
            }
        });
        Self {
            port,
            swallow,
            accept,
        }
    }

    /// `nats://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// While on, bytes from the server are read and dropped.
    pub fn swallow_replies(&self, on: bool) {
        self.swallow.store(on, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn pipe(client: TcpStream, server: TcpStream, swallow: Arc<AtomicBool>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    });
    let mut buffer = vec![0_u8; 64 * 1024];
    loop {
        let n = match server_read.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !swallow.load(Ordering::SeqCst) && client_write.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    upstream.abort();
}
