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

mod consume;
mod message;
mod replay;
pub(crate) mod storage;

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use sqlx::{PgConnection, PgPool};

pub use consume::{ConsumeConfig, ConsumeError, consume};
pub use message::{Body, message_id};
pub use replay::HeldDeadLetter;

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

/// Why [`Inbox::process`] did not commit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError<E> {
    /// The effect failed; nothing was recorded.
    #[error("message effect failed")]
    Effect(#[source] E),
    /// The inbox's own statements or the commit failed; nothing was recorded.
    #[error("inbox database error")]
    Database(#[from] sqlx::Error),
}

impl InboxError<sqlx::Error> {
    /// The SQLSTATE when PostgreSQL refused the message's data, in the effect or in the inbox's
    /// own statements ([`refused_for_good`]).
    pub fn refused_for_good(&self) -> Option<std::borrow::Cow<'_, str>> {
        let (Self::Effect(error) | Self::Database(error)) = self;
        refused_for_good(error)
    }
}

impl BatchError<sqlx::Error> {
    /// The SQLSTATE when PostgreSQL refused a message's data, in its effect or in the inbox's
    /// own statements ([`refused_for_good`]).
    pub fn refused_for_good(&self) -> Option<std::borrow::Cow<'_, str>> {
        let (Self::Effect { error, .. } | Self::Database(error)) = self;
        refused_for_good(error)
    }
}

/// The SQLSTATE of `error` when PostgreSQL refused a statement for the data it was given, which
/// no delivery again can change: class 22 (data exception: a value it cannot store, such as a
/// NUL byte in text or an out-of-range number) and class 54 (program limit exceeded: a value
/// too large for an index row). Keep such a message as a dead letter ([`Inbox::dead_letter`]).
/// Any other error (a lost connection, a serialisation failure, a deadlock, a full disk, a
/// privilege an operator can grant) may pass: deliver the message again.
pub fn refused_for_good(error: &sqlx::Error) -> Option<std::borrow::Cow<'_, str>> {
    let code = error.as_database_error()?.code()?;
    (code.starts_with("22") || code.starts_with("54")).then_some(code)
}

/// Why [`Inbox::process_batch`] did not commit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError<E> {
    /// The effect of `batch[index]` failed; nothing of the batch was recorded.
    #[error("the effect of message {index} of the batch failed")]
    Effect {
        /// The failed message's place in the batch.
        index: usize,
        /// What the effect returned.
        #[source]
        error: E,
    },
    /// The inbox's own statements or the commit failed; nothing was recorded.
    #[error("inbox database error")]
    Database(#[from] sqlx::Error),
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

/// A message kept because it could not be parsed or applied.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct DeadLetter {
    /// Dead letter id.
    pub id: i64,
    /// The message id, when the message had one.
    pub message_id: Option<String>,
    /// The NATS subject it arrived on.
    pub subject: String,
    /// Its headers, as a JSON object of arrays.
    pub headers: serde_json::Value,
    /// Its body (not serialized: a listing stays small whatever the bodies; [`Body::of`] shows
    /// one).
    #[serde(skip)]
    pub payload: Vec<u8>,
    /// Why it was dead-lettered.
    pub error: String,
    /// The kind of that error the consumer gave ([`NewDeadLetter::error_class`]), if any.
    pub error_class: Option<String>,
    /// How many times the broker had delivered it.
    pub deliveries: i64,
    /// When it was dead-lettered.
    pub created_at: DateTime<Utc>,
}

impl DeadLetter {
    /// Its headers as the message carried them, e.g. to apply it again.
    pub fn header_map(&self) -> async_nats::HeaderMap {
        message::headers_from_json(&self.headers)
    }
}

/// A message to keep as a dead letter: [`NewDeadLetter::new`], then the fields known.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NewDeadLetter<'a> {
    /// The message id, when the message had one.
    pub message_id: Option<&'a str>,
    /// The NATS subject.
    pub subject: &'a str,
    /// Headers as a JSON object of arrays.
    pub headers: serde_json::Value,
    /// The body.
    pub payload: &'a [u8],
    /// Why it cannot be applied.
    pub error: &'a str,
    /// The kind of that error: a stable name, the same for every letter failing the same way
    /// (`invalid-payload`), which operators filter and group dead letters by.
    pub error_class: Option<&'a str>,
    /// Delivery count reported by the broker.
    pub deliveries: i64,
}

impl<'a> NewDeadLetter<'a> {
    /// The message on `subject` with `payload`, kept because of `error`; no id, no headers,
    /// no delivery count.
    pub fn new(subject: &'a str, payload: &'a [u8], error: &'a str) -> Self {
        Self {
            message_id: None,
            subject,
            headers: serde_json::Value::Object(serde_json::Map::new()),
            payload,
            error,
            error_class: None,
            deliveries: 0,
        }
    }

    /// JetStream message `message`, kept because of `error`: its subject, body and headers,
    /// its delivery count (0 if the message carries no JetStream metadata), and its `ce-id` as
    /// the id when it is valid ([`message_id`]; an invalid one stays in the headers).
    pub fn of_message(message: &'a async_nats::jetstream::Message, error: &'a str) -> Self {
        Self {
            message_id: message_id(message),
            subject: &message.subject,
            headers: message.headers.as_ref().map_or_else(
                || serde_json::Value::Object(serde_json::Map::new()),
                message::headers_json,
            ),
            payload: &message.payload,
            error,
            error_class: None,
            deliveries: message.info().map_or(0, |info| info.delivered),
        }
    }

    /// The same letter, its error of kind `class` ([`NewDeadLetter::error_class`]); an empty
    /// `class` is none.
    #[must_use]
    pub fn with_error_class(mut self, class: &'a str) -> Self {
        self.error_class = Some(class).filter(|class| !class.is_empty());
        self
    }
}

/// Which open dead letters a listing or a bulk action takes: those matching every filter set,
/// all of them when none is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetterFilter {
    /// Only letters whose (first) `ce-type` header is this.
    pub event_type: Option<String>,
    /// Only letters whose error contains this text.
    pub error_contains: Option<String>,
    /// Only letters whose error is of this kind ([`NewDeadLetter::error_class`]).
    pub error_class: Option<String>,
    /// Only letters dead-lettered at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only letters dead-lettered before this time.
    pub until: Option<DateTime<Utc>>,
}

impl DeadLetterFilter {
    /// Every open dead letter.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only letters whose `ce-type` header is `event_type`.
    #[must_use]
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_type = Some(event_type.into());
        self
    }

    /// Only letters whose error contains `text`.
    #[must_use]
    pub fn error_contains(mut self, text: impl Into<String>) -> Self {
        self.error_contains = Some(text.into());
        self
    }

    /// Only letters whose error is of kind `class`.
    #[must_use]
    pub fn error_class(mut self, class: impl Into<String>) -> Self {
        self.error_class = Some(class.into());
        self
    }

    /// Only letters dead-lettered in `[since, until)`; either end may be open.
    #[must_use]
    pub fn dead_lettered(
        mut self,
        since: Option<DateTime<Utc>>,
        until: Option<DateTime<Utc>>,
    ) -> Self {
        (self.since, self.until) = (since, until);
        self
    }
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

    /// Keeps a message that cannot be parsed or applied, and returns the dead letter's id.
    ///
    /// A redelivery (`deliveries` above 1) of a message this consumer holds an open letter of,
    /// alike in subject, headers, body and id, keeps no second letter: its acknowledgement was
    /// lost or came too late, and the open letter's id is returned.
    pub async fn dead_letter(&self, letter: NewDeadLetter<'_>) -> sqlx::Result<i64> {
        let (id, new) = storage::insert_dead(&self.pool, &self.consumer, &letter, false)
            .await?
            .ok_or(sqlx::Error::RowNotFound)?;
        if new {
            metrics::counter!("inbox_dead_letters_total").increment(1);
        }
        Ok(id)
    }

    /// [`Inbox::dead_letter`], unless this consumer kept a letter with the same message id
    /// before (open or closed): then `None`. Two calls at the same moment may both keep one.
    pub async fn dead_letter_once(&self, letter: NewDeadLetter<'_>) -> sqlx::Result<Option<i64>> {
        let kept = storage::insert_dead(&self.pool, &self.consumer, &letter, true).await?;
        let id = kept.filter(|&(_, new)| new).map(|(id, _)| id);
        if id.is_some() {
            metrics::counter!("inbox_dead_letters_total").increment(1);
        }
        Ok(id)
    }

    /// Lists open dead letters matching `filter`, after `after_id`, at most `limit`.
    pub async fn dead(
        &self,
        filter: &DeadLetterFilter,
        after_id: i64,
        limit: i64,
    ) -> sqlx::Result<Vec<DeadLetter>> {
        storage::dead(&self.pool, &self.consumer, filter, after_id, limit).await
    }

    /// Open dead letters grouped by `ce-type` and error, the largest groups first, at most
    /// `limit` groups of the first [`crate::groups::GROUPS_READ_LIMIT`] open letters.
    pub async fn dead_groups(&self, limit: i64) -> sqlx::Result<Vec<crate::groups::DeadGroup>> {
        storage::dead_groups(
            &self.pool,
            &self.consumer,
            crate::groups::GROUPS_READ_LIMIT,
            limit,
        )
        .await
    }

    /// Reads an open dead letter, to replay it.
    pub async fn dead_letter_by_id(&self, id: i64) -> sqlx::Result<Option<DeadLetter>> {
        storage::find_dead(&self.pool, &self.consumer, id).await
    }

    /// Closes a dead letter once its replay succeeded; false if it was not open. A skip can
    /// come between the replay and this: a replay through [`Inbox::hold_dead_letter`], closed
    /// with [`HeldDeadLetter::close`] instead, keeps it out.
    pub async fn close_dead_letter(&self, id: i64) -> sqlx::Result<bool> {
        let filter = DeadLetterFilter::all();
        Ok(
            storage::close_dead(&self.pool, &self.consumer, Some(id), &filter, "applied").await?
                == 1,
        )
    }

    /// Gives up on a dead letter without applying it: it stays recorded as skipped; false if
    /// it was not open.
    pub async fn skip_dead_letter(&self, id: i64) -> sqlx::Result<bool> {
        self.skip_dead_letter_in(&mut *self.pool.acquire().await?, id)
            .await
    }

    /// [`Inbox::skip_dead_letter`] on `conn`, the caller's transaction (`&mut *tx`) for
    /// example: the skip commits with whatever else it writes (an audit row).
    pub async fn skip_dead_letter_in(
        &self,
        conn: &mut PgConnection,
        id: i64,
    ) -> sqlx::Result<bool> {
        let filter = DeadLetterFilter::all();
        let closed =
            storage::close_dead(conn, &self.consumer, Some(id), &filter, "skipped").await?;
        Ok(closed == 1)
    }

    /// [`Inbox::skip_dead_letter`] for every open dead letter matching `filter`, in one
    /// statement; returns how many there were. Safe to repeat, and beside a running consumer.
    pub async fn skip_dead_letters(&self, filter: &DeadLetterFilter) -> sqlx::Result<u64> {
        self.skip_dead_letters_in(&mut *self.pool.acquire().await?, filter)
            .await
    }

    /// [`Inbox::skip_dead_letters`] on `conn`, as [`Inbox::skip_dead_letter_in`].
    pub async fn skip_dead_letters_in(
        &self,
        conn: &mut PgConnection,
        filter: &DeadLetterFilter,
    ) -> sqlx::Result<u64> {
        storage::close_dead(conn, &self.consumer, None, filter, "skipped").await
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
