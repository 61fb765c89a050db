//! Ports for the scenarios' servers, taken below the kernel's ephemeral range.
//!
//! A scenario stops a server and starts it again on the same port, which its clients' URLs
//! hold. A port from `bind(0)` is one of the ephemeral ports the kernel also hands to every
//! outgoing connection and to other tests' `bind(0)`; during a long outage one of them took it.
//! Ports below that range are never handed out by the kernel, and a lock file shared by every
//! test process keeps two scenarios off the same one.

use std::fs::{File, TryLockError};
use std::io::ErrorKind;
use std::net::TcpListener;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;
use std::sync::Mutex;

/// The lowest port handed out; below it are the usual fixed ports of local services.
const LOWEST: u16 = 10_000;

/// Locks held until the test process exits, one per port it reserved.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// A free TCP port on loopback that no other test process holds and the kernel does not hand
/// out by itself, reserved for the rest of this process.
pub fn free_port() -> u16 {
    let Some(range) = reservable() else {
        return kernel_port();
    };
    let dir = lock_dir();
    let span = u128::from(range.1 - range.0);
    for _ in 0..1_000 {
        let offset = u16::try_from(uuid::Uuid::new_v4().as_u128() % span).expect("below span");
        let port = range.0 + offset;
        if let Some(lock) = reserve(&dir.join(port.to_string()))
            && TcpListener::bind(("127.0.0.1", port)).is_ok()
        {
            HELD.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(lock);
            return port;
        }
    }
    panic!("no free port in {}..{}", range.0, range.1);
}

/// The directory of the lock files, one for every user of the machine: writable by all, as
/// `/tmp` is, since the ports are the machine's.
fn lock_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join("e2e-ports");
    std::fs::create_dir_all(&dir).expect("the ports' lock directory");
    // Only its owner may change it; for everyone else it is already done.
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777));
    dir
}

/// The lock on `path`, or `None` when another process (or this one) holds it.
fn reserve(path: &Path) -> Option<File> {
    let created = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o666)
        .open(path);
    // Another user's file: a lock needs no write access to it.
    let file = match created {
        Err(e) if e.kind() == ErrorKind::PermissionDenied => File::open(path),
        other => other,
    }
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match file.try_lock() {
        Ok(()) => Some(file),
        Err(TryLockError::WouldBlock) => None,
        Err(TryLockError::Error(e)) => panic!("locking {}: {e}", path.display()),
    }
}

/// `LOWEST` up to the first ephemeral port, when the kernel says where that range starts and it
/// leaves room.
fn reservable() -> Option<(u16, u16)> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let first: u16 = range.split_whitespace().next()?.parse().ok()?;
    (first > LOWEST + 1_000).then_some((LOWEST, first))
}

/// A port from `bind(0)`, where the kernel's ephemeral range leaves no room below it.
fn kernel_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_below_the_ephemeral_range_and_held() {
        let Some((_, first_ephemeral)) = reservable() else {
            eprintln!("no room below the ephemeral range here: ports come from bind(0)");
            return;
        };
        let port = free_port();
        assert!(port < first_ephemeral, "{port} is one the kernel hands out");
        let again = lock_dir().join(port.to_string());
        assert!(reserve(&again).is_none(), "{port} is not held");
        assert_ne!(free_port(), port);
    }
}
