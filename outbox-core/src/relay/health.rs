//! What a relay sees of the broker, for a console or a stats endpoint beside it: its gauges
//! `outbox_broker_unreachable`, `outbox_broker_storage_full` and `outbox_stream_damaged`, set
//! only through [`RelayHealth`], which [`Relay::health`](super::Relay::health) hands out, and
//! which outlives [`Relay::run`](super::Relay::run)'s move of the relay.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Why the relay publishes nothing, if it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BrokerState {
    /// None of the three gauges is 1.
    Ok,
    /// The broker does not answer (`outbox_broker_unreachable`): events wait, none becomes dead.
    Unreachable,
    /// The stream returns none of the messages it counts (`outbox_stream_damaged`): nothing is
    /// published to it until it is deleted and made again.
    StreamDamaged,
    /// The broker refuses events for want of room (`outbox_broker_storage_full`): they wait,
    /// as in an outage (`outbox_broker_unreachable` is then 1 too, until a check of the stream
    /// goes through).
    StorageFull,
}

impl BrokerState {
    /// Its name in stats and on a console: `ok`, `unreachable`, `stream damaged` or
    /// `storage full`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Unreachable => "unreachable",
            Self::StreamDamaged => "stream damaged",
            Self::StorageFull => "storage full",
        }
    }
}

impl std::fmt::Display for BrokerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A handle on what one relay sees of the broker, as its gauges say it; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct RelayHealth(Arc<Flags>);

#[derive(Debug, Default)]
struct Flags {
    /// `outbox_broker_unreachable`.
    unreachable: AtomicBool,
    /// `outbox_broker_storage_full`.
    storage_full: AtomicBool,
    /// `outbox_stream_damaged`.
    stream_damaged: AtomicBool,
}

impl RelayHealth {
    /// The broker as the relay's gauges say it. When several are 1, the one that explains the
    /// others: a full storage also counts as an outage, and a damaged stream is reported until
    /// a check finds it sound, whatever happens meanwhile.
    pub fn broker(&self) -> BrokerState {
        let flags = &self.0;
        if flags.stream_damaged.load(Ordering::Relaxed) {
            BrokerState::StreamDamaged
        } else if flags.storage_full.load(Ordering::Relaxed) {
            BrokerState::StorageFull
        } else if flags.unreachable.load(Ordering::Relaxed) {
            BrokerState::Unreachable
        } else {
            BrokerState::Ok
        }
    }

    /// Sets `outbox_broker_unreachable` and its flag.
    pub(crate) fn set_unreachable(&self, on: bool) {
        self.0.unreachable.store(on, Ordering::Relaxed);
        gauge("outbox_broker_unreachable", on);
    }

    /// Sets `outbox_broker_storage_full` and its flag; returns whether it was set before. The
    /// gauge is written only when that changes: the process's other relays write it too.
    pub(crate) fn swap_storage_full(&self, on: bool) -> bool {
        let before = self.0.storage_full.swap(on, Ordering::Relaxed);
        if before != on {
            gauge("outbox_broker_storage_full", on);
        }
        before
    }

    /// Sets `outbox_stream_damaged` and its flag.
    pub(crate) fn set_stream_damaged(&self, on: bool) {
        self.0.stream_damaged.store(on, Ordering::Relaxed);
        gauge("outbox_stream_damaged", on);
    }

    /// Writes the gauges from the flags (`outbox_stream_damaged` only for a relay that
    /// `repairs`), as the relay starts.
    pub(crate) fn write_gauges(&self, repairs: bool) {
        let flags = &self.0;
        gauge(
            "outbox_broker_unreachable",
            flags.unreachable.load(Ordering::Relaxed),
        );
        gauge(
            "outbox_broker_storage_full",
            flags.storage_full.load(Ordering::Relaxed),
        );
        if repairs {
            gauge(
                "outbox_stream_damaged",
                flags.stream_damaged.load(Ordering::Relaxed),
            );
        }
    }
}

fn gauge(name: &'static str, on: bool) {
    metrics::gauge!(name).set(f64::from(u8::from(on)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_relay_sees_nothing_wrong() {
        assert_eq!(RelayHealth::default().broker(), BrokerState::Ok);
    }

    #[test]
    fn the_state_that_explains_the_others_is_shown() {
        let health = RelayHealth::default();
        health.set_unreachable(true);
        assert_eq!(health.broker(), BrokerState::Unreachable);
        health.swap_storage_full(true);
        assert_eq!(health.broker(), BrokerState::StorageFull);
        health.set_stream_damaged(true);
        assert_eq!(health.broker(), BrokerState::StreamDamaged);
        health.set_stream_damaged(false);
        health.swap_storage_full(false);
        assert_eq!(health.broker(), BrokerState::Unreachable);
        health.set_unreachable(false);
        assert_eq!(health.broker(), BrokerState::Ok);
    }

    #[test]
    fn clones_share_what_they_see() {
        let health = RelayHealth::default();
        let console = health.clone();
        health.set_unreachable(true);
        assert_eq!(console.broker(), BrokerState::Unreachable);
        assert_eq!(console.broker().to_string(), "unreachable");
    }
}
