//! Transactional outbox and inbox for services built on sqlx (PostgreSQL) and NATS JetStream.
//!
//! A service that saves a row and then publishes an event loses the event when it crashes in
//! between. With this crate the event is written in the same transaction as the row
//! ([`enqueue`]), the commit wakes the relays ([`commit`], [`Wakeup`]), and a [`Relay`]
//! publishes it afterwards, at least once, in per-aggregate order.
//! On the consuming side the [`Inbox`] records each message id in the same transaction as the
//! message's effect, so a redelivered message does nothing.
//!
//! `examples/greetings.rs` is a whole small service built on it (an axum handler that
//! enqueues, the relay beside it, a consumer applying messages through the inbox); the crate
//! README walks through it.
//!
//! Modules:
//! - [`event`]: the event a caller enqueues, and the rules its names follow;
//! - [`outbox`]: [`enqueue`] in the caller's transaction, stats, dead events and cleanup;
//! - [`relay`]: the background task that claims pending rows, publishes them and moves them to
//!   `outbox_published`; its module doc names every mechanism that keeps each aggregate's
//!   events in order, and its `storage` holds the relay's SQL (the claim among it);
//! - [`headers`]: the NATS header names of a relayed message (CloudEvents, trace context);
//! - [`publisher`]: the [`Publisher`] trait and its JetStream implementation, stream set-up;
//! - [`inbox`]: at-most-once effects per consumer, stats, dead letters and cleanup;
//! - [`groups`]: dead events and dead letters grouped by cause;
//! - [`error`]: the set-up, producer and publisher errors, and [`Error`] gathering the set-up
//!   and producer ones (the inbox's, the consumer's and the repair's are in their modules);
//! - [`cleanup`]: the background task that ages out published events and inbox records after
//!   their retention, emptying partitions whole;
//! - [`backoff`]: exponential backoff with jitter for failed publishes;
//! - [`migrate`]: the tables this crate needs, as sqlx migrators;
//! - [`metrics`]: the metrics it records, and their descriptions;
//! - [`repair`]: checking the stream for what the broker acknowledged and lost, and publishing
//!   it again;
//! - [`wakeup`]: waking relays after a commit, at no cost to the committing transaction;
//! - `wal` (feature `wal`): waking relays from a logical replication slot, whichever process
//!   committed;
//! - `testing` (feature `testing`): a publisher that injects broker faults, for tests of code
//!   built on this crate.
//!
//! The crate knows nothing about the events' meaning: payloads are JSON values chosen by the
//! caller.
//!
//! Metrics go through the [`metrics`](https://docs.rs/metrics) facade, so the application picks
//! the exporter; [`metrics::describe`] lists them with their help text.

pub mod backoff;
mod batches;
pub mod cleanup;
pub mod error;
pub mod event;
pub mod groups;
pub mod headers;
pub mod inbox;
pub mod metrics;
pub mod migrate;
pub mod outbox;
pub mod publisher;
pub mod relay;
pub mod repair;
#[cfg(feature = "testing")]
pub mod testing;
pub mod wakeup;
#[cfg(feature = "wal")]
pub mod wal;

/// The README's code blocks, compiled as doctests so that the walk-through stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub use backoff::Backoff;
pub use cleanup::Cleanup;
pub use error::{Error, EventError, MigrateError, PublishError, StreamError};
pub use event::{NewEvent, event_id};
pub use inbox::{BatchError, Inbox, InboxError, Outcome};
pub use outbox::{OutboxStats, enqueue};
pub use publisher::{Ack, JetStreamPublisher, Message, Publisher};
pub use relay::{BatchReport, RELAY_CONNECTIONS, Relay, RelayConfig};
pub use repair::{RepairError, RepairReport, StreamRepair};
pub use wakeup::{Wakeup, commit};
