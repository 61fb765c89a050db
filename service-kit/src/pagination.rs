//! Cursors for paged lists. Every string of a cursor's documented format is a valid position
//! (clients may build one), so the API document says exactly what is accepted:
//! - newest-first lists ordered by `(created_at, id)`: `{microseconds since 1970}.{id}`;
//! - oldest-first lists of numbered items: the number of the last item.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::ApiError;

/// Items per page when the client does not say.
pub const DEFAULT_LIMIT: i64 = 50;
/// Most items per page.
pub const MAX_LIMIT: i64 = 200;

/// The position after the last item of a newest-first page: its `created_at` and `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// `created_at` of the last item.
    pub t: DateTime<Utc>,
    /// `id` of the last item.
    pub id: String,
}

impl Cursor {
    /// The text form, `{microseconds since 1970}.{id}`.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.t.timestamp_micros(), self.id)
    }

    /// Parses the text form (documented as [`PageParams::cursor`]'s pattern); anything else is
    /// a 422 naming `cursor`.
    pub fn decode(text: &str) -> Result<Self, ApiError> {
        let invalid = || {
            ApiError::validation(
                "cursor",
                "must be {microseconds since 1970, 1-16 digits}.{id, 1-128 of [A-Za-z0-9_:@-]}",
            )
        };
        let (micros, id) = text.split_once('.').ok_or_else(invalid)?;
        if !is_number(micros, 16) || !jetstream_outbox::event::is_valid_token(id) {
            return Err(invalid());
        }
        let t = micros
            .parse()
            .ok()
            .and_then(DateTime::from_timestamp_micros)
            .ok_or_else(invalid)?;
        Ok(Self { t, id: id.into() })
    }
}

/// Whether `text` is 1 to `max_digits` ASCII digits.
fn is_number(text: &str, max_digits: usize) -> bool {
    (1..=max_digits).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit())
}

/// The query of a newest-first list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page, 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// `nextCursor` of the previous page: `{microseconds since 1970}.{id}` of the last item
    /// seen; the page holds the items after it.
    #[param(pattern = r"^[0-9]{1,16}\.[A-Za-z0-9_:@-]{1,128}$")]
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

/// A page of a list, in the list's order.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Page<T: ToSchema> {
    /// The items of this page.
    #[schema(schema_with = items_by_reference::<T>)]
    pub items: Vec<T>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// `items` as an array of references to `T`'s schema: utoipa inlines a generic argument's
/// whole schema otherwise, once per list.
fn items_by_reference<T: ToSchema>() -> utoipa::openapi::Array {
    utoipa::openapi::Array::new(utoipa::openapi::Ref::from_schema_name(T::name()))
}

impl<T: ToSchema> Page<T> {
    /// Cuts `rows` (fetched with `limit + 1`) to one page, with the cursor of the next if any.
    pub fn of(mut rows: Vec<T>, limit: i64, cursor_of: impl Fn(&T) -> String) -> Self {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let next_cursor = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(cursor_of)
        } else {
            None
        };
        Self {
            items: rows,
            next_cursor,
        }
    }
}

/// The number after which an oldest-first list continues (0: from the start).
pub fn after_number(cursor: Option<&str>) -> Result<i64, ApiError> {
    cursor.map_or(Ok(0), |cursor| {
        is_number(cursor, 18)
            .then(|| cursor.parse().ok())
            .flatten()
            .ok_or_else(|| ApiError::validation("cursor", "must be 1-18 digits"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_garbage_is_refused() {
        // PostgreSQL keeps microseconds, and so does a cursor.
        let cursor = Cursor {
            t: DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).unwrap(),
            id: "o1".into(),
        };
        assert_eq!(Cursor::decode(&cursor.encode()).unwrap(), cursor);
        for garbage in [
            "",
            "not-a-cursor",
            ".o1",
            "1.",
            "1.o.1",
            "x1.o1",
            "12345678901234567.o1",
        ] {
            assert_eq!(
                Cursor::decode(garbage).unwrap_err().status().as_u16(),
                422,
                "{garbage}"
            );
        }
    }

    #[test]
    fn every_string_of_the_documented_format_is_a_position() {
        let newest = Cursor::decode("9999999999999999.Zz_:@-").unwrap();
        assert_eq!(newest.id, "Zz_:@-");
        assert_eq!(Cursor::decode("0.a").unwrap().t, DateTime::UNIX_EPOCH);
        assert_eq!(
            after_number(Some("999999999999999999")).unwrap(),
            999_999_999_999_999_999
        );
    }

    #[test]
    fn limit_bounds() {
        assert_eq!(limit(None).unwrap(), DEFAULT_LIMIT);
        assert_eq!(limit(Some(200)).unwrap(), 200);
        assert!(limit(Some(0)).is_err());
        assert!(limit(Some(201)).is_err());
        assert_eq!(after_number(None).unwrap(), 0);
        assert_eq!(after_number(Some("42")).unwrap(), 42);
        assert!(after_number(Some("x")).is_err());
        assert!(after_number(Some("+1")).is_err());
        assert!(after_number(Some("")).is_err());
    }

    #[test]
    fn page_cuts_and_points_at_the_last_item() {
        let t = Utc::now();
        let rows: Vec<i32> = (0..3).collect();
        let cursor_of = |i: &i32| {
            Cursor {
                t,
                id: i.to_string(),
            }
            .encode()
        };
        let page = Page::of(rows.clone(), 2, cursor_of);
        assert_eq!(page.items, [0, 1]);
        assert_eq!(Cursor::decode(&page.next_cursor.unwrap()).unwrap().id, "1");
        let page = Page::of(rows, 3, cursor_of);
        assert_eq!(page.items.len(), 3);
        assert!(page.next_cursor.is_none());
    }
}
