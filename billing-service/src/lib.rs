//! billing-service: turns order events into invoices, exactly one per order.
//!
//! A durable JetStream pull consumer feeds each message through the `jetstream-outbox` inbox: the
//! message id is recorded in the same transaction as the invoice change, and the message is
//! acknowledged only after that transaction committed. Redeliveries find the inbox row and do
//! nothing; messages that cannot be parsed or applied become dead letters.
//!
//! - [`config`]: settings from the environment;
//! - [`startup`]: [`App`]: connections, migrations, the router, the consumer, graceful shutdown;
//! - [`consumer`]: the consumer loop and the work in flight;
//! - [`parse`]: reading a message into the change it asks for;
//! - [`rules`]: applying a message through the inbox and judging the outcome;
//! - [`reason`]: why a message is kept as a dead letter, by class;
//! - [`age`]: when a message is too old for the inbox to deduplicate;
//! - [`durable`]: the durable consumer, made again when the broker lost it or what it
//!   delivered;
//! - [`batcher`]: which messages go into the consumer's next transaction;
//! - [`invoices`]: the `/invoices` resource, its SQL, and how events change invoices;
//! - [`quarantine`]: dead-letters the messages the NATS client cannot read (bytes that are not
//!   UTF-8 in a subject or header), found through the stream's API;
//! - `failpoints`: crash on purpose at chosen points, for the crash tests (inert unless set);
//! - [`lag`]: the durable consumer's lag (messages waiting, the oldest one's age);
//! - [`inbox_api`]: `/inbox/stats`, `/metrics`, the dead letters and their admin actions;
//! - [`console`]: what `/ops` shows (tiles, columns, actions, charts) and the gauges.

pub mod age;
pub mod batcher;
pub mod config;
pub mod console;
pub mod consumer;
pub mod durable;
pub mod failpoints;
pub mod inbox_api;
pub mod invoices;
pub mod lag;
pub mod parse;
pub mod quarantine;
pub mod reason;
pub mod rules;
pub mod startup;

pub use config::Config;
pub use startup::{App, AppState};
