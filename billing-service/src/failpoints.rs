//! Crash points for the end-to-end tests.
//!
//! `FAILPOINT_CRASH_AFTER_COMMITS=N` aborts the process right after the N-th inbox commit and
//! before that message is acknowledged, so the broker delivers it again to a process that
//! already applied it. Unset (always, outside tests), it costs one atomic load per message.
//! It is compiled into every build on purpose: the crash tests then run the very binary that
//! ships (the one `scripts/build-services` builds for the Dockerfile).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

static COMMITS: AtomicU64 = AtomicU64::new(0);

/// The crash point set for this process, read once.
fn crash_after_commits() -> Option<u64> {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var("FAILPOINT_CRASH_AFTER_COMMITS")
            .ok()
            .and_then(|v| v.parse().ok())
    })
}

/// Warns at start-up when a crash point is armed, so it cannot go unnoticed.
pub fn warn_if_armed() {
    if let Some(limit) = crash_after_commits() {
        tracing::warn!(
            limit,
            "FAILPOINT_CRASH_AFTER_COMMITS is set: this process will abort after that many commits"
        );
    }
}

/// Called after each inbox commit, before the ack.
pub fn after_commit() {
    if let Some(limit) = crash_after_commits()
        && COMMITS.fetch_add(1, Ordering::SeqCst) + 1 == limit
    {
        eprintln!("failpoint: aborting after commit {limit}, before the ack");
        std::process::abort();
    }
}
