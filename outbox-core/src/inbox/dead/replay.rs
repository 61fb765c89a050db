//! Replaying a dead letter while it is held, so that a skip of the same letter cannot slip
//! in between the replay's effect and the letter's closing.

use sqlx::{PgConnection, Postgres, Transaction};

use super::{DeadLetter, storage};
use crate::inbox::Inbox;

/// An open dead letter held for a replay: until it is closed or dropped, a skip of it (one or
/// in bulk) waits, and then finds it closed if the replay applied it.
///
/// The hold is a row lock in a transaction of its own, so the replay's effect runs in another
/// transaction beside it (through [`Inbox::process`], for example), and the pool needs a second
/// connection meanwhile. Close the letter through [`HeldDeadLetter::close`] only: closing or
/// skipping it through the [`Inbox`] while holding it waits for the hold, forever.
///
/// Dropping it without [`HeldDeadLetter::close`] leaves the letter open, also when the effect
/// had committed (the close failed, or the replay was cancelled in between): a skip may then
/// record it as skipped, and a replay finds the message a duplicate and closes it as applied.
#[derive(Debug)]
#[must_use = "a held letter stays open unless closed"]
pub struct HeldDeadLetter {
    tx: Transaction<'static, Postgres>,
    letter: DeadLetter,
    consumer: String,
}

impl HeldDeadLetter {
    /// The letter held.
    pub fn letter(&self) -> &DeadLetter {
        &self.letter
    }

    /// The hold's transaction: what is written through it (an audit row of the replay)
    /// commits with [`HeldDeadLetter::close`], and is rolled back when the hold is dropped.
    /// Write nothing through it that the replay's effect locks too: the effect runs on
    /// another connection while this transaction is open, and would wait for it forever.
    pub fn connection(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    /// Closes the letter as applied, once its replay's effect committed, and ends the hold.
    pub async fn close(mut self) -> sqlx::Result<()> {
        storage::close_held_dead(&mut self.tx, &self.consumer, self.letter.id).await?;
        self.tx.commit().await
    }
}

impl Inbox {
    /// Holds the open dead letter `id` for a replay ([`HeldDeadLetter`]); `None` if no open
    /// letter has this id, skipped or applied meanwhile included.
    pub async fn hold_dead_letter(&self, id: i64) -> sqlx::Result<Option<HeldDeadLetter>> {
        let mut tx = self.pool.begin().await?;
        let Some(letter) = storage::lock_dead(&mut tx, &self.consumer, id).await? else {
            return Ok(None);
        };
        Ok(Some(HeldDeadLetter {
            tx,
            letter,
            consumer: self.consumer.clone(),
        }))
    }
}
