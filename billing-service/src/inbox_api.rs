//! `/inbox/...`: what the consumer has processed, and the dead letters an operator replays
//! (admin only).

use axum::extract::State;
use outbox_core::inbox::{DeadLetter, InboxStats};
use serde::Serialize;
use service_kit::admin::Admin;
use service_kit::ops::{Action, Column, OpsPage, Tile};
use service_kit::pagination::{self, NumberedPageParams};
use service_kit::problem::Problem;
use service_kit::{ApiError, Json, Path, Query};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::consumer::{Verdict, headers_from_json};

/// What `/ops` shows: the inbox's counts and its open dead letters.
const OPS: OpsPage = OpsPage {
    service: "billing-service",
    stats: "/inbox/stats",
    tiles: &[
        Tile {
            key: "processed",
            label: "Processed messages",
            alert: false,
        },
        Tile {
            key: "duplicate",
            label: "Duplicates recognised",
            alert: false,
        },
        Tile {
            key: "dead",
            label: "Open dead letters",
            alert: true,
        },
    ],
    dead: "/inbox/dead",
    columns: &[
        Column {
            key: "id",
            label: "Id",
        },
        Column {
            key: "messageId",
            label: "Message id",
        },
        Column {
            key: "subject",
            label: "Subject",
        },
        Column {
            key: "error",
            label: "Error",
        },
        Column {
            key: "deliveries",
            label: "Deliveries",
        },
        Column {
            key: "createdAt",
            label: "Dead since",
        },
    ],
    actions: &[
        Action {
            name: "retry",
            label: "Replay",
        },
        Action {
            name: "skip",
            label: "Skip",
        },
    ],
};

/// The inbox routes and the ops page.
pub fn router() -> OpenApiRouter<AppState> {
    OPS.router()
        .routes(routes!(stats))
        .routes(routes!(metrics))
        .routes(routes!(list_dead))
        .routes(routes!(retry))
        .routes(routes!(skip))
}

/// Processed messages, recognised duplicates and open dead letters.
#[utoipa::path(get, path = "/inbox/stats", tag = "inbox",
    responses((status = 200, description = "Current inbox counts", body = InboxStats)))]
async fn stats(State(state): State<AppState>) -> Result<Json<InboxStats>, ApiError> {
    Ok(Json(state.rules.inbox().stats().await?))
}

/// Prometheus metrics: HTTP per route, inbox counters, handling latency, open dead letters.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses(
    (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"),
))]
async fn metrics(State(state): State<AppState>) -> Result<String, ApiError> {
    let current = state.rules.inbox().stats().await?;
    metrics::gauge!("inbox_dead_letters_open").set(current.dead as f64);
    Ok(service_kit::metrics::render())
}

/// A page of open dead letters, oldest first.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct DeadPage {
    items: Vec<DeadLetter>,
    /// Pass as `cursor` for the next page; null on the last page.
    next_cursor: Option<String>,
}

/// What an admin action did to a dead letter.
#[derive(Debug, Serialize, ToSchema)]
struct ActionResult {
    /// The dead letter.
    id: i64,
    /// `applied`: the message went through the inbox (applied now, or found applied before);
    /// `skipped`: closed without applying it.
    outcome: &'static str,
}

/// Lists open dead letters with their error and delivery count (admin).
#[utoipa::path(get, path = "/inbox/dead", tag = "inbox", params(NumberedPageParams),
    security(("admin" = [])), responses(
    (status = 200, description = "A page of dead letters", body = DeadPage),
    (status = 422, description = "Bad limit or cursor", body = Problem,
        content_type = "application/problem+json"),
    (status = 401, description = "Missing or wrong admin token", body = Problem,
        content_type = "application/problem+json"),
    (status = 403, description = "ADMIN_TOKEN is not configured", body = Problem,
        content_type = "application/problem+json"),
))]
async fn list_dead(
    _: Admin,
    State(state): State<AppState>,
    Query(params): Query<NumberedPageParams>,
) -> Result<Json<DeadPage>, ApiError> {
    let limit = pagination::limit(params.limit)?;
    let after = pagination::after_number(params.cursor.as_deref())?;
    let rows = state.rules.inbox().dead(after, limit + 1).await?;
    let (items, next_cursor) = pagination::page(rows, limit, |d| d.id.to_string());
    Ok(Json(DeadPage { items, next_cursor }))
}

/// Applies a dead letter again through the inbox, e.g. after the cause was fixed (admin).
/// Exactly-once still holds: a message applied before is recognised as a duplicate.
#[utoipa::path(post, path = "/inbox/dead/{id}/retry", tag = "inbox",
    params(("id" = i64, Path, description = "Dead letter id", minimum = 1)),
    security(("admin" = [])), responses(
    (status = 200, description = "Applied; the dead letter is closed", body = ActionResult),
    (status = 404, description = "No open dead letter with this id", body = Problem,
        content_type = "application/problem+json"),
    (status = 409, description = "Still not applicable; the dead letter stays", body = Problem,
        content_type = "application/problem+json"),
    (status = 422, description = "The message can never be applied", body = Problem,
        content_type = "application/problem+json"),
    (status = 401, description = "Missing or wrong admin token", body = Problem,
        content_type = "application/problem+json"),
    (status = 403, description = "ADMIN_TOKEN is not configured", body = Problem,
        content_type = "application/problem+json"),
))]
async fn retry(
    _: Admin,
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<ActionResult>, ApiError> {
    let inbox = state.rules.inbox();
    let letter = inbox
        .dead_letter_by_id(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no open dead letter {id}")))?;
    tracing::warn!(
        dead_letter.id = id,
        action = "retry",
        "admin action on dead letter"
    );
    let headers = headers_from_json(&letter.headers);
    match state.rules.verdict(&headers, &letter.payload).await {
        Verdict::Ack => {
            inbox.close_dead_letter(id).await?;
            Ok(Json(ActionResult {
                id,
                outcome: "applied",
            }))
        }
        Verdict::Retry(reason) => Err(ApiError::conflict(format!(
            "still not applicable: {reason}"
        ))),
        Verdict::Dead(reason) => Err(ApiError::validation("message", reason)),
    }
}

/// Gives up on a dead letter without applying it; it stays recorded as skipped (admin).
#[utoipa::path(post, path = "/inbox/dead/{id}/skip", tag = "inbox",
    params(("id" = i64, Path, description = "Dead letter id", minimum = 1)),
    security(("admin" = [])), responses(
    (status = 200, description = "Skipped; the dead letter is closed", body = ActionResult),
    (status = 404, description = "No open dead letter with this id", body = Problem,
        content_type = "application/problem+json"),
    (status = 401, description = "Missing or wrong admin token", body = Problem,
        content_type = "application/problem+json"),
    (status = 403, description = "ADMIN_TOKEN is not configured", body = Problem,
        content_type = "application/problem+json"),
))]
async fn skip(
    _: Admin,
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<ActionResult>, ApiError> {
    if !state.rules.inbox().skip_dead_letter(id).await? {
        return Err(ApiError::not_found(format!("no open dead letter {id}")));
    }
    tracing::warn!(
        dead_letter.id = id,
        action = "skip",
        "admin action on dead letter"
    );
    Ok(Json(ActionResult {
        id,
        outcome: "skipped",
    }))
}
