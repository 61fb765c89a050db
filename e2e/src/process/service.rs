//! A service binary as a process of the test's own.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::{binary, free_port};

/// Which service a [`Service`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// orders-service (with its relay).
    Orders,
    /// billing-service.
    Billing,
}

impl Kind {
    /// The binary's name.
    fn name(self) -> &'static str {
        match self {
            Self::Orders => "orders-service",
            Self::Billing => "billing-service",
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

/// How long a service may take to be ready: longer than it waits at start-up for its database
/// and its stream, which a cluster restarting can use up.
const READY_WITHIN: Duration =
    Duration::from_secs(service_kit::infra::START_UP_WAIT.as_secs() + 30);

impl Service {
    /// Starts `kind` with `env` (on a fresh port) and waits until it is ready.
    pub async fn start(kind: Kind, mut env: Vec<(String, String)>, log_dir: &Path) -> Self {
        let port = free_port();
        env.push(("LISTEN_ADDR".into(), format!("127.0.0.1:{port}")));
        let log = log_dir.join(format!("{}-{port}.log", kind.name()));
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
        self.respawn();
        self.ready().await;
    }

    /// Starts the process again with the same settings, without waiting: for a start that may
    /// end before the process is ready (a failpoint).
    pub fn respawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let child = Command::new(binary(self.kind.name()))
            // JSON lines, which e2e/tests/tracing.rs reads back field by field.
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
    }

    /// Waits until the running process answers `/readyz` 200; panics if it exits first.
    async fn ready(&mut self) {
        let name = self.kind.name();
        let ready = format!("{}/readyz", self.url);
        // A request answered at once, or retried: a port open before the app serves must not
        // hold the wait past its bound.
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("HTTP client");
        let deadline = std::time::Instant::now() + READY_WITHIN;
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
                "{name} not ready within {READY_WITHIN:?} ({exited:?}); its log ends:\n{}",
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
