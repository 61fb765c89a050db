//! What a relay last saw of the broker, for a console or a stats endpoint beside it: the
//! relay keeps it up to date with its gauges, and [`Relay::health`](super::Relay::health) hands
//! out a handle that outlives [`Relay::run`](super::Relay::run)'s move of the relay.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// What the relay last ran into at the broker: why it publishes nothing, if it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BrokerState {
    /// The broker answered the relay's last publishes or check (or it has made none yet).
    Ok,
    /// The broker does not answer (`outbox_broker_unreachable`): events wait, none becomes dead.
    Unreachable,
    /// The stream returns none of the messages it counts (`outbox_stream_damaged`): nothing is
    /// published to it until it is deleted and made again.
    StreamDamaged,
    /// The broker refuses events for want of room (`outbox_broker_storage_full`): they wait.
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

/// A handle on what one relay last saw of the broker; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct RelayHealth(Arc<AtomicU8>);

impl RelayHealth {
    /// What the relay last ran into: its last publishes' answers, its last check of the stream.
    pub fn broker(&self) -> BrokerState {
        match self.0.load(Ordering::Relaxed) {
            1 => BrokerState::Unreachable,
            2 => BrokerState::StreamDamaged,
            3 => BrokerState::StorageFull,
            _ => BrokerState::Ok,
        }
    }

    /// A publish went through, or the broker was found answering with nothing to publish.
    pub(super) fn published(&self) {
        self.set(BrokerState::Ok);
    }

    /// The broker did not answer a publish or a check.
    pub(super) fn unreached(&self) {
        self.set(BrokerState::Unreachable);
    }

    /// A publish was refused for want of room.
    pub(super) fn storage_full(&self) {
        self.set(BrokerState::StorageFull);
    }

    /// A check found the stream returning none of the messages it counts.
    pub(super) fn stream_damaged(&self) {
        self.set(BrokerState::StreamDamaged);
    }

    /// A check of the stream went through: the broker answers and the stream is sound, which
    /// says nothing of its room.
    pub(super) fn checked(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |state| {
                (state != Self::code(BrokerState::StorageFull))
                    .then_some(Self::code(BrokerState::Ok))
            });
    }

    fn set(&self, state: BrokerState) {
        self.0.store(Self::code(state), Ordering::Relaxed);
    }

    fn code(state: BrokerState) -> u8 {
        match state {
            BrokerState::Ok => 0,
            BrokerState::Unreachable => 1,
            BrokerState::StreamDamaged => 2,
            BrokerState::StorageFull => 3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_relay_sees_nothing_wrong() {
        assert_eq!(RelayHealth::default().broker(), BrokerState::Ok);
    }

    #[test]
    fn the_last_thing_seen_is_shown() {
        let health = RelayHealth::default();
        health.storage_full();
        assert_eq!(health.broker(), BrokerState::StorageFull);
        health.unreached();
        assert_eq!(health.broker(), BrokerState::Unreachable);
        health.stream_damaged();
        assert_eq!(health.broker(), BrokerState::StreamDamaged);
        health.published();
        assert_eq!(health.broker(), BrokerState::Ok);
    }

    #[test]
    fn a_check_clears_all_but_a_full_storage() {
        let health = RelayHealth::default();
        for state in [BrokerState::Unreachable, BrokerState::StreamDamaged] {
            health.set(state);
            health.checked();
            assert_eq!(health.broker(), BrokerState::Ok);
        }
        health.storage_full();
        health.checked();
        assert_eq!(health.broker(), BrokerState::StorageFull);
    }

    #[test]
    fn clones_share_what_they_see() {
        let health = RelayHealth::default();
        let console = health.clone();
        health.unreached();
        assert_eq!(console.broker(), BrokerState::Unreachable);
        assert_eq!(console.broker().to_string(), "unreachable");
    }
}
