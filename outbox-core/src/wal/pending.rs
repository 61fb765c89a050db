//! The commits the stream read whose events the relays may not have claimed yet, and when each
//! is looked at again.
//!
//! A commit whose events a relay of this process claimed already (one of its own, told to the
//! relays at once) wakes nobody. One read while a relay claims waits for the claim to end: the
//! claim may take its events, and the relay claims nothing else before then anyway. PostgreSQL
//! sends a commit once its record is flushed, which is usually a moment before other sessions
//! see the transaction, so a relay woken then may find nothing: every commit not claimed is
//! looked at again [`VISIBLE_WITHIN`] after it was read, also one still waiting for a claim.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::insert::Inserted;
use crate::Wakeup;
use crate::wakeup::State;

/// How long after its commit is read a transaction is taken to be visible to other sessions.
const VISIBLE_WITHIN: Duration = Duration::from_millis(200);

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// Read while a relay claimed.
    waiting: Inserted,
    /// Each commit not claimed when read, with when it is looked at again; its seqs, or none
    /// when they are not known.
    again: VecDeque<(Instant, Vec<i64>)>,
}

impl Pending {
    /// A commit read at `now` that inserted `seqs` (none: not known): wakes the relays unless
    /// they claimed its events or are claiming.
    pub(super) fn committed(&mut self, wakeup: &Wakeup, seqs: Vec<i64>, now: Instant) {
        match wakeup.claims().state(&seqs) {
            State::Claimed => return,
            State::InFlight => self.waiting.add(&seqs),
            State::Unclaimed => {
                // Also serves the commits waiting: the relays claim after it.
                self.waiting = Inserted::default();
                wakeup.committed();
            }
        }
        self.again.push_back((now + VISIBLE_WITHIN, seqs));
    }

    /// Whether commits wait for a claim to end.
    pub(super) fn waiting(&self) -> bool {
        self.waiting.any()
    }

    /// A claim ended: the commits waiting wake the relays unless the claims took their events,
    /// once none is under way.
    pub(super) fn claim_ended(&mut self, wakeup: &Wakeup) {
        let state = wakeup.claims().state(&self.waiting.seqs());
        if state == State::InFlight {
            return;
        }
        if self.waiting.take().is_some() && state == State::Unclaimed {
            wakeup.committed();
        }
    }

    /// When the next commit is to be looked at again.
    pub(super) fn next_look(&self) -> Option<Instant> {
        self.again.front().map(|(at, _)| *at)
    }

    /// Looks again at the commits due by `now`: the relays are woken unless they claimed every
    /// one's events.
    pub(super) fn look_again(&mut self, wakeup: &Wakeup, now: Instant) {
        let mut due = Inserted::default();
        while self.again.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, seqs)) = self.again.pop_front() {
                due.add(&seqs);
            }
        }
        if let Some(seqs) = due.take()
            && wakeup.claims().state(&seqs) != State::Claimed
        {
            wakeup.committed();
        }
    }

    /// Whether any commit read is still to be woken for or looked at.
    pub(super) fn any(&self) -> bool {
        self.waiting.any() || !self.again.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;

    use super::{Pending, VISIBLE_WITHIN};
    use crate::Wakeup;

    /// A wakeup whose relays' claims are kept, as a wake-up from the WAL has it.
    fn watched() -> Wakeup {
        let wakeup = Wakeup::in_process();
        wakeup.claims().watch();
        wakeup
    }

    /// Whether the relays were woken since the last call.
    fn woken(relays: &mut watch::Receiver<u64>) -> bool {
        let woken = relays.has_changed().unwrap();
        relays.borrow_and_update();
        woken
    }

    #[test]
    fn a_commit_claimed_already_wakes_nobody_then_or_later() {
        let wakeup = watched();
        let mut relays = wakeup.subscribe();
        let mut pending = Pending::default();
        wakeup.claims().note([1, 2]);
        let now = tokio::time::Instant::now();
        pending.committed(&wakeup, vec![1, 2], now);
        assert!(!woken(&mut relays));
        assert!(!pending.any());
    }

    #[test]
    fn another_commit_wakes_at_once_and_again_unless_claimed_by_then() {
        let wakeup = watched();
        let mut relays = wakeup.subscribe();
        let mut pending = Pending::default();
        let now = tokio::time::Instant::now();
        pending.committed(&wakeup, vec![3], now);
        assert!(woken(&mut relays));
        pending.committed(&wakeup, vec![4], now + VISIBLE_WITHIN / 2);
        assert!(woken(&mut relays));
        assert_eq!(pending.next_look(), Some(now + VISIBLE_WITHIN));
        // The relay took 3 but 4 was not visible yet.
        wakeup.claims().note([3]);
        pending.look_again(&wakeup, now + VISIBLE_WITHIN);
        assert!(!woken(&mut relays), "3 was claimed");
        pending.look_again(&wakeup, now + VISIBLE_WITHIN * 2);
        assert!(woken(&mut relays), "4 was not");
        assert!(!pending.any());
    }

    #[test]
    fn a_commit_read_during_a_claim_waits_for_its_end() {
        let wakeup = watched();
        let mut relays = wakeup.subscribe();
        let mut pending = Pending::default();
        let now = tokio::time::Instant::now();
        let claiming = wakeup.claims().claiming();
        pending.committed(&wakeup, vec![5], now);
        pending.committed(&wakeup, vec![6], now);
        assert!(!woken(&mut relays) && pending.waiting());
        wakeup.claims().note([5]);
        drop(claiming);
        pending.claim_ended(&wakeup);
        assert!(woken(&mut relays), "6 was not claimed");
        assert!(!pending.waiting());
        // Looked at again all the same: 6 may not have been visible to the claim it woke.
        assert!(pending.any());
    }

    #[test]
    fn a_commit_read_after_a_claim_ended_serves_those_waiting() {
        let wakeup = watched();
        let mut relays = wakeup.subscribe();
        let mut pending = Pending::default();
        let now = tokio::time::Instant::now();
        let claiming = wakeup.claims().claiming();
        pending.committed(&wakeup, vec![7], now);
        drop(claiming);
        pending.committed(&wakeup, vec![8], now);
        assert!(woken(&mut relays) && !pending.waiting());
    }

    #[test]
    fn unknown_events_always_wake() {
        let wakeup = watched();
        let mut relays = wakeup.subscribe();
        let mut pending = Pending::default();
        let now = tokio::time::Instant::now();
        wakeup.claims().note([9]);
        pending.committed(&wakeup, Vec::new(), now);
        assert!(woken(&mut relays));
        pending.look_again(&wakeup, now + VISIBLE_WITHIN);
        assert!(woken(&mut relays));
    }
}
