//! `tracing` set-up: `LOG_FORMAT=json` for machines, anything else for people; `RUST_LOG`
//! filters (default `info`).

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; a second call (as in tests) keeps the first.
pub fn init(format: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = if format.eq_ignore_ascii_case("json") {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init()
    } else {
        builder.try_init()
    };
}
