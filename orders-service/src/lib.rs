//! orders-service: a REST API for orders that never loses an order's events.
//!
//! Every state change writes the order row and its event (`OrderPlaced`, `OrderPaid`,
//! `OrderShipped`) to the outbox in one transaction; the relay of `jetstream-outbox` runs in the
//! background and publishes the events to JetStream.
//!
//! - [`config`]: settings from the environment;
//! - [`startup`]: [`App`]: connections, migrations, the router, the relay, graceful shutdown;
//! - [`orders`]: the `/orders` resource and its SQL;
//! - [`outbox_api`]: `/outbox/stats`, `/metrics`, the dead events and their admin actions;
//! - [`console`]: what `/ops` shows (tiles, columns, actions, charts) and the outbox's gauges.

pub mod config;
pub mod console;
pub mod orders;
pub mod outbox_api;
pub mod startup;

pub use config::Config;
pub use startup::{App, AppState};
