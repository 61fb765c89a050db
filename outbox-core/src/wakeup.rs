//! Waking relays when events were committed, at no cost to the committing transaction.
//!
//! A `NOTIFY` inside the transaction that enqueues would wake relays at commit, but PostgreSQL
//! serialises the commits of notifying transactions on one database-wide lock held until the
//! commit record is flushed, so they can no longer share a WAL flush (the workspace's
//! `docs/design.md` has the measurement). So `enqueue` notifies nobody; after the commit, the code that committed calls
//! [`Wakeup::committed`] (or commits through [`commit`]):
//! - a relay in the same process ([`crate::Relay::with_wakeup`]) is woken through memory;
//! - with [`Wakeup::across_processes`], relays in other processes are woken by a `NOTIFY` on
//!   [`crate::outbox::CHANNEL`] sent afterwards on a connection of its own, one at a time: the
//!   commits made while one is being sent share the next. A process that enqueues but runs no
//!   relay uses this.
//!
//! A transaction committed without either is still relayed, by the relay's poll
//! (`poll_interval`).
//!
//! The relays of a process note here the events they claim and when they are claiming, so that
//! a wake-up for events one of them claimed already (the WAL's, which follows the commit this
//! process told at once) is left out rather than costing a pass that finds nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::{mpsc, watch};

/// Tells relays that events were committed. Cheap to clone; every clone wakes the same relays.
/// Give each outbox its own: the relays note in it the events they claim, by their seq.
#[derive(Debug, Clone)]
pub struct Wakeup {
    /// Counts commits; relays in this process wait for it to change.
    local: Arc<watch::Sender<u64>>,
    /// Asks the notifier task for one more `NOTIFY` (a full channel: one is pending already).
    remote: Option<mpsc::Sender<()>>,
    /// The seqs this process's relays claimed lately, and their claims under way.
    claims: Arc<Mutex<Recent>>,
    /// Counts the claims that ended, for [`Wakeup::claims_ended`].
    ended: Arc<watch::Sender<u64>>,
}

/// The seqs claimed in the last [`Recent::FRESH`], at most the last [`Recent::KEPT`], and the
/// claims under way.
#[derive(Debug, Default)]
struct Recent {
    order: VecDeque<(i64, Instant)>,
    seqs: HashMap<i64, Instant>,
    in_flight: usize,
}

impl Recent {
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

    fn claimed(&self, seq: i64, now: Instant) -> bool {
        self.seqs
            .get(&seq)
            .is_some_and(|at| now.duration_since(*at) <= Self::FRESH)
    }
}

impl Default for Wakeup {
    fn default() -> Self {
        Self::in_process()
    }
}

impl Wakeup {
    /// Wakes the relays of this process given this handle.
    pub fn in_process() -> Self {
        Self {
            local: Arc::new(watch::Sender::new(0)),
            remote: None,
            claims: Arc::default(),
            ended: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Wakes the relays of this process and, with a `NOTIFY` sent after the commit on a
    /// connection of `pool`, those of other processes. Spawns the task that sends them, which
    /// ends when the last clone of the handle is dropped; call it inside a Tokio runtime.
    pub fn across_processes(pool: PgPool) -> Self {
        let (remote, mut asked) = mpsc::channel::<()>(1);
        tokio::spawn(async move {
            while asked.recv().await.is_some() {
                if let Err(error) = crate::outbox::storage::wake(&pool).await {
                    // Relays elsewhere fall back on their poll.
                    tracing::debug!(error = ?error, "cannot notify relays of a commit");
                }
            }
        });
        Self {
            remote: Some(remote),
            ..Self::in_process()
        }
    }

    /// Wakes the relays: call it after a transaction that enqueued events has committed.
    pub fn committed(&self) {
        self.local
            .send_modify(|commits| *commits = commits.wrapping_add(1));
        if let Some(remote) = &self.remote {
            // Full: a NOTIFY is on its way and will also cover this commit.
            let _ = remote.try_send(());
        }
    }

    /// Whether a relay of this process claimed every one of `seqs` (none: not known).
    pub(crate) fn all_claimed(&self, seqs: &[i64]) -> bool {
        let (claims, now) = (self.claims(), Instant::now());
        !seqs.is_empty() && seqs.iter().all(|seq| claims.claimed(*seq, now))
    }

    /// Whether a relay of this process is claiming: what it claims is not noted yet.
    pub(crate) fn claim_in_flight(&self) -> bool {
        self.claims().in_flight > 0
    }

    /// Changes when a claim ends.
    pub(crate) fn claims_ended(&self) -> watch::Receiver<u64> {
        self.ended.subscribe()
    }

    /// A relay of this process begins a claim: it is under way until the guard is dropped.
    pub(crate) fn claiming(&self) -> Claiming {
        self.claims().in_flight += 1;
        Claiming(self.clone())
    }

    /// Notes the seqs a relay of this process claimed.
    pub(crate) fn claimed(&self, seqs: impl IntoIterator<Item = i64>) {
        let (mut claims, now) = (self.claims(), Instant::now());
        for seq in seqs {
            claims.note(seq, now);
        }
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What a relay waits on.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.local.subscribe()
    }
}

/// A claim under way ([`Wakeup::claiming`]); dropped when it ended, however.
#[derive(Debug)]
pub(crate) struct Claiming(Wakeup);

impl Drop for Claiming {
    fn drop(&mut self) {
        let mut claims = self.0.claims();
        claims.in_flight = claims.in_flight.saturating_sub(1);
        drop(claims);
        self.0
            .ended
            .send_modify(|ended| *ended = ended.wrapping_add(1));
    }
}

/// Commits `tx`, then wakes the relays through `wakeup`.
pub async fn commit(tx: Transaction<'_, Postgres>, wakeup: &Wakeup) -> Result<(), sqlx::Error> {
    tx.commit().await?;
    wakeup.committed();
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::{Recent, Wakeup};

    #[test]
    fn claims_are_noted_and_known_to_be_under_way() {
        let wakeup = Wakeup::in_process();
        let ended = wakeup.claims_ended();
        let claiming = wakeup.claiming();
        assert!(wakeup.claim_in_flight());
        wakeup.claimed([1, 2, 3]);
        drop(claiming);
        assert!(!wakeup.claim_in_flight());
        assert!(ended.has_changed().unwrap());
        assert!(wakeup.all_claimed(&[1, 3]));
        assert!(!wakeup.all_claimed(&[3, 4]), "4 is not claimed");
        assert!(!wakeup.all_claimed(&[]), "events not known");
    }

    #[test]
    fn only_the_latest_seqs_are_kept() {
        let mut recent = Recent::default();
        let now = Instant::now();
        for seq in 0..i64::try_from(Recent::KEPT).unwrap() + 10 {
            recent.note(seq, now);
        }
        recent.note(20, now);
        assert_eq!(recent.order.len(), Recent::KEPT);
        assert_eq!(recent.seqs.len(), Recent::KEPT);
        assert!(!recent.claimed(9, now) && recent.claimed(10, now));
    }

    #[test]
    fn seqs_claimed_long_ago_are_not_known() {
        let mut recent = Recent::default();
        let now = Instant::now();
        recent.note(1, now);
        recent.note(2, now + Recent::FRESH);
        assert!(recent.claimed(1, now + Recent::FRESH));
        assert!(
            !recent.claimed(1, now + Recent::FRESH * 2),
            "the repair may insert it again"
        );
        recent.note(3, now + Recent::FRESH * 2);
        assert_eq!(recent.order.len(), 2, "1 is let go");
        // Noted again: kept from then on.
        recent.note(2, now + Recent::FRESH * 2);
        recent.note(4, now + Recent::FRESH * 3);
        assert!(recent.claimed(2, now + Recent::FRESH * 3));
    }
}
