//! The order events on NATS: the contract between orders-service, which publishes them, and
//! billing-service, which consumes them. Its machine-readable form is the AsyncAPI 3 document
//! both serve at `/asyncapi.json`, made here from the same types (the body's schema is the one
//! `utoipa` derives from [`OrderEvent`]; the headers are `jetstream_outbox::headers`).

use jetstream_outbox::headers;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

/// The event types of an order's life.
pub const EVENT_TYPES: [&str; 3] = ["OrderPlaced", "OrderPaid", "OrderShipped"];

/// An order's status as an event carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EventStatus {
    /// Placed, not yet paid.
    Placed,
    /// Paid.
    Paid,
    /// Shipped.
    Shipped,
}

/// The body of every order event: the order as the event left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"orderId": "o-1", "customer": "ada", "totalMinor": 1999,
                          "status": "placed"}))]
pub struct OrderEvent {
    /// The order: 1-128 of `[A-Za-z0-9_:@-]`, also the subject's last token and `ce-subject`.
    #[schema(pattern = "^[A-Za-z0-9_:@-]{1,128}$")]
    pub order_id: String,
    /// Who ordered.
    pub customer: String,
    /// The total in minor units (cents): a positive 64-bit integer.
    #[schema(minimum = 1)]
    pub total_minor: i64,
    /// The order's status after the event.
    pub status: EventStatus,
}

/// The schema of every event's headers.
fn headers_schema() -> Value {
    let token = "^[A-Za-z0-9_:@-]{1,128}$";
    let time = json!({"type": "string", "format": "date-time"});
    json!({
        "type": "object",
        "description": "CloudEvents attributes in binary mode, JetStream's message id and the \
                        W3C trace context.",
        "required": [headers::SPECVERSION, headers::ID, headers::TYPE, headers::SOURCE,
                     headers::SUBJECT, headers::TIME, headers::FIRST_PUBLISHED,
                     headers::CONTENT_TYPE, "Nats-Msg-Id"],
        "properties": {
            headers::SPECVERSION: {"type": "string", "const": "1.0"},
            headers::ID: {"type": "string", "format": "uuid",
                          "description": "The event's id, a UUIDv7 made when it was enqueued."},
            headers::TYPE: {"type": "string", "enum": EVENT_TYPES},
            headers::SOURCE: {"type": "string", "const": "/orders-service"},
            headers::SUBJECT: {"type": "string", "pattern": token,
                               "description": "The order id."},
            headers::TIME: {"description": "When the event was enqueued.", "allOf": [time]},
            headers::FIRST_PUBLISHED: {
                "description": "When a copy of the event was first stored by the broker; the \
                                same on every copy. Consumers judge a message's age from it.",
                "allOf": [time]
            },
            headers::CONTENT_TYPE: {"type": "string", "const": "application/json"},
            "Nats-Msg-Id": {"type": "string", "format": "uuid",
                            "description": "The same as ce-id: the broker drops a copy inside \
                                            its duplicate window."},
            headers::TRACEPARENT: {
                "type": "string",
                "pattern": "^[0-9a-fA-F]{2}-[0-9a-fA-F]{32}-[0-9a-fA-F]{16}-[0-9a-fA-F]{2}$",
                "description": "W3C trace context of the request that made the event."
            }
        }
    })
}

/// The AsyncAPI 3 document of the order events published under `prefix`.
pub fn asyncapi(prefix: &str) -> Value {
    let headers_schema = headers_schema();
    let payload = serde_json::to_value(<OrderEvent as utoipa::PartialSchema>::schema())
        .unwrap_or(Value::Null);
    let status = serde_json::to_value(<EventStatus as utoipa::PartialSchema>::schema())
        .unwrap_or(Value::Null);
    let message = |event_type: &str, summary: &str| {
        json!({
            "name": event_type,
            "title": event_type,
            "summary": summary,
            "contentType": "application/json",
            "headers": {"$ref": "#/components/schemas/EventHeaders"},
            "payload": {"$ref": "#/components/schemas/OrderEvent"}
        })
    };
    let refs = |types: &[&str]| -> Vec<Value> {
        types
            .iter()
            .map(|t| json!({"$ref": format!("#/channels/orderEvents/messages/{t}")}))
            .collect()
    };
    json!({
        "asyncapi": "3.1.0",
        "info": {
            "title": "Order events",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Events of an order's life, published by orders-service through a \
                            transactional outbox to one JetStream stream, at least once and in \
                            each order's order, and consumed by billing-service through an \
                            inbox (a copy changes nothing)."
        },
        "defaultContentType": "application/json",
        "channels": {
            "orderEvents": {
                "address": format!("{prefix}.{{eventType}}.{{orderId}}"),
                "description": "One subject per event type and order, captured by the stream \
                                (NATS_STREAM).",
                "parameters": {
                    "eventType": {"enum": EVENT_TYPES, "description": "ce-type."},
                    "orderId": {"description": "The order id, 1-128 of [A-Za-z0-9_:@-]."}
                },
                "messages": {
                    "OrderPlaced": {"$ref": "#/components/messages/OrderPlaced"},
                    "OrderPaid": {"$ref": "#/components/messages/OrderPaid"},
                    "OrderShipped": {"$ref": "#/components/messages/OrderShipped"}
                }
            }
        },
        "operations": {
            "publishOrderEvents": {
                "action": "send",
                "title": "orders-service publishes",
                "channel": {"$ref": "#/channels/orderEvents"},
                "messages": refs(&EVENT_TYPES)
            },
            "consumeOrderEvents": {
                "action": "receive",
                "title": "billing-service consumes (durable pull consumer NATS_CONSUMER)",
                "channel": {"$ref": "#/channels/orderEvents"},
                "messages": refs(&["OrderPlaced", "OrderPaid"])
            }
        },
        "components": {
            "messages": {
                "OrderPlaced": message("OrderPlaced", "An order was placed; billing opens its invoice."),
                "OrderPaid": message("OrderPaid", "An order was paid; billing marks its invoice paid."),
                "OrderShipped": message("OrderShipped", "An order was shipped; billing ignores it.")
            },
            "schemas": {
                "EventHeaders": headers_schema,
                "OrderEvent": payload,
                "EventStatus": status
            }
        }
    })
}
