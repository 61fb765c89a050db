//! `/outbox/...`: how far behind the relay is, and the dead events an operator retries or
//! skips (the admin token; the read-only token lists them), each action in the audit log.

use axum::extract::State;
use jetstream_outbox::OutboxStats;
use jetstream_outbox::outbox::{self, DeadEvent, DeadFilter};
use jetstream_outbox::wal::SlotLag;
use serde::{Deserialize, Serialize};
use service_kit::admin::{Admin, AdminRefusals, Reader};
use service_kit::audit;
use service_kit::dead::{self, BulkOutcome, DeadGroups};
use service_kit::pagination::{self, Page};
use service_kit::problem::Problem;
use service_kit::{ApiError, Json, Path, Query};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::AppState;

/// The outbox routes and the ops page.
pub fn router() -> OpenApiRouter<AppState> {
    crate::console::OPS
        .router()
        .routes(routes!(stats))
        .routes(routes!(metrics))
        .routes(routes!(list_dead))
        .routes(routes!(dead_groups))
        .routes(routes!(dead_event))
        .routes(routes!(retry))
        .routes(routes!(skip))
        .routes(routes!(retry_matching))
        .routes(routes!(skip_matching))
}

/// The outbox's counts, and with `RELAY_WAL_SLOT` its slot's lag.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboxStatsWithSlot {
    #[serde(flatten)]
    outbox: OutboxStats,
    /// With `RELAY_WAL_SLOT`: bytes of WAL the replication slot keeps that no instance has
    /// confirmed, as this instance last read them, every few seconds (0 before its first
    /// reading, or while the slot is being made again). It grows while no instance streams
    /// the slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    wal_lag_bytes: Option<i64>,
    /// With `RELAY_WAL_SLOT`: how long the oldest of those bytes has waited at least, from this
    /// instance's readings, which start with it (0 when none wait).
    #[serde(skip_serializing_if = "Option::is_none")]
    wal_lag_seconds: Option<f64>,
    /// With a relay in this instance (`RELAY_ENABLED`): the broker as that relay's gauges say
    /// it. `ok`; `unreachable` (events wait; `outbox_broker_unreachable`); `storage full`
    /// (events wait for room; `outbox_broker_storage_full`, and often
    /// `outbox_broker_unreachable` with it); `stream damaged` (the stream returns none of the
    /// messages it counts, and nothing is published until it is made again;
    /// `outbox_stream_damaged`, whatever the others say). Each instance's relay sees for itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "ok")]
    broker: Option<&'static str>,
}

/// Pending events (exact below 10,000, estimated beyond with a margin), dead and parked events
/// (counted up to 10,000: `exact` is false when a count reached it) and the age of the oldest
/// pending one, read through indexes in constant time; with `RELAY_WAL_SLOT`, the slot's lag;
/// with a relay in this instance, the broker as it sees it.
#[utoipa::path(get, path = "/outbox/stats", tag = "outbox",
    responses((status = 200, description = "Current outbox counts", body = OutboxStatsWithSlot)))]
async fn stats(State(state): State<AppState>) -> Result<Json<OutboxStatsWithSlot>, ApiError> {
    let last = state.wal_lag.as_ref().map(SlotLag::last);
    let wal_lag_bytes = last.map(|lag| lag.map_or(0, |lag| lag.bytes));
    let wal_lag_seconds = last.map(|lag| lag.map_or(0.0, |lag| lag.waited.as_secs_f64()));
    Ok(Json(OutboxStatsWithSlot {
        outbox: outbox::stats(&state.pool).await?,
        wal_lag_bytes,
        wal_lag_seconds,
        broker: state
            .relay_health
            .as_ref()
            .map(|health| health.broker().as_str()),
    }))
}

/// Gives this service's own metrics their help text (`# HELP`); once the recorder is
/// installed, before anything records them.
pub fn describe_metrics() {
    metrics::describe_gauge!(
        "outbox_pending_events",
        "Events not yet published: exact below 10,000, estimated beyond."
    );
    metrics::describe_gauge!(
        "outbox_pending_events_margin",
        "How far the truth may be from outbox_pending_events (99.9% interval), 0 when exact."
    );
    metrics::describe_gauge!(
        "outbox_dead_events",
        "Dead events waiting for an operator (counted up to 10,000)."
    );
    metrics::describe_gauge!(
        "outbox_parked_aggregates",
        "Aggregates held back by a dead event (counted up to 10,000)."
    );
    metrics::describe_gauge!(
        "outbox_oldest_pending_seconds",
        metrics::Unit::Seconds,
        "Age of the oldest event not yet published, 0 when none is."
    );
}

/// Prometheus metrics: HTTP per route, relay counters and latency, and outbox gauges.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses(
    (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"),
))]
async fn metrics(State(state): State<AppState>) -> Result<String, ApiError> {
    crate::console::update_gauges(&state).await?;
    Ok(service_kit::metrics::render())
}

/// What an admin action did.
#[derive(Debug, Serialize, ToSchema)]
struct ActionResult {
    /// The event.
    id: Uuid,
    /// Its status now: `pending` after a retry, `skipped` after a skip.
    status: &'static str,
}

/// Which dead events to list or act on: those matching every filter given.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
struct DeadFilterParams {
    /// Only events of this aggregate type.
    #[param(pattern = r"^[A-Za-z0-9_:@-]{1,128}$")]
    aggregate_type: Option<String>,
    /// Only events of this event type.
    #[param(pattern = r"^[A-Za-z0-9_:@-]{1,128}$")]
    event_type: Option<String>,
    /// Only events whose last error contains this text (1-500 characters, no NUL).
    #[param(min_length = 1, max_length = 500, pattern = r"^[^\x00]+$")]
    error_contains: Option<String>,
    /// Only events whose last error is of this class (as `too-large`: the groups name them).
    #[param(min_length = 1, max_length = 500, pattern = r"^[^\x00]+$")]
    error_class: Option<String>,
    /// Only events of this aggregate.
    #[param(pattern = r"^[A-Za-z0-9_:@-]{1,128}$")]
    aggregate_id: Option<String>,
    /// Only events enqueued from this time on (RFC 3339, as `2026-12-06T09:00:00Z`).
    #[param(format = DateTime)]
    since: Option<String>,
    /// Only events enqueued before this time (RFC 3339).
    #[param(format = DateTime)]
    until: Option<String>,
}

impl DeadFilterParams {
    fn filter(self) -> Result<DeadFilter, ApiError> {
        let mut filter = DeadFilter::all();
        filter.aggregate_type = dead::token_filter("aggregateType", self.aggregate_type)?;
        filter.event_type = dead::token_filter("eventType", self.event_type)?;
        filter.error_contains = dead::text_filter("errorContains", self.error_contains)?;
        filter.error_class = dead::text_filter("errorClass", self.error_class)?;
        filter.aggregate_id = dead::token_filter("aggregateId", self.aggregate_id)?;
        filter.since = dead::time_filter("since", self.since)?;
        filter.until = dead::time_filter("until", self.until)?;
        Ok(filter)
    }
}

/// A page of the dead events matching the filters.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
struct DeadListParams {
    /// Items per page, 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `nextCursor` of the previous page: the number of the last item seen; the page holds the
    /// items after it.
    #[param(pattern = r"^[0-9]{1,18}$")]
    cursor: Option<String>,
    /// Only events of this aggregate type.
    #[param(pattern = r"^[A-Za-z0-9_:@-]{1,128}$")]
    aggregate_type: Option<String>,
    /// Only events of this event type.
    #[param(pattern = r"^[A-Za-z0-9_:@-]{1,128}$")]
    event_type: Option<String>,
    /// Only events whose last error contains this text (1-500 characters, no NUL).
    #[param(min_length = 1, max_length = 500, pattern = r"^[^\x00]+$")]
    error_contains: Option<String>,
    /// Only events whose last error is of this class (as `too-large`: the groups name them).
    #[param(min_length = 1, max_length = 500, pattern = r"^[^\x00]+$")]
    error_class: Option<String>,
    /// Only events of this aggregate.
    #[param(pattern = r"^[A-Za-z0-9_:@-]{1,128}$")]
    aggregate_id: Option<String>,
    /// Only events enqueued from this time on (RFC 3339, as `2026-12-06T09:00:00Z`).
    #[param(format = DateTime)]
    since: Option<String>,
    /// Only events enqueued before this time (RFC 3339).
    #[param(format = DateTime)]
    until: Option<String>,
}

/// Lists dead events with their attempts and last error, optionally filtered (admin or
/// read-only token).
#[utoipa::path(get, path = "/outbox/dead", tag = "outbox", params(DeadListParams),
    security(("admin" = [])), responses(
    (status = 200, description = "A page of dead events", body = Page<DeadEvent>),
    (status = 422, description = "Bad limit, cursor or filter", body = Problem,
        content_type = "application/problem+json"),
    AdminRefusals,
))]
async fn list_dead(
    _: Reader,
    State(state): State<AppState>,
    Query(params): Query<DeadListParams>,
) -> Result<Json<Page<DeadEvent>>, ApiError> {
    let limit = pagination::limit(params.limit)?;
    let after = pagination::after_number(params.cursor.as_deref())?;
    let filter = DeadFilterParams {
        aggregate_type: params.aggregate_type,
        event_type: params.event_type,
        error_contains: params.error_contains,
        error_class: params.error_class,
        aggregate_id: params.aggregate_id,
        since: params.since,
        until: params.until,
    }
    .filter()?;
    let rows = outbox::dead(&state.pool, &filter, after, limit + 1).await?;
    Ok(Json(Page::of(rows, limit, |e| e.seq.to_string())))
}

/// Dead events grouped by event type and error class (by error without one), the largest groups
/// first (admin or read-only token): each group's values are a filter for its bulk action.
#[utoipa::path(get, path = "/outbox/dead/groups", tag = "outbox",
    security(("admin" = [])), responses(
    (status = 200, description = "The groups", body = DeadGroups),
    AdminRefusals,
))]
async fn dead_groups(
    _: Reader,
    State(state): State<AppState>,
) -> Result<Json<DeadGroups>, ApiError> {
    let groups = outbox::dead_groups(&state.pool, dead::GROUPS_SHOWN).await?;
    Ok(Json(DeadGroups { groups }))
}

/// Publishes every dead event matching the filters again (all of them without a filter), in
/// outbox order per aggregate; idempotent (admin).
#[utoipa::path(post, path = "/outbox/dead/retry", tag = "outbox", params(DeadFilterParams),
    security(("admin" = [])), responses(
    (status = 200, description = "`count` events are pending again", body = BulkOutcome),
    (status = 422, description = "Bad filter", body = Problem,
        content_type = "application/problem+json"),
    AdminRefusals,
))]
async fn retry_matching(
    admin: Admin,
    State(state): State<AppState>,
    Query(params): Query<DeadFilterParams>,
) -> Result<Json<BulkOutcome>, ApiError> {
    let filter = params.filter()?;
    let mut tx = state.pool.begin().await?;
    let count = outbox::retry_dead_matching_in(&mut tx, &filter).await?;
    let recorded =
        audit::record(&mut *tx, &admin.name, "retry", &described(&filter), count).await?;
    tx.commit().await?;
    recorded.committed();
    Ok(Json(BulkOutcome::took(count)))
}

/// Gives up on every dead event matching the filters (all of them without a filter): they stay
/// recorded as skipped and the events they held back follow; idempotent (admin).
#[utoipa::path(post, path = "/outbox/dead/skip", tag = "outbox", params(DeadFilterParams),
    security(("admin" = [])), responses(
    (status = 200, description = "`count` events were skipped", body = BulkOutcome),
    (status = 422, description = "Bad filter", body = Problem,
        content_type = "application/problem+json"),
    AdminRefusals,
))]
async fn skip_matching(
    admin: Admin,
    State(state): State<AppState>,
    Query(params): Query<DeadFilterParams>,
) -> Result<Json<BulkOutcome>, ApiError> {
    let filter = params.filter()?;
    let mut tx = state.pool.begin().await?;
    let count = outbox::skip_dead_matching_in(&mut tx, &filter).await?;
    let recorded = audit::record(&mut *tx, &admin.name, "skip", &described(&filter), count).await?;
    tx.commit().await?;
    recorded.committed();
    Ok(Json(BulkOutcome::took(count)))
}

/// A bulk action's filter as the audit log shows it.
fn described(filter: &DeadFilter) -> String {
    let (since, until) = (
        filter.since.map(|t| t.to_rfc3339()),
        filter.until.map(|t| t.to_rfc3339()),
    );
    dead::described(&[
        ("aggregateType", filter.aggregate_type.as_deref()),
        ("aggregateId", filter.aggregate_id.as_deref()),
        ("eventType", filter.event_type.as_deref()),
        ("errorContains", filter.error_contains.as_deref()),
        ("errorClass", filter.error_class.as_deref()),
        ("since", since.as_deref()),
        ("until", until.as_deref()),
    ])
}

/// One dead event whole, its payload included (admin or read-only token).
#[utoipa::path(get, path = "/outbox/dead/{id}", tag = "outbox",
    params(("id" = Uuid, Path, description = "Event id (ce-id)")),
    security(("admin" = [])), responses(
    (status = 200, description = "The dead event", body = DeadEvent),
    (status = 404, description = "No dead event with this id", body = Problem,
        content_type = "application/problem+json"),
    AdminRefusals,
))]
async fn dead_event(
    _: Reader,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<Json<DeadEvent>, ApiError> {
    outbox::dead_event(&state.pool, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no dead event {id}")))
}

/// Publishes a dead event again; the events it held back follow (admin).
#[utoipa::path(post, path = "/outbox/dead/{id}/retry", tag = "outbox",
    params(("id" = Uuid, Path, description = "Event id (ce-id)")),
    security(("admin" = [])), responses(
    (status = 200, description = "Pending again", body = ActionResult),
    (status = 404, description = "No dead event with this id", body = Problem,
        content_type = "application/problem+json"),
    AdminRefusals,
))]
async fn retry(
    admin: Admin,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<Json<ActionResult>, ApiError> {
    let mut tx = state.pool.begin().await?;
    if !outbox::retry_dead_in(&mut tx, id).await? {
        return Err(ApiError::not_found(format!("no dead event {id}")));
    }
    let recorded = audit::record(&mut *tx, &admin.name, "retry", &format!("event {id}"), 1).await?;
    tx.commit().await?;
    recorded.committed();
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
    AdminRefusals,
))]
async fn skip(
    admin: Admin,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<Json<ActionResult>, ApiError> {
    let mut tx = state.pool.begin().await?;
    if !outbox::skip_dead_in(&mut tx, id).await? {
        return Err(ApiError::not_found(format!("no dead event {id}")));
    }
    let recorded = audit::record(&mut *tx, &admin.name, "skip", &format!("event {id}"), 1).await?;
    tx.commit().await?;
    recorded.committed();
    Ok(Json(ActionResult {
        id,
        status: "skipped",
    }))
}
