//! The slot's lag, in bytes and in seconds. PostgreSQL 15 keeps no time beside a WAL
//! position, so every instance notes the server's position at each reading, and a slot's
//! lag in seconds is how long ago one of its readings first saw WAL the slot has still not
//! confirmed: a lower bound. It is short of the truth by the time between two readings, more
//! after readings failed or were thinned, and by however long the WAL waited before the
//! instance started.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// The slot's lag at a reading.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Lag {
    /// Bytes of WAL the slot keeps that its streamer has not confirmed.
    pub bytes: i64,
    /// How long the oldest of them has waited (see the module documentation): zero when the
    /// slot is confirmed up to the server's position, or missing.
    pub waited: Duration,
}

/// The slot's lag as the last reading of [`super::WalWakeup::run`] found it, for whoever
/// shows it; clones share it.
#[derive(Debug, Clone, Default)]
pub struct SlotLag {
    last: Arc<Mutex<Option<Lag>>>,
}

impl SlotLag {
    /// The last reading's lag; `None` before the first.
    pub fn last(&self) -> Option<Lag> {
        *self.last.lock().expect("never held across a panic")
    }

    pub(super) fn set(&self, lag: Lag) {
        *self.last.lock().expect("never held across a panic") = Some(lag);
    }
}

/// The server's WAL positions at the readings that saw WAL the slot has not confirmed yet,
/// oldest first.
#[derive(Debug, Default)]
pub(super) struct Readings {
    seen: VecDeque<(Instant, i64)>,
}

impl Readings {
    /// Readings kept; beyond, every other one is forgotten, which keeps the oldest and
    /// coarsens the bound instead of losing it.
    const KEPT: usize = 2048;

    /// The lag at `at`, when the server's WAL reaches `current` and the slot confirmed up to
    /// `confirmed` (bytes from the start of the WAL); `None` for no slot.
    pub(super) fn read(&mut self, at: Instant, positions: Option<(i64, i64)>) -> Lag {
        let Some((current, confirmed)) = positions else {
            self.seen.clear();
            return Lag {
                bytes: 0,
                waited: Duration::ZERO,
            };
        };
        // What the slot confirmed never comes back: the slot only moves on (or is made again,
        // further on).
        while self
            .seen
            .front()
            .is_some_and(|&(_, position)| position <= confirmed)
        {
            self.seen.pop_front();
        }
        if current > confirmed {
            if self.seen.len() >= Self::KEPT {
                let mut index = 0;
                self.seen.retain(|_| {
                    index += 1;
                    index % 2 == 1
                });
            }
            self.seen.push_back((at, current));
        }
        let waited = self
            .seen
            .front()
            .map_or(Duration::ZERO, |&(first, _)| at.duration_since(first));
        Lag {
            bytes: (current - confirmed).max(0),
            waited,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn a_slot_that_keeps_up_has_no_lag() {
        let (mut readings, start) = (Readings::default(), Instant::now());
        for step in 0..10_i64 {
            let at = start + Duration::from_secs(5 * step as u64);
            let lag = readings.read(at, Some((1000 * step, 1000 * step)));
            assert_eq!(lag.bytes, 0);
            assert_eq!(lag.waited, secs(0));
        }
    }

    #[test]
    fn wal_nobody_confirms_ages_from_the_reading_that_first_saw_it() {
        let (mut readings, start) = (Readings::default(), Instant::now());
        let at = |secs| start + Duration::from_secs(secs);
        assert_eq!(readings.read(at(0), Some((100, 100))).waited, secs(0));
        // WAL written since: the first reading that sees it is the bound's start.
        assert_eq!(readings.read(at(5), Some((200, 100))).waited, secs(0));
        assert_eq!(readings.read(at(10), Some((300, 100))).waited, secs(5));
        let lag = readings.read(at(15), Some((400, 100)));
        assert_eq!((lag.bytes, lag.waited), (300, secs(10)));
        // The streamer confirms what the reading at 5 s saw: the wait starts at the next one.
        assert_eq!(readings.read(at(20), Some((500, 200))).waited, secs(10));
        // And then everything.
        assert_eq!(readings.read(at(25), Some((600, 600))).waited, secs(0));
    }

    #[test]
    fn a_slot_made_again_or_missing_starts_afresh() {
        let (mut readings, start) = (Readings::default(), Instant::now());
        let at = |secs| start + Duration::from_secs(secs);
        readings.read(at(0), Some((200, 100)));
        assert_eq!(readings.read(at(5), Some((300, 100))).waited, secs(5));
        // Made again at the server's position: nothing older is waiting.
        assert_eq!(readings.read(at(10), Some((400, 390))).waited, secs(0));
        assert_eq!(readings.read(at(15), Some((500, 390))).waited, secs(5));
        let missing = readings.read(at(20), None);
        assert_eq!((missing.bytes, missing.waited), (0, Duration::ZERO));
        assert_eq!(readings.read(at(25), Some((600, 500))).waited, secs(0));
    }

    #[test]
    fn a_long_wait_keeps_its_start_when_readings_are_thinned() {
        let (mut readings, start) = (Readings::default(), Instant::now());
        let steps = 3 * Readings::KEPT as u64;
        for step in 0..steps {
            let at = start + Duration::from_secs(5 * step);
            readings.read(at, Some((1001 + step as i64, 1000)));
        }
        assert!(readings.seen.len() <= Readings::KEPT);
        let at = start + Duration::from_secs(5 * steps);
        assert_eq!(
            readings.read(at, Some((2000 + steps as i64, 1000))).waited,
            secs(5 * steps)
        );
    }
}
