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
    /// The CA clients trust, when the server takes TLS connections only.
    ca: Option<PathBuf>,
}

impl PgServer {
    /// Creates and starts a cluster under `dir`.
    pub async fn start(dir: &Path) -> Self {
        Self::start_with(dir, None).await
    }

    /// Creates and starts a cluster under `dir` that takes TLS connections only, with the
    /// server certificate of `tls` (for 127.0.0.1); clients verify it against its CA
    /// (`sslmode=verify-full`), as a managed database asks.
    pub async fn start_tls(dir: &Path, tls: &super::TlsFiles) -> Self {
        Self::start_with(dir, Some(tls)).await
    }

    async fn start_with(dir: &Path, tls: Option<&super::TlsFiles>) -> Self {
        let server = Self {
            port: free_port(),
            dir: dir.join("pg"),
            ca: tls.map(|tls| tls.ca.clone()),
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
        if let Some(tls) = tls {
            server.take_tls_only(tls).await;
        }
        server.start_server().await;
        server
    }

    /// Installs `tls`'s certificate and key (the key readable by the server alone, as it
    /// requires) and refuses every connection over TCP that is not TLS.
    async fn take_tls_only(&self, tls: &super::TlsFiles) {
        let data = PathBuf::from(self.data());
        std::fs::copy(&tls.cert, data.join("server.crt")).expect("certificate copied");
        std::fs::copy(&tls.key, data.join("server.key")).expect("key copied");
        let settings = "\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n";
        let mut conf = std::fs::read_to_string(data.join("postgresql.conf")).expect("config");
        conf.push_str(settings);
        std::fs::write(data.join("postgresql.conf"), conf).expect("config written");
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )
        .expect("pg_hba written");
        let mut fix = vec![(
            "chmod",
            vec![
                "600".to_owned(),
                data.join("server.key").display().to_string(),
            ],
        )];
        if is_root() {
            fix.push((
                "chown",
                vec![
                    "-R".to_owned(),
                    "postgres".to_owned(),
                    data.display().to_string(),
                ],
            ));
        }
        for (program, args) in fix {
            let status = Command::new(program).args(&args).status().await;
            assert!(status.is_ok_and(|s| s.success()), "{program} {args:?}");
        }
    }

    /// The URL of database `name` on this server (verifying its certificate, over TLS).
    pub fn database_url(&self, name: &str) -> String {
        let url = format!("postgres://postgres@127.0.0.1:{}/{name}", self.port);
        match &self.ca {
            Some(ca) => format!("{url}?sslmode=verify-full&sslrootcert={}", ca.display()),
            None => url,
        }
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
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c wal_level=logical",
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
