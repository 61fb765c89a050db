//! The errors of the crate's operations: each returns the type that names exactly what can go
//! wrong in it, and [`Error`] gathers the set-up and producer ones for an application that
//! handles them together.
//!
//! Operations that only run SQL (enqueue, stats, dead letters, cleanup, a relay pass) return
//! [`sqlx::Error`] itself.

use std::error::Error as StdError;

/// A boxed error that keeps its cause chain.
pub(crate) type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The errors of the crate's set-up and producer operations, for an application that handles
/// them together: each converts into it with `?`. (The inbox's and the publisher's errors,
/// [`crate::InboxError`], [`crate::BatchError`] and [`PublishError`], carry the caller's own
/// error or a per-message outcome and stay apart.)
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A database statement failed.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// Applying or checking this crate's migrations failed.
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    /// An event could not be made.
    #[error(transparent)]
    Event(#[from] EventError),
    /// Creating, updating or checking the JetStream stream failed.
    #[error(transparent)]
    Stream(#[from] StreamError),
}

/// Why [`crate::NewEvent::new`] refused an event.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// An event field does not follow the rules in [`crate::event`].
    #[error("invalid event {field}: {reason}")]
    Invalid {
        /// The offending field.
        field: &'static str,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The event payload could not be serialised to JSON.
    #[error("event payload is not serialisable")]
    Payload(#[from] serde_json::Error),
}

/// Why applying or checking migrations ([`crate::migrate`]) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrateError {
    /// Applying the migrations failed.
    #[error("migration failed")]
    Apply(#[from] sqlx::migrate::MigrateError),
    /// Reading which migrations were applied failed.
    #[error("reading the applied migrations failed")]
    Database(#[from] sqlx::Error),
    /// The database lacks migrations this code needs (see [`crate::migrate::verify`]).
    #[error("the database is not migrated: versions {missing:?} are not applied")]
    NotMigrated {
        /// The versions not applied.
        missing: Vec<i64>,
    },
}

/// Why [`crate::publisher::ensure_stream`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The broker refused to create or update the stream, or did not answer.
    #[error("creating or updating stream {stream} failed")]
    Create {
        /// The stream's name.
        stream: String,
        /// What the broker or the client said.
        #[source]
        source: BoxError,
    },
    /// The stream exists with a duplicate window shorter than asked for, and kept it: a
    /// re-published event older than the window would be stored twice.
    #[error(
        "stream {stream} keeps a duplicate window of {kept:?}, shorter than the configured {wanted:?}"
    )]
    DuplicateWindow {
        /// The stream's name.
        stream: String,
        /// The window the stream has.
        kept: std::time::Duration,
        /// The window asked for.
        wanted: std::time::Duration,
    },
}

/// Why one message was not published.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The broker answered and refused this message: it is over the server's max payload, the
    /// stream rejected it. Retrying may not help, so each such failure counts toward the
    /// relay's `max_attempts`.
    #[error("message not accepted by the broker")]
    NotAccepted(#[source] BoxError),
    /// The message was sent but no acknowledgement arrived (timed out, connection lost while
    /// waiting): it may or may not be stored. Transient: never counts toward `max_attempts`.
    #[error("no acknowledgement from the broker")]
    NoAck(#[source] BoxError),
    /// The broker could not be reached (not connected, the connection went before the message
    /// was sent, JetStream unavailable): nothing was published. Transient: never counts toward
    /// `max_attempts`.
    #[error("broker unreachable")]
    Unreachable(#[source] BoxError),
    /// No stream answered for the subject: in a cluster, a stream between two leaders; else
    /// the stream was deleted, which the relay's [`crate::StreamRepair`] makes again. Nothing
    /// was published. Transient: never counts toward `max_attempts`.
    #[error("no stream for the subject")]
    StreamNotFound(#[source] BoxError),
    /// The stream or its account has no room left (JetStream's storage limits). An outage, not
    /// a refusal: transient, never counts toward `max_attempts`, and the relay retries until
    /// room is made. The message is not stored as a rule, but may be (see
    /// [`PublishError::may_be_stored`]).
    #[error("the broker's storage is full")]
    StorageFull(#[source] BoxError),
}

impl PublishError {
    /// Whether retrying later is bound to help: the broker was not reached, did not answer, had
    /// no stream or no room for the message, as opposed to refusing the message itself.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::NoAck(_) | Self::Unreachable(_) | Self::StreamNotFound(_) | Self::StorageFull(_)
        )
    }

    /// Whether the broker may have stored the message although the publish failed: no
    /// acknowledgement came, or the account had no room (JetStream finds that out after
    /// storing the message, then removes it; a crash before the removal reached its disk
    /// brings the message back, its id unknown to the duplicate window). Before publishing
    /// such an event again, the relay looks for it in the stream ([`crate::Publisher::stored`]).
    pub fn may_be_stored(&self) -> bool {
        matches!(self, Self::NoAck(_) | Self::StorageFull(_))
    }

    /// The kind of this error, as stored in `error_class` ([`crate::outbox::error_classes`]).
    pub fn class(&self) -> &'static str {
        use crate::outbox::error_classes as class;
        match self {
            Self::NotAccepted(source) if is_too_large(source.as_ref()) => class::TOO_LARGE,
            Self::NotAccepted(_) => class::NOT_ACCEPTED,
            Self::NoAck(_) => class::NO_ACK,
            Self::Unreachable(_) => class::UNREACHABLE,
            Self::StreamNotFound(_) => class::STREAM_NOT_FOUND,
            Self::StorageFull(_) => class::STORAGE_FULL,
        }
    }

    /// The error with its causes on one line, as stored in `last_error`.
    pub fn chain(&self) -> String {
        chain(self)
    }
}

/// Whether the broker refused a message for its size: over the server's max payload (the
/// client does not send it), or over the stream's maximum message size (JetStream's 10054).
fn is_too_large(error: &(dyn StdError + Send + Sync + 'static)) -> bool {
    use async_nats::jetstream::context::{PublishError as Refusal, PublishErrorKind};
    let Some(refusal) = error.downcast_ref::<Refusal>() else {
        return false;
    };
    matches!(refusal.kind(), PublishErrorKind::MaxPayloadExceeded)
        || StdError::source(refusal)
            .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
            .is_some_and(|answer| answer.error_code().0 == 10054)
}

/// `error` and its causes on one line, outermost first; a cause that an error's own text
/// already ends with (async-nats's errors print their source) is not written twice.
pub(crate) fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_names_each_cause_once() {
        let timeout = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        // As async-nats's errors do: the source in the error's own text too.
        let pull = async_nats::jetstream::consumer::pull::MessagesError::with_source(
            async_nats::jetstream::consumer::pull::MessagesErrorKind::Pull,
            timeout,
        );
        assert_eq!(chain(&pull), "pull request failed: timed out");
        let publish = PublishError::Unreachable(Box::new(pull));
        assert_eq!(
            publish.chain(),
            "broker unreachable: pull request failed: timed out"
        );
    }
}
