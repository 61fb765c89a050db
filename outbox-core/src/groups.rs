//! Dead events and dead letters grouped by cause: what an operator facing hundreds of them reads
//! first, each group a filter away from its bulk action.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// The most dead items one grouping reads (the oldest first is not promised past it): it keeps
/// the grouping as cheap with a flood of failures as with a few.
pub const GROUPS_READ_LIMIT: i64 = crate::outbox::COUNT_LIMIT;

/// Dead items sharing an event type and the kind of their error, or, for those whose error has
/// no kind, its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct DeadGroup {
    /// Their event type (a dead letter's `ce-type`), when they had one.
    pub event_type: Option<String>,
    /// The kind of their error; `None` when they have none, and are grouped by `error`.
    pub error_class: Option<String>,
    /// Their error word for word without a kind; with one, the error of one of them.
    pub error: String,
    /// How many there are (of the dead items read).
    pub count: i64,
    /// When the oldest of them was enqueued (events) or dead-lettered (letters).
    pub oldest: DateTime<Utc>,
    /// When the newest of them was.
    pub newest: DateTime<Utc>,
}
