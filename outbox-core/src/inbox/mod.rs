//! The consumer side: apply a message's effect at most once per consumer.
//!
//! [`Inbox::process`] records the message id, with a [`Digest`] of its content, and runs the
//! effect in one transaction. A second delivery of the same id and content finds the row and
//! returns [`Outcome::Duplicate`] without running the effect; the same id with other content is
//! not a copy but a producer reusing an id, [`Outcome::IdReused`], and nothing runs either. A
//! failed effect rolls back the record too, so a later delivery tries again. Messages that can
//! never be applied are kept as dead letters ([`Inbox::dead_letter`]). [`consume()`] is the
//! simplest loop around it: one message at a time, acknowledged as the caller's function says.
//!
//! A record (table `inbox_entries`) keeps the id in 16 bytes: a UUID in canonical text is its
//! own key, any other id (and a UUID of version 8) is keyed by its SHA-256 marked as a
//! version-8 UUID (SQL function `inbox_key`). The table is partitioned by the day a UUIDv7 key
//! was made, in a ring of 32, so that [`Inbox::cleanup`] ages records out a day's partition at
//! a time (`TRUNCATE`) rather than row by row; records of other keys share one partition aged
//! out row by row. Records of the crate's earlier versions, in tables `inbox_records` and
//! `inbox`, are still read until they age out.
//!
//! Modules: `consume` (the simplest loop), `message` (a message's id, headers and body as the
//! inbox keeps them), `dead` (dead letters: kept, listed, replayed, skipped), `error` (why
//! nothing committed) and `storage` (the records' SQL).

mod consume;
mod dead;
mod error;
mod message;
pub(crate) mod storage;

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use sqlx::{PgConnection, PgPool};

pub use consume::{ConsumeConfig, ConsumeError, consume};
pub use dead::{DeadLetter, DeadLetterFilter, HeldDeadLetter, NewDeadLetter};
pub use error::{BatchError, InboxError, refused_for_good};
pub use message::{Body, message_id};

/// What happened to a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The effect ran and committed with the inbox record.
    Processed(T),
    /// The message was processed before; nothing ran.
    Duplicate,
    /// Its id was processed before for a message with different content: this one is not a
    /// copy, and nothing ran. Keep it as a dead letter; acknowledging it would lose it.
    IdReused,
}

/// What a message says, reduced to 32 bytes: kept with its inbox record, so that a later
/// delivery under the same id is recognised as a copy only when its content is the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The SHA-256 of `parts` (e.g. the message's type and body), each prefixed by its length
    /// so that moving bytes from one part to the next changes the digest. Copies must be
    /// byte-identical: the relay's are, since it publishes the stored row again.
    pub fn of(parts: &[&[u8]]) -> Self {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        Self(hasher.finalize().into())
    }

    /// The digest's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// What the effect of [`Inbox::process_batch_together`] returns: a value per message, or the
/// place in the batch of the message that failed, with its error.
pub type GroupFuture<'c, T, E> = BoxFuture<'c, Result<Vec<T>, (usize, E)>>;

/// A batch's effect: run per message, or once for all the new ones.
enum Effect<F, G> {
    Each(F),
    Together(G),
}

/// The form of effect a batch does not use.
type NoEach<T, E> = for<'c> fn(&'c mut PgConnection, usize) -> BoxFuture<'c, Result<T, E>>;
type NoGroup<T, E> = for<'c> fn(&'c mut PgConnection, &'c [usize]) -> GroupFuture<'c, T, E>;

impl<F, G> Effect<F, G> {
    /// Applies the messages at `new`, in order; the first failure ends it.
    async fn apply<T, E>(
        &mut self,
        conn: &mut PgConnection,
        new: &[usize],
    ) -> Result<Vec<T>, (usize, E)>
    where
        F: for<'c> FnMut(&'c mut PgConnection, usize) -> BoxFuture<'c, Result<T, E>>,
        G: for<'c> FnMut(&'c mut PgConnection, &'c [usize]) -> GroupFuture<'c, T, E>,
    {
        match self {
            Effect::Each(effect) => {
                let mut values = Vec::with_capacity(new.len());
                for &i in new {
                    values.push(effect(&mut *conn, i).await.map_err(|error| (i, error))?);
                }
                Ok(values)
            }
            Effect::Together(effect) => effect(conn, new).await,
        }
    }
}

/// Counts for dashboards, over the inbox's retention window, read in constant time: the
/// inbox keeps `processed` and `duplicate` as it goes, and `dead` is counted up to
/// [`crate::outbox::COUNT_LIMIT`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct InboxStats {
    /// Messages whose effect was applied.
    pub processed: i64,
    /// Deliveries recognised as duplicates of processed messages.
    pub duplicate: i64,
    /// Dead letters neither applied nor skipped yet, up to 10,000.
    pub dead: i64,
    /// False when `dead` reached 10,000 and so means "at least 10,000".
    pub exact: bool,
}

/// The inbox of one consumer.
#[derive(Debug, Clone)]
pub struct Inbox {
    pool: PgPool,
    consumer: String,
    /// Picks the row of the consumer's counts each transaction adds to, one after another from a
    /// random start, so that transactions running at once (here and in other processes) seldom
    /// share one.
    next_slot: Arc<AtomicU16>,
}

/// Rows the counts of one consumer are spread over.
const COUNT_SLOTS: u16 = 32;

impl Inbox {
    /// The inbox of `consumer` (usually the durable consumer's name) in `pool`.
    pub fn new(pool: PgPool, consumer: impl Into<String>) -> Self {
        Self {
            pool,
            consumer: consumer.into(),
            next_slot: Arc::new(AtomicU16::new(rand::random())),
        }
    }

    /// Runs `effect` for `message_id` unless this consumer already processed it, in one
    /// transaction with the inbox record; `digest` is the message's content (see [`Digest`]).
    ///
    /// Concurrent deliveries of the same id are safe: the second waits on the first's record
    /// and then sees a duplicate (or, if the first rolled back, runs the effect itself).
    pub async fn process<T, E, F>(
        &self,
        message_id: &str,
        digest: &Digest,
        effect: F,
    ) -> Result<Outcome<T>, InboxError<E>>
    where
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<T, E>>,
    {
        let mut effect = Some(effect);
        let outcomes = self
            .process_batch(&[(message_id, *digest)], |conn, _| match effect.take() {
                Some(effect) => effect(conn),
                None => unreachable!("one message, one effect"),
            })
            .await
            .map_err(|error| match error {
                BatchError::Effect { error, .. } => InboxError::Effect(error),
                BatchError::Database(error) => InboxError::Database(error),
            })?;
        Ok(outcomes
            .into_iter()
            .next()
            .expect("one outcome per message"))
    }

    /// [`Inbox::process`] for several messages in one transaction: records each message not
    /// processed before and runs `effect(conn, i)` for each such `batch[i]`, in batch order,
    /// then commits once. One commit instead of one per message is what makes it worth it: a
    /// commit waits for its write-ahead log to reach the disk. A message whose id appears
    /// earlier in the batch is judged against that one, as a later delivery would be.
    ///
    /// If an effect fails, nothing of the batch is recorded, and the error says which message
    /// failed: process the others again without it.
    pub async fn process_batch<T, E, F>(
        &self,
        batch: &[(&str, Digest)],
        effect: F,
    ) -> Result<Vec<Outcome<T>>, BatchError<E>>
    where
        F: for<'c> FnMut(&'c mut PgConnection, usize) -> BoxFuture<'c, Result<T, E>>,
    {
        self.run_batch(batch, Effect::<F, NoGroup<T, E>>::Each(effect))
            .await
    }

    /// [`Inbox::process_batch`] with one call of `effect` for the messages not processed
    /// before: `effect(conn, new)` gets their places in `batch`, in batch order, and returns
    /// one value per place, or one of those places (the message that failed) with its error.
    /// For an effect that writes many messages' rows in one statement, a round trip to the
    /// database for the batch instead of one per message. `effect` is called at most once per
    /// batch (a repeated id is judged against its first copy, never new), and not when no
    /// message is new.
    ///
    /// # Panics
    ///
    /// If `effect` returns another number of values than places, or fails at a place it was
    /// not given.
    pub async fn process_batch_together<T, E, G>(
        &self,
        batch: &[(&str, Digest)],
        effect: G,
    ) -> Result<Vec<Outcome<T>>, BatchError<E>>
    where
        G: for<'c> FnMut(&'c mut PgConnection, &'c [usize]) -> GroupFuture<'c, T, E>,
    {
        self.run_batch(batch, Effect::<NoEach<T, E>, G>::Together(effect))
            .await
    }

    /// The transaction of [`Inbox::process_batch`] and [`Inbox::process_batch_together`].
    async fn run_batch<T, E, F, G>(
        &self,
        batch: &[(&str, Digest)],
        mut effect: Effect<F, G>,
    ) -> Result<Vec<Outcome<T>>, BatchError<E>>
    where
        F: for<'c> FnMut(&'c mut PgConnection, usize) -> BoxFuture<'c, Result<T, E>>,
        G: for<'c> FnMut(&'c mut PgConnection, &'c [usize]) -> GroupFuture<'c, T, E>,
    {
        // Each id's first message is recorded with the others'; a repeat afterwards, in the same
        // transaction, where it finds the first's record.
        let (firsts, repeats): (Vec<usize>, Vec<usize>) =
            (0..batch.len()).partition(|&i| !batch[..i].iter().any(|(id, _)| *id == batch[i].0));
        let slot = self.next_slot.fetch_add(1, Ordering::Relaxed) % COUNT_SLOTS;
        let mut tx = self.pool.begin().await?;
        let mut outcomes: Vec<Option<Outcome<T>>> = (0..batch.len()).map(|_| None).collect();
        for group in std::iter::once(firsts).chain(repeats.into_iter().map(|i| vec![i])) {
            let ids: Vec<&str> = group.iter().map(|&i| batch[i].0).collect();
            let digests: Vec<&[u8]> = group.iter().map(|&i| &batch[i].1.0[..]).collect();
            let recorded =
                storage::record(&mut tx, &self.consumer, &ids, &digests, slot.cast_signed())
                    .await?;
            let mut new = Vec::with_capacity(group.len());
            for (&i, recorded) in group.iter().zip(recorded) {
                outcomes[i] = match recorded {
                    storage::Recorded::New => {
                        new.push(i);
                        None
                    }
                    storage::Recorded::Copy => Some(Outcome::Duplicate),
                    storage::Recorded::OtherContent => Some(Outcome::IdReused),
                };
            }
            if new.is_empty() {
                continue;
            }
            let values = effect
                .apply(&mut tx, &new)
                .await
                .map_err(|(index, error)| {
                    assert!(
                        new.contains(&index),
                        "an effect fails at a place it was given"
                    );
                    BatchError::Effect { index, error }
                })?;
            assert_eq!(values.len(), new.len(), "an effect's value per message");
            for (i, value) in new.into_iter().zip(values) {
                outcomes[i] = Some(Outcome::Processed(value));
            }
        }
        tx.commit().await?;
        let outcomes: Vec<Outcome<T>> = outcomes.into_iter().flatten().collect();
        for outcome in &outcomes {
            let name = match outcome {
                Outcome::Processed(_) => "inbox_processed_total",
                Outcome::Duplicate => "inbox_duplicates_total",
                Outcome::IdReused => "inbox_id_reused_total",
            };
            metrics::counter!(name).increment(1);
        }
        Ok(outcomes)
    }

    /// Whether message `id` with `digest` is recorded as applied (a copy of it is a duplicate),
    /// without recording anything: for a consumer that must not apply a message it cannot
    /// deduplicate (older than its retention), yet need not dead-letter one it can.
    pub async fn is_recorded(&self, id: &str, digest: &Digest) -> sqlx::Result<bool> {
        let found = storage::recorded_digest(&self.pool, &self.consumer, id).await?;
        Ok(found.is_some_and(|recorded| {
            recorded.is_none_or(|recorded| recorded.as_slice() == digest.as_bytes())
        }))
    }

    /// Reads the current [`InboxStats`].
    pub async fn stats(&self) -> sqlx::Result<InboxStats> {
        let limit = crate::outbox::COUNT_LIMIT;
        let mut stats = storage::stats(&self.pool, &self.consumer, limit).await?;
        stats.exact = stats.dead < limit;
        Ok(stats)
    }

    /// Ages out inbox records older than `retention`: the partitions of days whose records
    /// are all that old are emptied whole, the rest (records of ids that are no UUIDv7, of the
    /// tables before the partitions, and any a partition cannot take in time) are deleted
    /// `batch` rows of each table per statement (a `batch` below 1 counts as 1). Returns the
    /// records deleted plus those counted in the partitions emptied (every consumer's).
    ///
    /// Partitions are shared by every consumer of the database: one is emptied only when the
    /// longest retention any consumer's cleanup declared has passed, and never while it holds
    /// a record of a consumer that declared none. Keep `retention` longer than any redelivery
    /// can arrive: a message redelivered after its record is gone would be applied again.
    pub async fn cleanup(&self, retention: Duration, batch: i64) -> sqlx::Result<u64> {
        let mut removed = 0;
        // Bounded: the ring has 32 partitions, one emptied per statement.
        for _ in 0..32 {
            match storage::age_out(&self.pool, &self.consumer, retention).await? {
                Some(records) => removed += records,
                None => break,
            }
        }
        removed += crate::batches::in_batches(batch, |batch| {
            storage::delete_older(&self.pool, &self.consumer, retention, batch)
        })
        .await?;
        Ok(removed)
    }
}
