//! What the inbox reads from a JetStream message: its key ([`message_id`]) and, for a dead
//! letter, its headers as JSON and back ([`super::NewDeadLetter::of_message`],
//! [`super::DeadLetter::header_map`]).

use async_nats::HeaderMap;

use crate::event::is_valid_token;
use crate::headers;

/// The inbox key of `message`: its (first) `ce-id`, when it is a valid token
/// ([`is_valid_token`]); `None` for a message that can never be applied.
pub fn message_id(message: &async_nats::Message) -> Option<&str> {
    let id = message.headers.as_ref()?.get(headers::ID)?.as_str();
    is_valid_token(id).then_some(id)
}

/// A dead letter's body as the API serves it: its text when it is UTF-8, else its bytes.
#[derive(Debug, Clone, serde::Serialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Body {
    /// The body as text, when it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The body's bytes in hexadecimal, when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hex: Option<String>,
}

impl Body {
    /// `bytes` as text when they are UTF-8, else in hexadecimal.
    pub fn of(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => Self {
                text: Some(text.to_owned()),
                hex: None,
            },
            Err(_) => Self {
                text: None,
                hex: Some(hex(bytes)),
            },
        }
    }
}

/// Headers as a JSON object of string arrays, as dead letters keep them.
pub(super) fn headers_json(headers: &HeaderMap) -> serde_json::Value {
    headers
        .iter()
        .map(|(name, values)| {
            let values = values
                .iter()
                .map(|v| header_value_json(v.as_str()))
                .collect();
            (name.to_string(), serde_json::Value::Array(values))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Headers as [`headers_json`] stored them; what is not in that form is left out.
pub(super) fn headers_from_json(json: &serde_json::Value) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, values) in json.as_object().into_iter().flatten() {
        for value in values
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(header_value_from_json)
        {
            headers.append(name.as_str(), value);
        }
    }
    headers
}

/// A header value as JSON: a string, or `{"hex": …}` of its bytes when it holds a NUL, which a
/// JSONB string cannot (kept losslessly either way; [`headers_from_json`] reads both).
fn header_value_json(value: &str) -> serde_json::Value {
    if value.contains('\0') {
        serde_json::json!({ "hex": hex(value.as_bytes()) })
    } else {
        value.into()
    }
}

/// `bytes` in lower-case hexadecimal.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut hex, b| {
        use std::fmt::Write as _;
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

/// The text of a value [`header_value_json`] wrote.
fn header_value_from_json(value: &serde_json::Value) -> Option<String> {
    if let Some(text) = value.as_str() {
        return Some(text.to_owned());
    }
    let hex = value.get("hex")?.as_str()?;
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_text_when_it_can_be_and_bytes_otherwise() {
        let text = Body::of(br#"{"a":1}"#);
        assert_eq!((text.text.as_deref(), text.hex), (Some(r#"{"a":1}"#), None));
        let bytes = Body::of(&[0xff, 0x00, b'a']);
        assert_eq!((bytes.text, bytes.hex.as_deref()), (None, Some("ff0061")));
    }

    fn message(headers: Option<HeaderMap>) -> async_nats::Message {
        async_nats::Message {
            subject: "orders.order.o1".into(),
            reply: None,
            payload: bytes::Bytes::new(),
            headers,
            status: None,
            description: None,
            length: 0,
        }
    }

    #[test]
    fn headers_survive_the_dead_letter_round_trip() {
        let mut original = HeaderMap::new();
        original.insert(headers::ID, "0193a0c4-7d1e-7c3b-9f1a-1b2c3d4e5f60");
        original.append("x-multi", "a");
        original.append("x-multi", "b");
        original.insert("x-nul", "a\0b");
        let restored = headers_from_json(&headers_json(&original));
        assert_eq!(headers_json(&restored), headers_json(&original));
        assert_eq!(restored.get_all("x-multi").count(), 2);
        assert_eq!(
            restored.get("x-nul").map(async_nats::HeaderValue::as_str),
            Some("a\0b")
        );
        assert_eq!(headers_json(&original)["x-nul"][0]["hex"], "610062");
    }

    #[test]
    fn only_a_valid_ce_id_is_a_key() {
        let with_id = |id: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(headers::ID, id);
            message(Some(headers))
        };
        assert_eq!(message_id(&with_id("order-1")), Some("order-1"));
        assert_eq!(message_id(&with_id("")), None);
        assert_eq!(message_id(&with_id("a.b")), None);
        assert_eq!(message_id(&with_id(&"x".repeat(129))), None);
        assert_eq!(message_id(&message(Some(HeaderMap::new()))), None);
        assert_eq!(message_id(&message(None)), None);
    }
}
