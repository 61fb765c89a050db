//! What both services' dead-letter endpoints share: checking filter values and the answer of a
//! bulk action.

use jetstream_outbox::groups::DeadGroup;
use serde::Serialize;
use utoipa::ToSchema;

use crate::ApiError;

/// Most groups `GET …/dead/groups` answers.
pub const GROUPS_SHOWN: i64 = 50;

/// Dead items grouped by cause, the largest groups first.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeadGroups {
    /// At most [`GROUPS_SHOWN`] groups, of the first 10,000 dead items.
    pub groups: Vec<DeadGroup>,
}

/// Longest `errorContains` filter.
const MAX_FILTER_TEXT: usize = 500;

/// What a bulk action on dead events or letters did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BulkOutcome {
    /// How many matching items the action took: retried or replayed, or skipped.
    pub count: u64,
    /// How many matching items it looked at and left open (a replay that is still not
    /// applicable, or never will be).
    pub not_applied: u64,
    /// Set when matching items are left that this request did not reach: send the same
    /// request again with `cursor` set to it.
    pub next_cursor: Option<String>,
}

impl BulkOutcome {
    /// A bulk action that took `count` items in one go.
    pub fn took(count: u64) -> Self {
        Self {
            count,
            ..Self::default()
        }
    }
}

/// A bulk action's filters as the audit log shows them: `key=value` for each one given,
/// `every item` for none.
pub fn described(filters: &[(&str, Option<&str>)]) -> String {
    let given: Vec<String> = filters
        .iter()
        .filter_map(|(key, value)| value.map(|value| format!("{key}={value}")))
        .collect();
    if given.is_empty() {
        "every item".to_owned()
    } else {
        given.join(" ")
    }
}

/// An id-like filter value (an aggregate or event type): 1-128 of `[A-Za-z0-9_:@-]`, as the
/// values it is compared with, else a 422 naming `field`.
pub fn token_filter(field: &str, value: Option<String>) -> Result<Option<String>, ApiError> {
    match value {
        Some(value) if !jetstream_outbox::event::is_valid_token(&value) => Err(
            ApiError::validation(field, "must be 1-128 of [A-Za-z0-9_:@-]"),
        ),
        value => Ok(value),
    }
}

/// A text filter (part of an error message): 1-500 characters without NUL, which no stored
/// text holds, else a 422 naming `field`.
pub fn text_filter(field: &str, value: Option<String>) -> Result<Option<String>, ApiError> {
    match value {
        Some(value)
            if value.is_empty()
                || value.chars().count() > MAX_FILTER_TEXT
                || value.contains('\0') =>
        {
            Err(ApiError::validation(
                field,
                format!("must be 1-{MAX_FILTER_TEXT} characters without NUL"),
            ))
        }
        value => Ok(value),
    }
}

/// A time filter: an RFC 3339 time with its offset (`2026-12-06T09:00:00Z`), else a 422 naming
/// `field`.
pub fn time_filter(
    field: &str,
    value: Option<String>,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, ApiError> {
    value
        .map(|value| {
            chrono::DateTime::parse_from_rfc3339(&value)
                .map(|time| time.to_utc())
                .map_err(|_| {
                    ApiError::validation(
                        field,
                        "must be an RFC 3339 time with its offset, as 2026-12-06T09:00:00Z",
                    )
                })
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_refuse_what_no_stored_value_can_match() {
        assert_eq!(token_filter("eventType", None).unwrap(), None);
        assert_eq!(
            token_filter("eventType", Some("OrderPaid".into())).unwrap(),
            Some("OrderPaid".into())
        );
        for bad in ["", "a.b", "a b", &"x".repeat(129)] {
            let error = token_filter("eventType", Some(bad.into())).unwrap_err();
            assert_eq!(error.status().as_u16(), 422, "{bad:?}");
        }
        assert!(text_filter("errorContains", Some("max payload".into())).is_ok());
        for bad in ["", "a\0b", &"x".repeat(501)] {
            let error = text_filter("errorContains", Some(bad.into())).unwrap_err();
            assert_eq!(error.status().as_u16(), 422, "{bad:?}");
        }
    }
}
