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
//! The relays of a process note here the events they claim and when they are claiming
//! (`claims`), so that a wake-up for events one of them claimed already (the WAL's, which
//! follows the commit this process told at once) is left out rather than costing a pass that
//! finds nothing.

mod claims;

use std::sync::Arc;

use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::{mpsc, watch};

pub(crate) use claims::Claims;
#[cfg(feature = "wal")]
pub(crate) use claims::State;

/// Tells relays that events were committed. Cheap to clone; every clone wakes the same relays.
/// Give each outbox its own: the relays note in it the events they claim, by their seq.
#[derive(Debug, Clone)]
pub struct Wakeup {
    /// Counts commits; relays in this process wait for it to change.
    local: Arc<watch::Sender<u64>>,
    /// Asks the notifier task for one more `NOTIFY` (a full channel: one is pending already).
    remote: Option<mpsc::Sender<()>>,
    /// What this process's relays claimed lately, for a wake-up from the WAL.
    claims: Claims,
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
            claims: Claims::default(),
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

    /// What this process's relays claimed lately.
    pub(crate) fn claims(&self) -> &Claims {
        &self.claims
    }

    /// What a relay waits on.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.local.subscribe()
    }
}

/// Commits `tx`, then wakes the relays through `wakeup`.
pub async fn commit(tx: Transaction<'_, Postgres>, wakeup: &Wakeup) -> Result<(), sqlx::Error> {
    tx.commit().await?;
    wakeup.committed();
    Ok(())
}
