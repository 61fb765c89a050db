//! The broker message of an outbox row: CloudEvents in binary mode over NATS headers.

use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use chrono::SecondsFormat;

use super::Relay;
use super::storage::Claimed;
use crate::event::{is_traceparent, is_valid_token};
use crate::{Message, headers};

impl<P> Relay<P> {
    /// The broker message for a row: CloudEvents binary mode over NATS headers. Takes the
    /// row's payload, which is not needed after publishing.
    ///
    /// A row that cannot become a message (a name that is not a subject token, written before
    /// the table refused them or by hand) is refused with the reason, never sent: the subject
    /// and the headers would carry it. A malformed traceparent is left out, with a warning: the
    /// event itself is sound.
    pub(super) fn message(&self, row: &mut Claimed) -> Result<Message, String> {
        // Header names are built once, at compile time; values are moved in where they are
        // already owned strings: this runs for every event, and the copies showed in profiles.
        const SPECVERSION: HeaderName = HeaderName::from_static(headers::SPECVERSION);
        const ID: HeaderName = HeaderName::from_static(headers::ID);
        const TYPE: HeaderName = HeaderName::from_static(headers::TYPE);
        const SOURCE: HeaderName = HeaderName::from_static(headers::SOURCE);
        const SUBJECT: HeaderName = HeaderName::from_static(headers::SUBJECT);
        const TIME: HeaderName = HeaderName::from_static(headers::TIME);
        const FIRST_PUBLISHED: HeaderName = HeaderName::from_static(headers::FIRST_PUBLISHED);
        const CONTENT_TYPE: HeaderName = HeaderName::from_static(headers::CONTENT_TYPE);
        const TRACEPARENT: HeaderName = HeaderName::from_static(headers::TRACEPARENT);
        for (field, value) in [
            ("aggregate_type", &row.aggregate_type),
            ("aggregate_id", &row.aggregate_id),
            ("event_type", &row.event_type),
        ] {
            if !is_valid_token(value) {
                return Err(format!(
                    "{field} {:?} is not 1-128 ASCII letters, digits, '-', '_', ':' or '@', so it \
                     cannot be a subject token",
                    value.chars().take(140).collect::<String>()
                ));
            }
        }
        let mut headers = HeaderMap::new();
        headers.insert(SPECVERSION, "1.0");
        headers.insert(ID, HeaderValue::from(row.id.to_string()));
        headers.insert(TYPE, row.event_type.as_str());
        headers.insert(SOURCE, self.config.source.as_str());
        headers.insert(SUBJECT, row.aggregate_id.as_str());
        headers.insert(
            TIME,
            HeaderValue::from(row.created_at.to_rfc3339_opts(SecondsFormat::Micros, true)),
        );
        headers.insert(
            FIRST_PUBLISHED,
            HeaderValue::from(
                row.first_published_at
                    .to_rfc3339_opts(SecondsFormat::Micros, true),
            ),
        );
        headers.insert(CONTENT_TYPE, "application/json");
        match row.traceparent.take() {
            Some(traceparent) if is_traceparent(&traceparent) => {
                headers.insert(TRACEPARENT, HeaderValue::from(traceparent));
            }
            Some(_) => tracing::warn!(
                event.id = %row.id,
                "malformed traceparent left out of the message (the event is published without it)"
            ),
            None => {}
        }
        Ok(Message {
            id: row.id,
            subject: format!(
                "{}.{}.{}",
                self.config.subject_prefix, row.event_type, row.aggregate_id
            ),
            headers,
            payload: Bytes::from(std::mem::take(&mut row.payload)),
        })
    }
}
