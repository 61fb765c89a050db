//! Real processes: the service binaries and nats-server, each on its own port, killed and
//! restarted by the scenarios; a PostgreSQL cluster of a scenario's own; TLS files.
//!
//! - `nats`: [`NatsServer`], alone or as a node of a cluster, its store copied, restored, wiped;
//! - `service`: [`Service`], a service binary as a process;
//! - `ports`: [`free_port`], below the kernel's ephemeral range, so a restart finds it free;
//! - `postgres`: [`PgServer`], a cluster made with `initdb`, restarted in immediate mode;
//! - `tls`: [`TlsFiles`], a CA and a server certificate made with `openssl`.

mod nats;
mod ports;
mod postgres;
mod service;
mod tls;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

pub use nats::{NatsServer, Node};
pub use ports::free_port;
pub use postgres::PgServer;
pub use service::{Kind, Service};
pub use tls::TlsFiles;

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
pub fn target_dir(workspace: &Path) -> PathBuf {
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
