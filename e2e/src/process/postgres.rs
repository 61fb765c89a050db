//! A PostgreSQL cluster of a scenario's own.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use super::free_port;

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
