//! Reading a message: its identity headers and its body, into the change it asks for, or the
//! reason it can never be applied. A broken or hostile producer's bytes never panic it.

use async_nats::HeaderMap;
use jetstream_outbox::headers;
use serde::Deserialize;

use crate::invoices::Change;
use crate::reason::DeadReason;

/// The payload fields billing reads; other fields are ignored.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct OrderEvent {
    order_id: String,
    total_minor: i64,
}

/// Largest body billing reads; a larger one is dead-lettered unread.
const MAX_BODY: usize = 1024 * 1024;

/// The change a message asks for: `None` for event types billing does not handle.
pub(crate) fn parse(headers: &HeaderMap, payload: &[u8]) -> Result<Option<Change>, DeadReason> {
    // Two values of one of these would leave the message's identity or meaning ambiguous.
    for name in [headers::ID, headers::TYPE] {
        if headers.get_all(name).count() > 1 {
            return Err(DeadReason::RepeatedHeader(name));
        }
    }
    let Some(event_type) = header(headers, headers::TYPE) else {
        return Err(DeadReason::MissingHeader(headers::TYPE));
    };
    if !matches!(event_type, "OrderPlaced" | "OrderPaid") {
        return Ok(None);
    }
    // The inbox key: anything else (empty, oversized, a NUL byte) could not be told apart from
    // another message's id, or could not be stored at all.
    match header(headers, headers::ID) {
        None => return Err(DeadReason::MissingHeader(headers::ID)),
        Some(id) if !jetstream_outbox::event::is_valid_token(id) => {
            return Err(DeadReason::InvalidId(id.len()));
        }
        Some(_) => {}
    }
    if payload.len() > MAX_BODY {
        return Err(DeadReason::BodyTooLarge(payload.len()));
    }
    let event: OrderEvent =
        serde_json::from_slice(payload).map_err(|e| DeadReason::InvalidPayload {
            event_type: event_type.to_owned(),
            error: e.to_string(),
        })?;
    if !jetstream_outbox::event::is_valid_token(&event.order_id) {
        return Err(DeadReason::InvalidOrderId(event_type.to_owned()));
    }
    Ok(Some(match event_type {
        "OrderPlaced" if event.total_minor > 0 => Change::Open {
            order_id: event.order_id,
            total_minor: event.total_minor,
        },
        "OrderPlaced" => return Err(DeadReason::InvalidTotal),
        _ => Change::Pay {
            order_id: event.order_id,
        },
    }))
}

pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(async_nats::HeaderValue::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(event_type: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(headers::ID, "0193a0c4-7d1e-7c3b-9f1a-1b2c3d4e5f60");
        headers.insert(headers::TYPE, event_type);
        headers
    }

    /// The contract's body (`service_kit::events::OrderEvent`, what orders-service publishes
    /// and `/asyncapi.json` describes) is what billing reads: each event type it consumes
    /// becomes its change.
    #[test]
    fn the_contracts_events_are_understood() {
        let event = service_kit::events::OrderEvent {
            order_id: "o-1".into(),
            customer: "ada".into(),
            total_minor: 1999,
            status: service_kit::events::EventStatus::Placed,
        };
        let body = serde_json::to_vec(&event).unwrap();
        assert_eq!(
            parse(&headers("OrderPlaced"), &body).unwrap(),
            Some(Change::Open {
                order_id: "o-1".into(),
                total_minor: 1999
            })
        );
        assert!(matches!(
            parse(&headers("OrderPaid"), &body).unwrap(),
            Some(Change::Pay { .. })
        ));
        assert_eq!(parse(&headers("OrderShipped"), &body).unwrap(), None);
    }

    proptest::proptest! {
        /// Whatever the bytes, parsing answers (a change, "ignore" or a reason) without panicking.
        #[test]
        fn parsing_arbitrary_bodies_never_panics(
            event_type in "(OrderPlaced|OrderPaid|OrderShipped|[A-Za-z]{0,12})",
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        ) {
            let _ = parse(&headers(&event_type), &body);
        }

        /// Every well-formed OrderPlaced opens an invoice with its order id and total.
        #[test]
        fn well_formed_order_placed_is_understood(
            order_id in "[A-Za-z0-9_:@-]{1,128}",
            total_minor in 1_i64..=i64::MAX,
        ) {
            let body = serde_json::json!({"orderId": order_id, "totalMinor": total_minor});
            let change = parse(&headers("OrderPlaced"), body.to_string().as_bytes()).unwrap();
            proptest::prop_assert_eq!(change, Some(Change::Open { order_id, total_minor }));
        }

        /// Order ids that could not be a NATS subject token, and non-positive totals, are refused.
        #[test]
        fn hostile_values_are_refused(
            order_id in "[a-z]{0,5}[.*> \t][a-z]{0,5}",
            total_minor in i64::MIN..=0,
        ) {
            let bad_id = serde_json::json!({"orderId": order_id, "totalMinor": 5});
            proptest::prop_assert!(parse(&headers("OrderPlaced"), bad_id.to_string().as_bytes()).is_err());
            let bad_total = serde_json::json!({"orderId": "o1", "totalMinor": total_minor});
            proptest::prop_assert!(parse(&headers("OrderPlaced"), bad_total.to_string().as_bytes()).is_err());
        }
    }

    #[test]
    fn order_placed_opens_an_invoice() {
        let body = br#"{"orderId":"o1","customer":"ada","totalMinor":500,"status":"placed"}"#;
        assert_eq!(
            parse(&headers("OrderPlaced"), body).unwrap(),
            Some(Change::Open {
                order_id: "o1".into(),
                total_minor: 500
            })
        );
    }

    #[test]
    fn unknown_types_are_ignored_and_garbage_is_refused() {
        assert_eq!(parse(&headers("OrderShipped"), b"not json").unwrap(), None);
        assert!(parse(&headers("OrderPlaced"), b"not json").is_err());
        assert!(
            parse(
                &headers("OrderPlaced"),
                br#"{"orderId":"o1","totalMinor":-5}"#
            )
            .is_err()
        );
        assert!(
            parse(
                &headers("OrderPaid"),
                br#"{"orderId":"a.b","totalMinor":5}"#
            )
            .is_err()
        );
        assert!(parse(&HeaderMap::new(), b"{}").is_err());
    }

    #[test]
    fn repeated_identity_headers_and_huge_bodies_are_refused() {
        let placed = br#"{"orderId":"o1","totalMinor":5}"#;
        for name in [headers::ID, headers::TYPE] {
            let mut twice = headers("OrderPlaced");
            twice.append(name, "OrderPaid");
            let error = parse(&twice, placed).unwrap_err();
            assert!(error.to_string().contains(name), "{error}");
        }
        let mut huge = placed.to_vec();
        huge.resize(MAX_BODY + 1, b' ');
        assert!(
            parse(&headers("OrderPlaced"), &huge)
                .unwrap_err()
                .to_string()
                .contains("1 MiB")
        );
        // An event type billing ignores is ignored whatever its size.
        assert_eq!(parse(&headers("OrderShipped"), &huge).unwrap(), None);
    }
}
