//! `/outbox/...`: how far behind the relay is, and the dead events an operator retries or
//! skips (admin only).

use axum::extract::State;
use outbox_core::OutboxStats;
use outbox_core::outbox::{self, DeadEvent};
use serde::Serialize;
use service_kit::admin::Admin;
use service_kit::ops::{Action, Column, OpsPage, Tile};
use service_kit::pagination::{self, NumberedPageParams};
use service_kit::problem::Problem;
use service_kit::{ApiError, Json, Path, Query};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::AppState;

/// What `/ops` shows: the outbox's counts and its dead events.
const OPS: OpsPage = OpsPage {
    service: "orders-service",
    stats: "/outbox/stats",
    tiles: &[
        Tile {
            key: "pending",
            label: "Pending events",
            alert: false,
        },
        Tile {
            key: "oldestPendingSeconds",
            label: "Oldest pending",
            alert: false,
        },
        Tile {
            key: "dead",
            label: "Dead events",
            alert: true,
        },
        Tile {
            key: "parked",
            label: "Parked aggregates",
            alert: true,
        },
    ],
    dead: "/outbox/dead",
    columns: &[
        Column {
            key: "id",
            label: "Event id",
        },
        Column {
            key: "aggregateId",
            label: "Aggregate",
        },
        Column {
            key: "eventType",
            label: "Type",
        },
        Column {
            key: "attempts",
            label: "Attempts",
        },
        Column {
            key: "lastError",
            label: "Last error",
        },
        Column {
            key: "createdAt",
            label: "Enqueued",
        },
    ],
    actions: &[
        Action {
            name: "retry",
            label: "Retry",
        },
        Action {
            name: "skip",
            label: "Skip",
        },
    ],
};

/// The outbox routes and the ops page.
pub fn router() -> OpenApiRouter<AppState> {
    OPS.router()
        .routes(routes!(stats))
        .routes(routes!(metrics))
        .routes(routes!(list_dead))
        .routes(routes!(retry))
        .routes(routes!(skip))
}

/// Pending, dead and parked events and the age of the oldest pending one.
#[utoipa::path(get, path = "/outbox/stats", tag = "outbox",
    responses((status = 200, description = "Current outbox counts", body = OutboxStats)))]
async fn stats(State(state): State<AppState>) -> Result<Json<OutboxStats>, ApiError> {
    Ok(Json(outbox::stats(&state.pool).await?))
}

/// Prometheus metrics: HTTP per route, relay counters and latency, and outbox gauges.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses(
    (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"),
))]
async fn metrics(State(state): State<AppState>) -> Result<String, ApiError> {
    let current = outbox::stats(&state.pool).await?;
    metrics::gauge!("outbox_pending").set(current.pending as f64);
    metrics::gauge!("outbox_dead").set(current.dead as f64);
    metrics::gauge!("outbox_parked_aggregates").set(current.parked as f64);
    metrics::gauge!("outbox_oldest_pending_seconds").set(current.oldest_pending_seconds);
    Ok(service_kit::metrics::render())
}

/// A page of dead events, oldest first.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct DeadPage {
    items: Vec<DeadEvent>,
    /// Pass as `cursor` for the next page; null on the last page.
    next_cursor: Option<String>,
}

/// What an admin action did.
#[derive(Debug, Serialize, ToSchema)]
struct ActionResult {
    /// The event.
    id: Uuid,
    /// Its status now: `pending` after a retry, `skipped` after a skip.
    status: &'static str,
}

/// Lists dead events with their attempts and last error (admin).
#[utoipa::path(get, path = "/outbox/dead", tag = "outbox", params(NumberedPageParams),
    security(("admin" = [])), responses(
    (status = 200, description = "A page of dead events", body = DeadPage),
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
    let rows = outbox::dead(&state.pool, after, limit + 1).await?;
    let (items, next_cursor) = pagination::page(rows, limit, |e| e.seq.to_string());
    Ok(Json(DeadPage { items, next_cursor }))
}

/// Publishes a dead event again; the events it held back follow (admin).
#[utoipa::path(post, path = "/outbox/dead/{id}/retry", tag = "outbox",
    params(("id" = Uuid, Path, description = "Event id (ce-id)")),
    security(("admin" = [])), responses(
    (status = 200, description = "Pending again", body = ActionResult),
    (status = 404, description = "No dead event with this id", body = Problem,
        content_type = "application/problem+json"),
    (status = 401, description = "Missing or wrong admin token", body = Problem,
        content_type = "application/problem+json"),
    (status = 403, description = "ADMIN_TOKEN is not configured", body = Problem,
        content_type = "application/problem+json"),
))]
async fn retry(
    _: Admin,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<Json<ActionResult>, ApiError> {
    if !outbox::retry_dead(&state.pool, id).await? {
        return Err(ApiError::not_found(format!("no dead event {id}")));
    }
    tracing::warn!(event.id = %id, action = "retry", "admin action on dead event");
    Ok(Json(ActionResult {
        id,
        status: "pending",
    }))
}

/// Gives up on a dead event: it stays recorded as skipped, the events it held back follow
/// (admin).
#[utoipa::path(post, path = "/outbox/dead/{id}/skip", tag = "outbox",
    params(("id" = Uuid, Path, description = "Event id (ce-id)")),
    security(("admin" = [])), responses(
    (status = 200, description = "Skipped", body = ActionResult),
    (status = 404, description = "No dead event with this id", body = Problem,
        content_type = "application/problem+json"),
    (status = 401, description = "Missing or wrong admin token", body = Problem,
        content_type = "application/problem+json"),
    (status = 403, description = "ADMIN_TOKEN is not configured", body = Problem,
        content_type = "application/problem+json"),
))]
async fn skip(
    _: Admin,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<Json<ActionResult>, ApiError> {
    if !outbox::skip_dead(&state.pool, id).await? {
        return Err(ApiError::not_found(format!("no dead event {id}")));
    }
    tracing::warn!(event.id = %id, action = "skip", "admin action on dead event");
    Ok(Json(ActionResult {
        id,
        status: "skipped",
    }))
}
