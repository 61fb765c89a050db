//! The NATS header names of a relayed message, for the relay, consumers and tests to share:
//! CloudEvents attributes in binary mode (`ce-` headers, the body is the event's data) and the
//! W3C trace context. JetStream's own `Nats-Msg-Id` is [`async_nats::header::NATS_MESSAGE_ID`].

/// CloudEvents `specversion`: `1.0`.
pub const SPECVERSION: &str = "ce-specversion";
/// CloudEvents `id`: the outbox row's UUID, also the inbox's message id.
pub const ID: &str = "ce-id";
/// CloudEvents `type`: the event type.
pub const TYPE: &str = "ce-type";
/// CloudEvents `source`: [`crate::RelayConfig::source`].
pub const SOURCE: &str = "ce-source";
/// CloudEvents `subject`: the aggregate id.
pub const SUBJECT: &str = "ce-subject";
/// CloudEvents `time`: when the event was enqueued, RFC 3339 with microseconds, UTC.
pub const TIME: &str = "ce-time";
/// When a copy of the event was first stored by the broker, RFC 3339 with microseconds, UTC
/// (a CloudEvents extension attribute): the same on every copy, also one published again after
/// the broker lost it. A consumer judges a message's age from it, so that an event that waited
/// in the outbox (an outage, a parked aggregate) is as new as its first publish.
pub const FIRST_PUBLISHED: &str = "ce-firstpublishedtime";
/// The body's media type: `application/json`.
pub const CONTENT_TYPE: &str = "content-type";
/// W3C `traceparent` of the request that enqueued the event, when it had one.
pub const TRACEPARENT: &str = "traceparent";
