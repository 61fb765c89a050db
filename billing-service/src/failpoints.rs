//! Crash points for the end-to-end tests, compiled only with the `failpoints` feature.
//!
//! `FAILPOINT_CRASH_AFTER_COMMITS=N` aborts the process right after the N-th inbox commit and
//! before that message is acknowledged, so the broker delivers it again to a process that
//! already applied it.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

static COMMITS: AtomicU64 = AtomicU64::new(0);

/// Called after each inbox commit, before the ack.
pub fn after_commit() {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    let limit = LIMIT.get_or_init(|| {
        std::env::var("FAILPOINT_CRASH_AFTER_COMMITS")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    if let Some(limit) = limit
        && COMMITS.fetch_add(1, Ordering::SeqCst) + 1 == *limit
    {
        eprintln!("failpoint: aborting after commit {limit}, before the ack");
        std::process::abort();
    }
}
