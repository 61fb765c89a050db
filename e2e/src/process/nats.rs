//! nats-server as a process of the test's own.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::TryStreamExt;
use service_kit::testing::{self, eventually};
use tokio::process::{Child, Command};

use super::{TlsFiles, free_port};

/// A nats-server with JetStream on its own port and store directory.
#[derive(Debug)]
pub struct NatsServer {
    /// Its port.
    pub port: u16,
    /// User and password clients must present, when the server requires them.
    pub credentials: Option<(String, String)>,
    /// Its TLS files, when it requires TLS.
    pub tls: Option<TlsFiles>,
    /// Its place in a JetStream cluster, when it is one of several nodes.
    pub node: Option<Node>,
    /// The largest message it takes, when not the default (1 MB).
    pub max_payload: Option<usize>,
    /// Configuration file lines of its own (accounts, limits), read at every (re)start.
    pub config: Option<String>,
    /// The nats-server program, when not the machine's own.
    pub program: Option<PathBuf>,
    /// Its environment besides the test's (what its configuration reads).
    pub env: Vec<(String, String)>,
    store: PathBuf,
    child: Option<Child>,
}

/// One node of a JetStream cluster on loopback.
#[derive(Debug, Clone)]
pub struct Node {
    /// The server's name, as stream info reports its leader.
    pub name: String,
    /// The cluster's name.
    pub cluster: String,
    /// Where it listens for routes from the other nodes.
    pub route_port: u16,
    /// The other nodes' route ports.
    pub peers: Vec<u16>,
}

impl NatsServer {
    /// Starts a server in a fresh store directory under `dir`.
    pub async fn start(dir: &Path) -> Self {
        Self::start_with(dir, None).await
    }

    /// Starts a server that requires `credentials` (user, password) when given.
    pub async fn start_with(dir: &Path, credentials: Option<(String, String)>) -> Self {
        Self::launch(dir, credentials, None).await
    }

    /// Starts a server that takes messages of up to `max_payload` bytes.
    pub async fn start_with_max_payload(dir: &Path, max_payload: usize) -> Self {
        let mut server = Self::unstarted(dir, None, None, None);
        server.max_payload = Some(max_payload);
        server.start_fresh().await;
        server
    }

    /// Starts a server that requires TLS with the certificate of `tls`.
    pub async fn start_tls(dir: &Path, tls: TlsFiles) -> Self {
        Self::launch(dir, None, Some(tls)).await
    }

    /// Starts `nodes` servers routed to each other as one JetStream cluster and waits until
    /// JetStream answers on each of them.
    pub async fn start_cluster(dir: &Path, nodes: usize) -> Vec<Self> {
        let cluster = testing::unique("c");
        let route_ports: Vec<u16> = (0..nodes).map(|_| free_port()).collect();
        let mut servers = Vec::new();
        for (i, &route_port) in route_ports.iter().enumerate() {
            let node = Node {
                name: format!("n{i}"),
                cluster: cluster.clone(),
                route_port,
                peers: route_ports
                    .iter()
                    .copied()
                    .filter(|&p| p != route_port)
                    .collect(),
            };
            servers.push(Self::unstarted(dir, None, None, Some(node)));
        }
        for server in &mut servers {
            server.restart().await;
        }
        for server in &servers {
            server.jetstream_ready().await;
        }
        servers
    }

    async fn launch(
        dir: &Path,
        credentials: Option<(String, String)>,
        tls: Option<TlsFiles>,
    ) -> Self {
        let mut server = Self::unstarted(dir, credentials, tls, None);
        server.start_fresh().await;
        server
    }

    fn unstarted(
        dir: &Path,
        credentials: Option<(String, String)>,
        tls: Option<TlsFiles>,
        node: Option<Node>,
    ) -> Self {
        let store = dir.join(format!("nats-{}", testing::unique("store")));
        std::fs::create_dir_all(&store).expect("store dir");
        Self {
            port: free_port(),
            credentials,
            tls,
            node,
            max_payload: None,
            config: None,
            program: None,
            env: Vec::new(),
            store,
            child: None,
        }
    }

    /// Starts a server whose configuration file holds `config` besides the command line's
    /// settings, with `env` in its environment; clients present `credentials` (user, password)
    /// in the URL when given.
    pub async fn start_with_config(
        dir: &Path,
        config: String,
        env: Vec<(String, String)>,
        credentials: Option<(String, String)>,
    ) -> Self {
        let mut server = Self::unstarted(dir, None, None, None);
        server.credentials = credentials;
        server.config = Some(config);
        server.env = env;
        server.start_fresh().await;
        server
    }

    /// Starts `program` (a nats-server of another version than the machine's) with `config` in
    /// its configuration file.
    pub async fn start_program(dir: &Path, program: PathBuf, config: Option<String>) -> Self {
        let mut server = Self::unstarted(dir, None, None, None);
        server.program = Some(program);
        server.config = config;
        server.start_fresh().await;
        server
    }

    /// Copies the store of a stopped server (a snapshot of it, as a power loss at this moment
    /// would leave it) and returns where the copy is.
    pub fn copy_store(&self) -> PathBuf {
        assert!(self.child.is_none(), "copy the store of a stopped server");
        let copy = self.store.with_extension(testing::unique("copy"));
        copy_dir(&self.store, &copy);
        copy
    }

    /// Puts `copy` (from [`NatsServer::copy_store`]) in place of the store of a stopped server:
    /// it restarts with what the store held then, everything written since lost.
    pub fn restore_store(&self, copy: &Path) {
        assert!(
            self.child.is_none(),
            "restore the store of a stopped server"
        );
        std::fs::remove_dir_all(&self.store).expect("store removed");
        copy_dir(copy, &self.store);
    }

    /// Empties the store of a stopped server: it restarts with nothing.
    pub fn wipe_store(&self) {
        assert!(self.child.is_none(), "wipe the store of a stopped server");
        std::fs::remove_dir_all(&self.store).expect("store removed");
        std::fs::create_dir_all(&self.store).expect("store dir");
    }

    /// Removes the files of stream `name` from under this running server. nats-server 2.9 does
    /// this itself to a stream made again at once after it was deleted, under load: the old
    /// stream's removal takes the new one's files. The stream then acknowledges every publish
    /// and returns none of its messages.
    pub fn remove_stream_files(&self, name: &str) {
        assert!(
            self.child.is_some(),
            "remove files from under a running server"
        );
        let accounts = self.store.join("jetstream");
        let removed = std::fs::read_dir(&accounts)
            .expect("JetStream's store")
            .filter_map(|account| {
                let dir = account.ok()?.path().join("streams").join(name);
                // Moved out first, at once: the server may write new files while they go.
                let aside = self.store.with_extension(testing::unique("removed"));
                std::fs::rename(&dir, &aside).ok()?;
                std::fs::remove_dir_all(&aside).ok()
            })
            .count();
        assert_eq!(
            removed,
            1,
            "stream {name} in one account of {}",
            accounts.display()
        );
    }

    /// Waits until this server answers JetStream requests (in a cluster: a meta leader exists).
    pub async fn jetstream_ready(&self) {
        let (url, security) = (self.url(), self.security());
        eventually("JetStream to answer", Duration::from_secs(30), || {
            let (url, security) = (url.clone(), security.clone());
            async move {
                let client = service_kit::infra::connect_nats_with(&url, "e2e", &security)
                    .await
                    .ok()?;
                // Listing streams needs the meta leader: the cluster has formed.
                let names = async_nats::jetstream::new(client).stream_names();
                names.try_collect::<Vec<String>>().await.ok().map(drop)
            }
        })
        .await;
    }

    /// The URL without credentials, for a client that presents its own.
    pub fn plain_url(&self) -> String {
        let scheme = if self.tls.is_some() { "tls" } else { "nats" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// `nats://127.0.0.1:{port}` (with the credentials, if any), or `tls://…` with TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "tls" } else { "nats" };
        match &self.credentials {
            Some((user, password)) => {
                format!("{scheme}://{user}:{password}@127.0.0.1:{}", self.port)
            }
            None => format!("{scheme}://127.0.0.1:{}", self.port),
        }
    }

    /// What a client needs besides the URL: the CA to trust, with TLS.
    pub fn security(&self) -> service_kit::infra::NatsSecurity {
        service_kit::infra::NatsSecurity {
            tls_ca_file: self
                .tls
                .as_ref()
                .map(|tls| tls.ca.to_string_lossy().into_owned()),
            ..Default::default()
        }
    }

    /// The nats-server program: the one given, or the machine's.
    fn program(&self) -> PathBuf {
        self.program.clone().unwrap_or_else(|| {
            [
                "/usr/sbin/nats-server",
                "/usr/local/bin/nats-server",
                "nats-server",
            ]
            .into_iter()
            .find(|p| !p.starts_with('/') || Path::new(p).exists())
            .unwrap_or("nats-server")
            .into()
        })
    }

    /// Writes what the command line cannot set to a configuration file, if anything, with
    /// JetStream's store (a reload that found JetStream set on the command line only would
    /// turn it off).
    fn write_config(&self) -> Option<PathBuf> {
        let lines: Vec<String> = self
            .max_payload
            .map(|bytes| format!("max_payload: {bytes}"))
            .into_iter()
            .chain(self.config.clone())
            .collect();
        (!lines.is_empty()).then(|| {
            let path = self.store.with_extension("conf");
            let jetstream = format!("jetstream {{ store_dir: \"{}\" }}", self.store.display());
            std::fs::write(&path, format!("{jetstream}\n{}\n", lines.join("\n")))
                .expect("config written");
            path
        })
    }

    /// Has the running server read its configuration again (SIGHUP), as an operator changes a
    /// limit without a restart.
    pub async fn reload(&self) {
        let config = self.write_config();
        assert!(config.is_some(), "a reload reads a configuration file");
        let pid = self
            .child
            .as_ref()
            .and_then(tokio::process::Child::id)
            .expect("nats-server running");
        let sent = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .await
            .expect("kill runs");
        assert!(sent.success(), "SIGHUP sent");
    }

    /// Starts the stopped server again, on its port (its clients' URLs hold it).
    pub async fn restart(&mut self) {
        assert!(
            self.spawn_accepting().await,
            "nats-server exited at start: its port {} was taken? (see {})",
            self.port,
            self.store.with_extension("log").display()
        );
    }

    /// Spawns the server; true once it accepts connections, false when it exited first.
    async fn spawn_accepting(&mut self) -> bool {
        let server = self.program();
        let config = self.write_config();
        let child = Command::new(server)
            .args(
                config
                    .iter()
                    .flat_map(|path| ["-c".into(), path.clone().into_os_string()]),
            )
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(
                config
                    .is_none()
                    .then(|| {
                        [
                            "-js".into(),
                            "-sd".into(),
                            self.store.clone().into_os_string(),
                        ]
                    })
                    .into_iter()
                    .flatten(),
            )
            .arg("-l")
            .arg(self.store.with_extension("log"))
            .args(
                self.credentials
                    .iter()
                    .filter(|_| self.config.is_none())
                    .flat_map(|(user, password)| {
                        [
                            "--user".to_owned(),
                            user.clone(),
                            "--pass".to_owned(),
                            password.clone(),
                        ]
                    }),
            )
            .args(self.node.iter().flat_map(|node| {
                let routes: Vec<String> = node
                    .peers
                    .iter()
                    .map(|port| format!("nats://127.0.0.1:{port}"))
                    .collect();
                [
                    "--name".to_owned(),
                    node.name.clone(),
                    "--cluster_name".to_owned(),
                    node.cluster.clone(),
                    "--cluster".to_owned(),
                    format!("nats://127.0.0.1:{}", node.route_port),
                    "--routes".to_owned(),
                    routes.join(","),
                ]
            }))
            .args(self.tls.iter().flat_map(|tls| {
                [
                    "--tls".into(),
                    "--tlscert".into(),
                    tls.cert.clone().into_os_string(),
                    "--tlskey".into(),
                    tls.key.clone().into_os_string(),
                ]
            }))
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server starts");
        self.child = Some(child);
        self.accepting().await
    }

    /// Starts a server no client knows yet: on another free port when the one it was given was
    /// taken between `free_port` and the server's bind (by a program outside the tests).
    async fn start_fresh(&mut self) {
        for _ in 0..3 {
            if self.spawn_accepting().await {
                return;
            }
            self.port = free_port();
        }
        panic!(
            "nats-server exited at start three times: see {}",
            self.store.with_extension("log").display()
        );
    }

    /// Waits until this server accepts connections: true, or false when it exited first. A
    /// connection alone is not enough: another server may hold the port this one could not bind.
    async fn accepting(&mut self) -> bool {
        let (url, security) = (self.url(), self.security());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let child = self.child.as_mut().expect("spawned");
            if !matches!(child.try_wait(), Ok(None)) {
                return false;
            }
            if service_kit::infra::connect_nats_with(&url, "e2e", &security)
                .await
                .is_ok()
            {
                let child = self.child.as_mut().expect("spawned");
                return matches!(child.try_wait(), Ok(None));
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "nats-server did not accept connections within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL, and waits until it is gone.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.expect("kill nats-server");
        }
    }
}

/// `cp -a from to`: a directory and everything in it.
fn copy_dir(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp runs");
    assert!(status.success(), "copying {} failed", from.display());
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.store);
    }
}
