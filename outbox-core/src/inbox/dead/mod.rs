//! Dead letters: the messages a consumer could not parse or apply, kept, listed, grouped,
//! closed once replayed (`replay` holds one while it is), or skipped; `storage` holds their
//! SQL.

mod replay;
mod storage;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::{Inbox, message, message_id};
pub use replay::HeldDeadLetter;

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
    /// Its body (not serialized: a listing stays small whatever the bodies;
    /// [`Body::of`](super::Body::of) shows one).
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

impl Inbox {
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
}
