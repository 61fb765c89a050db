use std::error::Error as StdError;

/// A boxed error that keeps its cause chain.
pub(crate) type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What can go wrong in the outbox, the relay and the inbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A database statement failed.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// Applying this crate's migrations failed.
    #[error("migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The database lacks migrations this code needs (see [`crate::migrate::verify`]).
    #[error("the database is not migrated: versions {missing:?} are not applied")]
    NotMigrated {
        /// The versions not applied.
        missing: Vec<i64>,
    },
    /// An event field does not follow the rules in [`crate::event`].
    #[error("invalid event {field}: {reason}")]
    InvalidEvent {
        /// The offending field.
        field: &'static str,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The event payload could not be serialised to JSON.
    #[error("event payload is not serialisable")]
    Payload(#[from] serde_json::Error),
    /// Creating, updating or checking the JetStream stream failed.
    #[error("stream set-up failed: {0}")]
    Stream(String, #[source] BoxError),
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
    /// was sent, no stream answered for the subject, JetStream unavailable): nothing was
    /// published. Transient: never counts toward `max_attempts`.
    #[error("broker unreachable")]
    Unreachable(#[source] BoxError),
}

impl PublishError {
    /// Whether retrying later is bound to help: the broker was not reached or did not answer,
    /// as opposed to refusing the message.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::NoAck(_) | Self::Unreachable(_))
    }

    /// The error with its causes on one line, as stored in `last_error`.
    pub fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut source = self.source();
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        text
    }
}
