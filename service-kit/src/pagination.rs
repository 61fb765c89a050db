//! Opaque cursors for newest-first lists ordered by `(created_at, id)`.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::IntoParams;

use crate::ApiError;

/// Items per page when the client does not say.
pub const DEFAULT_LIMIT: i64 = 50;
/// Most items per page.
pub const MAX_LIMIT: i64 = 200;

/// The position after the last item of a page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// `created_at` of the last item.
    pub t: DateTime<Utc>,
    /// `id` of the last item.
    pub id: String,
}

impl Cursor {
    /// The opaque text form.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    /// Parses the text form; anything else is a 422 naming `cursor`.
    pub fn decode(text: &str) -> Result<Self, ApiError> {
        URL_SAFE_NO_PAD
            .decode(text)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| ApiError::validation("cursor", "not a cursor returned by this API"))
    }
}

/// The query of a paged list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page, 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// `nextCursor` of the previous page.
    pub cursor: Option<String>,
}

/// The page size asked for, checked against the bounds.
pub fn limit(requested: Option<i64>) -> Result<i64, ApiError> {
    match requested {
        None => Ok(DEFAULT_LIMIT),
        Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        Some(_) => Err(ApiError::validation(
            "limit",
            format!("must be between 1 and {MAX_LIMIT}"),
        )),
    }
}

/// Cuts `rows` (fetched with `limit + 1`) to one page and the cursor of the next, if any.
pub fn page<T>(
    mut rows: Vec<T>,
    limit: i64,
    cursor_of: impl Fn(&T) -> String,
) -> (Vec<T>, Option<String>) {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if rows.len() <= limit {
        return (rows, None);
    }
    rows.truncate(limit);
    let next = rows.last().map(cursor_of);
    (rows, next)
}

/// The id after which an oldest-first list of numbered items continues (0: from the start).
pub fn after_id(cursor: Option<&str>) -> Result<i64, ApiError> {
    cursor.map_or(Ok(0), |cursor| {
        cursor
            .parse()
            .map_err(|_| ApiError::validation("cursor", "not a cursor returned by this API"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_garbage_is_refused() {
        let cursor = Cursor {
            t: Utc::now(),
            id: "o1".into(),
        };
        assert_eq!(Cursor::decode(&cursor.encode()).unwrap(), cursor);
        assert_eq!(
            Cursor::decode("not-a-cursor")
                .unwrap_err()
                .status()
                .as_u16(),
            422
        );
    }

    #[test]
    fn limit_bounds() {
        assert_eq!(limit(None).unwrap(), DEFAULT_LIMIT);
        assert_eq!(limit(Some(200)).unwrap(), 200);
        assert!(limit(Some(0)).is_err());
        assert!(limit(Some(201)).is_err());
        assert_eq!(after_id(None).unwrap(), 0);
        assert_eq!(after_id(Some("42")).unwrap(), 42);
        assert!(after_id(Some("x")).is_err());
    }

    #[test]
    fn page_cuts_and_points_at_the_last_item() {
        let t = Utc::now();
        let rows: Vec<i32> = (0..3).collect();
        let (items, next) = page(rows.clone(), 2, |i| {
            Cursor {
                t,
                id: i.to_string(),
            }
            .encode()
        });
        assert_eq!(items, [0, 1]);
        assert_eq!(Cursor::decode(&next.unwrap()).unwrap().id, "1");
        let (items, next) = page(rows, 3, |i| {
            Cursor {
                t,
                id: i.to_string(),
            }
            .encode()
        });
        assert_eq!(items.len(), 3);
        assert!(next.is_none());
    }
}
