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
    /// The broker did not take the message: not connected, no stream for the subject, refused.
    #[error("message not accepted by the broker")]
    NotAccepted(#[source] BoxError),
    /// The message was sent but no acknowledgement arrived: it may or may not be stored.
    #[error("no acknowledgement from the broker")]
    NoAck(#[source] BoxError),
}

impl PublishError {
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
