//! The event a caller enqueues.
//!
//! `event_type` and `aggregate_id` become NATS subject tokens and CloudEvents attributes
//! (`{prefix}.{event_type}.{aggregate_id}`, `ce-type`, `ce-subject`), so they are restricted to
//! 1–128 ASCII letters, digits and `-`, `_`, `:`, `@`; `aggregate_type`, which is not in the
//! message, follows the same rule. In particular `.`, `*`, `>`, whitespace and control
//! characters can never reach a subject.

use serde::Serialize;

use crate::EventError;

/// Longest accepted name or id, in bytes.
pub const MAX_TOKEN_LEN: usize = 128;

/// An event to be written to the outbox in the caller's transaction.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    pub(crate) payload: serde_json::Value,
    pub(crate) traceparent: Option<String>,
}

impl NewEvent {
    /// An event of `event_type` about one aggregate, with a JSON payload.
    pub fn new(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: &impl Serialize,
    ) -> Result<Self, EventError> {
        let event = Self {
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload: serde_json::to_value(payload)?,
            traceparent: None,
        };
        check_token("aggregate_type", &event.aggregate_type)?;
        check_token("aggregate_id", &event.aggregate_id)?;
        check_token("event_type", &event.event_type)?;
        Ok(event)
    }

    /// Carries a W3C `traceparent` with the event, so the consumer can continue the trace.
    #[must_use]
    pub fn with_traceparent(mut self, traceparent: Option<String>) -> Self {
        self.traceparent = traceparent.filter(|t| is_traceparent(t));
        self
    }

    /// The aggregate type: with the aggregate id, the aggregate whose events are published in
    /// order. Not in the message, whose subject is `{prefix}.{event_type}.{aggregate_id}`.
    pub fn aggregate_type(&self) -> &str {
        &self.aggregate_type
    }

    /// The aggregate this event belongs to; events of one aggregate are published in order.
    pub fn aggregate_id(&self) -> &str {
        &self.aggregate_id
    }

    /// The event type.
    pub fn event_type(&self) -> &str {
        &self.event_type
    }

    /// The JSON payload.
    pub fn payload(&self) -> &serde_json::Value {
        &self.payload
    }

    /// The W3C `traceparent` carried with the event, if any.
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }
}

/// A fresh event id: a UUIDv7, so ids sort by time (the consumers' inbox keys its records by
/// them). [`crate::enqueue`] makes one itself; pass one to the SQL function `outbox_enqueue`.
pub fn event_id() -> uuid::Uuid {
    uuid::Uuid::now_v7()
}

/// Whether `value` may be used as an aggregate type, aggregate id or event type.
pub fn is_valid_token(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= MAX_TOKEN_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':' | b'@'))
}

fn check_token(field: &'static str, value: &str) -> Result<(), EventError> {
    if is_valid_token(value) {
        Ok(())
    } else {
        Err(EventError::Invalid {
            field,
            reason: "must be 1-128 ASCII letters, digits, '-', '_', ':' or '@'",
        })
    }
}

/// Whether `value` looks like a W3C traceparent (`00-<32 hex>-<16 hex>-<2 hex>`).
pub fn is_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    parts.len() == 4
        && [2, 32, 16, 2]
            .iter()
            .zip(&parts)
            .all(|(len, part)| part.len() == *len && part.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_refuse_subject_syntax_and_whitespace() {
        for bad in ["", "a.b", "a*", ">", "a b", "a\nb", "ä", &"x".repeat(129)] {
            assert!(!is_valid_token(bad), "{bad:?} accepted");
        }
        for good in [
            "o7",
            "0193a0c4-7d1e-7c3b-9f1a-1b2c3d4e5f60",
            "OrderPlaced",
            "a:b@c_d",
        ] {
            assert!(is_valid_token(good), "{good:?} refused");
        }
    }

    #[test]
    fn new_event_names_the_bad_field() {
        let err = NewEvent::new("order", "a.b", "OrderPlaced", &()).unwrap_err();
        assert!(matches!(
            err,
            EventError::Invalid {
                field: "aggregate_id",
                ..
            }
        ));
    }

    #[test]
    fn malformed_traceparent_is_dropped() {
        let event = NewEvent::new("order", "o1", "OrderPlaced", &()).unwrap();
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            event
                .clone()
                .with_traceparent(Some(good.into()))
                .traceparent
                .as_deref(),
            Some(good)
        );
        assert_eq!(
            event.with_traceparent(Some("nonsense".into())).traceparent,
            None
        );
    }
}
