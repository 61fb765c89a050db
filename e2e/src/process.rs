//! Real processes: the service binaries and nats-server, each on its own port, killed and
//! restarted by the scenarios.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use futures::TryStreamExt;
use service_kit::testing::{self, eventually};
use tokio::process::{Child, Command};

/// A free TCP port on loopback (bound and released; the race is harmless in tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The path of service binary `name`: in `SERVICES_BIN_DIR` when set (`scripts/test` sets it
/// to the binaries it copied out of the image), else built once per test process with
/// `scripts/build-services` (the Dockerfile's build).
pub fn binary(name: &str) -> PathBuf {
    static BIN_DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = BIN_DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("SERVICES_BIN_DIR").filter(|dir| !dir.is_empty()) {
            return PathBuf::from(dir);
        }
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let status = std::process::Command::new(workspace.join("scripts/build-services"))
            .arg("--quiet")
            .current_dir(&workspace)
            .status()
            .expect("scripts/build-services runs");
        assert!(status.success(), "building the service binaries failed");
        target_dir(&workspace).join("release")
    });
    dir.join(name)
}

/// Where cargo puts the workspace's builds, as `cargo metadata` says (it honours
/// `CARGO_TARGET_DIR` and `build.target-dir` of any cargo config).
fn target_dir(workspace: &Path) -> PathBuf {
    #[derive(serde::Deserialize)]
    struct Metadata {
        target_directory: PathBuf,
    }
    let output = std::process::Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace)
        .stderr(Stdio::inherit())
        .output()
        .expect("cargo metadata runs");
    assert!(output.status.success(), "cargo metadata failed");
    serde_json::from_slice::<Metadata>(&output.stdout)
        .expect("cargo metadata's JSON")
        .target_directory
}

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
        server.restart().await;
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
        server.restart().await;
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
            store,
            child: None,
        }
    }

    /// Starts a server whose configuration file holds `config` besides the command line's
    /// settings; clients present `credentials` (user, password) in the URL when given.
    pub async fn start_with_config(
        dir: &Path,
        config: String,
        credentials: Option<(String, String)>,
    ) -> Self {
        let mut server = Self::unstarted(dir, None, None, None);
        server.credentials = credentials;
        server.config = Some(config);
        server.restart().await;
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

    /// Starts the server again on the same port and store.
    pub async fn restart(&mut self) {
        let server = [
            "/usr/sbin/nats-server",
            "/usr/local/bin/nats-server",
            "nats-server",
        ]
        .into_iter()
        .find(|p| !p.starts_with('/') || Path::new(p).exists())
        .unwrap_or("nats-server");
        // What the command line cannot set goes into a configuration file.
        let lines: Vec<String> = self
            .max_payload
            .map(|bytes| format!("max_payload: {bytes}"))
            .into_iter()
            .chain(self.config.clone())
            .collect();
        let config = (!lines.is_empty()).then(|| {
            let path = self.store.with_extension("conf");
            std::fs::write(&path, lines.join("\n") + "\n").expect("config written");
            path
        });
        let child = Command::new(server)
            .args(
                config
                    .iter()
                    .flat_map(|path| ["-c".into(), path.clone().into_os_string()]),
            )
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.store)
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
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server starts");
        self.child = Some(child);
        let (url, security) = (self.url(), self.security());
        eventually(
            "nats-server to accept connections",
            Duration::from_secs(20),
            || {
                let (url, security) = (url.clone(), security.clone());
                async move {
                    service_kit::infra::connect_nats_with(&url, "e2e", &security)
                        .await
                        .ok()
                        .map(drop)
                }
            },
        )
        .await;
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

/// Which service a [`Service`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// orders-service (with its relay).
    Orders,
    /// billing-service.
    Billing,
}

/// A CA and a server certificate for 127.0.0.1 that it signed, as PEM files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA's certificate: what clients trust.
    pub ca: PathBuf,
    /// The server's certificate.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
}

impl TlsFiles {
    /// Makes a fresh CA and server certificate in `dir` with the `openssl` command.
    pub fn generate(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("TLS folder");
        let openssl = |args: &[&str]| {
            let status = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("openssl runs");
            assert!(status.success(), "openssl {args:?} failed");
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &[
                &["req", "-x509", "-days", "1", "-subj", "/CN=e2e test CA"][..],
                &ec,
                &["-keyout", "ca.key", "-out", "ca.pem"],
            ]
            .concat(),
        );
        openssl(
            &[
                &["req", "-subj", "/CN=127.0.0.1"][..],
                &ec,
                &["-keyout", "server.key", "-out", "server.csr"],
            ]
            .concat(),
        );
        std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("ext file");
        openssl(&[
            "x509",
            "-req",
            "-days",
            "1",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            "san.ext",
            "-out",
            "server.pem",
        ]);
        Self {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        }
    }
}

/// A service binary running as its own process.
#[derive(Debug)]
pub struct Service {
    /// Which binary.
    pub kind: Kind,
    /// `http://127.0.0.1:{port}`.
    pub url: String,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Service {
    /// Starts `kind` with `env` (on a fresh port) and waits until it is ready.
    pub async fn start(kind: Kind, mut env: Vec<(String, String)>, log_dir: &Path) -> Self {
        let port = free_port();
        env.push(("LISTEN_ADDR".into(), format!("127.0.0.1:{port}")));
        let name = match kind {
            Kind::Orders => "orders-service",
            Kind::Billing => "billing-service",
        };
        let log = log_dir.join(format!("{name}-{port}.log"));
        let mut service = Self {
            kind,
            url: format!("http://127.0.0.1:{port}"),
            env,
            log,
            child: None,
        };
        service.restart().await;
        service
    }

    /// Starts the process again with the same settings and waits until it is ready.
    pub async fn restart(&mut self) {
        let name = match self.kind {
            Kind::Orders => "orders-service",
            Kind::Billing => "billing-service",
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let child = Command::new(binary(name))
            .env("LOG_FORMAT", "json")
            // Warnings and errors only: a line per request and per message (the default, `info`)
            // would fill the log files of long runs. Interleaved benchmark runs at both levels
            // did not differ beyond their noise (docs/performance.md, 2026-12-04).
            .env("RUST_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::from(log.try_clone().expect("log file")))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("service starts");
        self.child = Some(child);
        let ready = format!("{}/readyz", self.url);
        let client = reqwest::Client::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let answer = client.get(&ready).send().await;
            if answer.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            assert!(
                exited.is_none() && std::time::Instant::now() < deadline,
                "{name} not ready within 30 s ({exited:?}); its log ends:\n{}",
                self.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The last `lines` lines of the process's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Sets (or, with `None`, removes) an environment variable for the next start.
    pub fn set_env(&mut self, name: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != name);
        if let Some(value) = value {
            self.env.push((name.to_owned(), value.to_owned()));
        }
    }

    /// Waits (bounded) until the process exits by itself.
    pub async fn exited(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .expect("the process exits within 60 s")
            .expect("exit status")
    }

    /// SIGKILL: no shutdown, no flush, whatever is in flight is lost.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.expect("kill service");
        }
    }

    /// SIGTERM, then waits (bounded) for a clean exit.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let pid = child.id().expect("pid").to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .expect("kill runs");
        assert!(sent.success());
        tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .expect("exits within 30 s after SIGTERM")
            .expect("exit status")
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A PostgreSQL cluster of the test's own (`initdb`, `pg_ctl`), for scenarios that restart it.
/// As root, its tools run as the `postgres` user, as PostgreSQL requires.
#[derive(Debug)]
pub struct PgServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
}

impl PgServer {
    /// Creates and starts a cluster under `dir`.
    pub async fn start(dir: &Path) -> Self {
        let server = Self {
            port: free_port(),
            dir: dir.join("pg"),
        };
        std::fs::create_dir_all(&server.dir).expect("pg dir");
        if is_root() {
            let chown = Command::new("chown")
                .arg("-R")
                .arg("postgres")
                .arg(&server.dir)
                .status();
            assert!(
                chown.await.is_ok_and(|s| s.success()),
                "chown of the pg dir"
            );
        }
        let data = server.data();
        run_pg_tool(
            "initdb",
            &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"],
        )
        .await;
        server.start_server().await;
        server
    }

    /// The URL of database `name` on this server.
    pub fn database_url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// `pg_ctl stop -m immediate` (every backend killed, no checkpoint), then start again.
    pub async fn restart_immediate(&self) {
        run_pg_tool(
            "pg_ctl",
            &["-D", &self.data(), "stop", "-m", "immediate", "-w"],
        )
        .await;
        self.start_server().await;
    }

    async fn start_server(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.display()
        );
        let log = format!("{}/server.log", self.dir.display());
        run_pg_tool(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "start",
            ],
        )
        .await;
    }

    fn data(&self) -> String {
        format!("{}/data", self.dir.display())
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let mut stop = pg_tool_command("pg_ctl");
        stop.args(["-D", &self.data(), "stop", "-m", "immediate"]);
        let _ = stop.status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// A PostgreSQL tool from the newest installed version, run as `postgres` when we are root.
fn pg_tool_command(name: &str) -> std::process::Command {
    let program = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .and_then(|versions| versions.filter_map(Result::ok).map(|e| e.path()).max())
        .map_or_else(
            || PathBuf::from(name),
            |version| version.join("bin").join(name),
        );
    if is_root() {
        let mut command = std::process::Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        std::process::Command::new(program)
    }
}

async fn run_pg_tool(name: &str, args: &[&str]) {
    let mut command = Command::from(pg_tool_command(name));
    command.args(args).stdout(Stdio::null());
    let status = command.status().await;
    assert!(status.is_ok_and(|s| s.success()), "{name} {args:?} failed");
}
