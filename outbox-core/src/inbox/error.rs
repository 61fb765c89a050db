//! Why the inbox did not commit a message, and which database errors no delivery again can
//! mend.

use std::borrow::Cow;

/// Why [`Inbox::process`](super::Inbox::process) did not commit.
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
    pub fn refused_for_good(&self) -> Option<Cow<'_, str>> {
        let (Self::Effect(error) | Self::Database(error)) = self;
        refused_for_good(error)
    }
}

impl BatchError<sqlx::Error> {
    /// The SQLSTATE when PostgreSQL refused a message's data, in its effect or in the inbox's
    /// own statements ([`refused_for_good`]).
    pub fn refused_for_good(&self) -> Option<Cow<'_, str>> {
        let (Self::Effect { error, .. } | Self::Database(error)) = self;
        refused_for_good(error)
    }
}

/// The SQLSTATE of `error` when PostgreSQL refused a statement for the data it was given, which
/// no delivery again can change: class 22 (data exception: a value it cannot store, such as a
/// NUL byte in text or an out-of-range number) and class 54 (program limit exceeded: a value
/// too large for an index row). Keep such a message as a dead letter
/// ([`Inbox::dead_letter`](super::Inbox::dead_letter)). Any other error (a lost connection, a
/// serialisation failure, a deadlock, a full disk, a privilege an operator can grant) may pass:
/// deliver the message again.
pub fn refused_for_good(error: &sqlx::Error) -> Option<Cow<'_, str>> {
    let code = error.as_database_error()?.code()?;
    (code.starts_with("22") || code.starts_with("54")).then_some(code)
}

/// Why [`Inbox::process_batch`](super::Inbox::process_batch) did not commit.
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
