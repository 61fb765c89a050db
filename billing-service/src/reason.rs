//! Why billing keeps a message as a dead letter. Each kind has a class (`DeadReason::class`),
//! a stable name an operator groups failures by; the text, kept with the letter, says what was
//! wrong with this message.

/// Why a message can never be applied as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeadReason {
    /// A header that names the message (`ce-id`, `ce-type`) is missing.
    #[error("missing {0}")]
    MissingHeader(&'static str),
    /// A header that names the message is there more than once: its identity is ambiguous.
    #[error("{0} appears more than once")]
    RepeatedHeader(&'static str),
    /// `ce-id` is not 1-128 of `[A-Za-z0-9_:@-]` (its length in bytes): it cannot be an
    /// inbox key.
    #[error("invalid ce-id of {0} bytes: must be 1-128 of [A-Za-z0-9_:@-] (a UUID is)")]
    InvalidId(usize),
    /// The body is over 1 MiB (its length in bytes): not read.
    #[error("body of {0} bytes is over 1 MiB")]
    BodyTooLarge(usize),
    /// The body is not the event's JSON.
    #[error("invalid {event_type} payload: {error}")]
    InvalidPayload {
        /// The event type.
        event_type: String,
        /// What the JSON reader said.
        error: String,
    },
    /// `orderId` is not 1-128 of `[A-Za-z0-9_:@-]` (in an event of this type).
    #[error("invalid orderId in {0}")]
    InvalidOrderId(String),
    /// An `OrderPlaced` whose `totalMinor` is not positive.
    #[error("OrderPlaced with a non-positive totalMinor")]
    InvalidTotal,
    /// A copy of it may have been applied longer ago than the inbox keeps records
    /// ([`crate::age`]).
    #[error("{0}")]
    TooOld(String),
    /// Its `ce-id` was applied before for a message with another type or body.
    #[error(
        "ce-id {0} was applied before for a message with another type or body: this one is \
         not a copy, and applying or dropping it would both be wrong"
    )]
    IdReused(String),
    /// Not applicable yet, `CONSUMER_MAX_RETRIES` times.
    #[error("{reason} after {attempts} attempts")]
    NotYetTooOften {
        /// Why it was not applicable.
        reason: String,
        /// How many times.
        attempts: i64,
    },
    /// The database refused its data for good (SQLSTATE class 22 or 54).
    #[error("the database refused the message for good (SQLSTATE {code}): {error}")]
    RefusedByDatabase {
        /// The SQLSTATE.
        code: String,
        /// The database's error.
        error: String,
    },
}

/// The class of a message the NATS client cannot read, which the quarantine keeps.
pub const UNREADABLE: &str = "unreadable";

impl DeadReason {
    /// The kind of failure: a stable name to group dead letters by.
    pub fn class(&self) -> &'static str {
        match self {
            Self::MissingHeader(_) | Self::RepeatedHeader(_) => "bad-headers",
            Self::InvalidId(_) => "invalid-id",
            Self::BodyTooLarge(_) => "body-too-large",
            Self::InvalidPayload { .. } | Self::InvalidOrderId(_) | Self::InvalidTotal => {
                "invalid-payload"
            }
            Self::TooOld(_) => "too-old",
            Self::IdReused(_) => "id-reused",
            Self::NotYetTooOften { .. } => "not-applicable",
            Self::RefusedByDatabase { .. } => "refused-by-database",
        }
    }
}
