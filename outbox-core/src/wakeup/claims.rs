//! What the relays of a process claimed lately, and whether one is claiming: a wake-up from the
//! WAL (`crate::wal`) leaves out a commit whose events they took already. Kept only once a
//! wake-up watches ([`Claims::watch`]); relays without one note nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Shared by every clone of a [`super::Wakeup`].
#[derive(Clone)]
pub(crate) struct Claims {
    recent: Arc<Mutex<RecentClaims>>,
    /// Counts the claims that ended.
    ended: Arc<watch::Sender<u64>>,
    watched: Arc<AtomicBool>,
}

impl Default for Claims {
    fn default() -> Self {
        Self {
            recent: Arc::default(),
            ended: Arc::new(watch::Sender::new(0)),
            watched: Arc::default(),
        }
    }
}

impl std::fmt::Debug for Claims {
    // The seqs themselves would fill a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let recent = self.recent();
        f.debug_struct("Claims")
            .field("seqs", &recent.seqs.len())
            .field("in_flight", &recent.in_flight)
            .finish_non_exhaustive()
    }
}

/// Where a commit's events stand with the relays of this process.
#[cfg(feature = "wal")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Every one was claimed.
    Claimed,
    /// Not every one, and a claim is under way: it may take the rest.
    InFlight,
    /// Neither.
    Unclaimed,
}

impl Claims {
    /// Starts keeping claims, for a wake-up from the WAL.
    #[cfg(feature = "wal")]
    pub(crate) fn watch(&self) {
        self.watched.store(true, Ordering::Relaxed);
    }

    /// A relay begins a claim: under way until the guard is dropped. `None` unless watched.
    pub(crate) fn claiming(&self) -> Option<Claiming> {
        if !self.watched.load(Ordering::Relaxed) {
            return None;
        }
        self.recent().in_flight += 1;
        Some(Claiming(self.clone()))
    }

    /// Notes the seqs a relay claimed, when watched.
    pub(crate) fn note(&self, seqs: impl IntoIterator<Item = i64>) {
        if !self.watched.load(Ordering::Relaxed) {
            return;
        }
        let (mut recent, now) = (self.recent(), Instant::now());
        for seq in seqs {
            recent.note(seq, now);
        }
    }

    /// Where the events `seqs` of a commit stand (none: not known, never claimed).
    #[cfg(feature = "wal")]
    pub(crate) fn state(&self, seqs: &[i64]) -> State {
        let (recent, now) = (self.recent(), Instant::now());
        if !seqs.is_empty() && seqs.iter().all(|seq| recent.was_claimed(*seq, now)) {
            State::Claimed
        } else if recent.in_flight > 0 {
            State::InFlight
        } else {
            State::Unclaimed
        }
    }

    /// Changes when a claim ends.
    #[cfg(feature = "wal")]
    pub(crate) fn ended(&self) -> watch::Receiver<u64> {
        self.ended.subscribe()
    }

    fn recent(&self) -> MutexGuard<'_, RecentClaims> {
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A claim under way ([`Claims::claiming`]); dropped when it ended, however.
#[derive(Debug)]
pub(crate) struct Claiming(Claims);

impl Drop for Claiming {
    fn drop(&mut self) {
        let mut recent = self.0.recent();
        recent.in_flight = recent.in_flight.saturating_sub(1);
        drop(recent);
        self.0
            .ended
            .send_modify(|ended| *ended = ended.wrapping_add(1));
    }
}

/// The seqs claimed in the last [`RecentClaims::FRESH`], at most the last
/// [`RecentClaims::KEPT`], and the claims under way.
#[derive(Default)]
struct RecentClaims {
    order: VecDeque<(i64, Instant)>,
    seqs: HashMap<i64, Instant>,
    in_flight: usize,
}

impl RecentClaims {
    /// Enough for the claims of the time a commit takes to come back through the WAL, at any
    /// rate the relay reaches.
    const KEPT: usize = 1 << 16;

    /// Longer than a commit takes to come back through the WAL. Not much longer: the repair
    /// inserts an event the broker lost again with its seq, and a relay elsewhere should be
    /// woken for it.
    const FRESH: Duration = Duration::from_secs(10);

    fn note(&mut self, seq: i64, now: Instant) {
        if self.seqs.insert(seq, now) != Some(now) {
            self.order.push_back((seq, now));
        }
        while self.order.len() > Self::KEPT
            || self
                .order
                .front()
                .is_some_and(|(_, at)| now.duration_since(*at) > Self::FRESH)
        {
            let Some((oldest, at)) = self.order.pop_front() else {
                break;
            };
            // Noted again since: a later entry holds it.
            if self.seqs.get(&oldest) == Some(&at) {
                self.seqs.remove(&oldest);
            }
        }
    }

    #[cfg(feature = "wal")]
    fn was_claimed(&self, seq: i64, now: Instant) -> bool {
        self.seqs
            .get(&seq)
            .is_some_and(|at| now.duration_since(*at) <= Self::FRESH)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::{Claims, RecentClaims, State};

    #[test]
    fn claims_are_kept_only_once_watched() {
        let claims = Claims::default();
        assert!(claims.claiming().is_none());
        claims.note([1]);
        assert_eq!(claims.state(&[1]), State::Unclaimed);
        claims.watch();
        claims.note([1]);
        assert_eq!(claims.state(&[1]), State::Claimed);
    }

    #[test]
    fn claims_are_noted_and_known_to_be_under_way() {
        let claims = Claims::default();
        claims.watch();
        let ended = claims.ended();
        let claiming = claims.claiming();
        claims.note([1, 2, 3]);
        assert_eq!(claims.state(&[1, 3]), State::Claimed);
        assert_eq!(claims.state(&[3, 4]), State::InFlight, "4 is not claimed");
        drop(claiming);
        assert!(ended.has_changed().unwrap());
        assert_eq!(claims.state(&[3, 4]), State::Unclaimed);
        assert_eq!(claims.state(&[]), State::Unclaimed, "events not known");
    }

    #[test]
    fn only_the_latest_seqs_are_kept() {
        let mut recent = RecentClaims::default();
        let now = Instant::now();
        for seq in 0..i64::try_from(RecentClaims::KEPT).unwrap() + 10 {
            recent.note(seq, now);
        }
        recent.note(20, now);
        assert_eq!(recent.order.len(), RecentClaims::KEPT);
        assert_eq!(recent.seqs.len(), RecentClaims::KEPT);
        assert!(!recent.was_claimed(9, now) && recent.was_claimed(10, now));
    }

    #[test]
    fn seqs_claimed_long_ago_are_not_known() {
        let mut recent = RecentClaims::default();
        let (now, fresh) = (Instant::now(), RecentClaims::FRESH);
        recent.note(1, now);
        recent.note(2, now + fresh);
        assert!(recent.was_claimed(1, now + fresh));
        assert!(
            !recent.was_claimed(1, now + fresh * 2),
            "the repair may insert it again"
        );
        recent.note(3, now + fresh * 2);
        assert_eq!(recent.order.len(), 2, "1 is let go");
        // Noted again: kept from then on.
        recent.note(2, now + fresh * 2);
        recent.note(4, now + fresh * 3);
        assert!(recent.was_claimed(2, now + fresh * 3));
    }
}
