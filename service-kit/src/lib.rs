//! Shared plumbing of the workspace's services.
//!
//! - [`admin`]: the bearer-token guards of admin endpoints (the admin and the read-only token);
//! - [`audit`]: the audit log of operator actions;
//! - [`config`]: reading settings from the environment, failing with the variable's name;
//! - [`dead`]: filters and bulk outcomes of the dead-letter admin endpoints;
//! - [`events`]: the order events on NATS, their body and their AsyncAPI document;
//! - [`telemetry`]: `tracing` subscriber set-up, JSON or pretty;
//! - [`problem`]: [`ApiError`] and the extractors that turn rejections into problem+json;
//! - [`http`]: the middleware stack (request id, trace span, error logging), health and
//!   readiness, `/openapi.json`, `/asyncapi.json` and `/docs`, serving with graceful shutdown;
//! - [`history`]: the last hour of the service's metrics, for the console's charts;
//! - [`infra`]: database creation and connection, NATS connection, stream set-up;
//! - [`metrics`]: the Prometheus recorder and per-route HTTP metrics;
//! - [`ops_tokens`]: named operator tokens, one per person, from `OPS_TOKENS_FILE`;
//! - [`ops`]: the `/ops` page (live counts, dead letters with their admin actions);
//! - [`pagination`]: opaque cursors for newest-first lists;
//! - [`reuse`]: connections handed from one request to the next, around sqlx's check on return;
//! - [`startup`]: what every service connects and binds at start-up, and serving until stopped;
//! - `testing` (feature `testing`): unique names and bounded waits for tests.

pub mod admin;
pub mod audit;
pub mod config;
pub mod dead;
pub mod events;
pub mod history;
pub mod http;
pub mod infra;
pub mod metrics;
pub mod ops;
pub mod ops_tokens;
pub mod pagination;
pub mod problem;
pub mod reuse;
pub mod startup;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;

pub use problem::{ApiError, Json, Path, Query};
