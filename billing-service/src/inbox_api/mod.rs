//! `/inbox/...`: what the consumer has processed and how far behind it is, and the dead
//! letters an operator replays or skips (the admin token; the read-only token lists them),
//! each action in the audit log (replays in `replay`).

mod replay;

use axum::extract::State;
use jetstream_outbox::inbox::{Body, DeadLetter, DeadLetterFilter, InboxStats};
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

use crate::AppState;
use crate::lag::Lag;

/// The inbox routes and the ops page.
pub fn router() -> OpenApiRouter<AppState> {
    crate::console::OPS
        .router()
        .routes(routes!(stats))
        .routes(routes!(metrics))
        .routes(routes!(list_dead))
        .routes(routes!(dead_groups))
        .routes(routes!(dead_letter))
        .routes(routes!(replay::retry))
        .routes(routes!(skip))
        .routes(routes!(replay::replay_matching))
        .routes(routes!(skip_matching))
}

/// The inbox's counts and the durable consumer's lag.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct Stats {
    #[serde(flatten)]
    inbox: InboxStats,
    #[serde(flatten)]
    consumer: Lag,
}

/// Processed messages and recognised duplicates (kept as counts by the inbox), open dead
/// letters (counted up to 10,000: `exact` is false when they reached it), in constant time;
/// and the messages waiting in the durable consumer with the age of the oldest (`null` while
/// the broker does not answer).
#[utoipa::path(get, path = "/inbox/stats", tag = "inbox",
    responses((status = 200, description = "Current inbox counts and consumer lag", body = Stats)))]
async fn stats(State(state): State<AppState>) -> Result<Json<Stats>, ApiError> {
    let (inbox, consumer) = tokio::join!(state.rules.inbox().stats(), state.lag.read());
    Ok(Json(Stats {
        inbox: inbox?,
        consumer,
    }))
}

/// Gives this service's own metrics their help text (`# HELP`); once the recorder is
/// installed, before anything records them.
pub fn describe_metrics() {
    metrics::describe_gauge!(
        "inbox_dead_letters_open",
        "Dead letters waiting for an operator (counted up to 10,000)."
    );
    metrics::describe_gauge!(
        "billing_consumer_waiting_messages",
        "Messages waiting in the durable consumer: not yet delivered, or delivered and not \
         yet acknowledged."
    );
    metrics::describe_gauge!(
        "billing_consumer_oldest_waiting_seconds",
        metrics::Unit::Seconds,
        "How long ago the oldest message waiting in the durable consumer was stored."
    );
    metrics::describe_counter!(
        "billing_consumer_recreated_total",
        metrics::Unit::Count,
        "Times the durable consumer was made again: gone, or its stream lost what it \
         delivered."
    );
    metrics::describe_histogram!(
        "billing_publish_to_apply_seconds",
        metrics::Unit::Seconds,
        "From a message's storing in the stream to its application (or its recognition as a \
         duplicate)."
    );
    metrics::describe_histogram!(
        "billing_message_handling_seconds",
        metrics::Unit::Seconds,
        "One message from its receipt to its acknowledgement."
    );
}

/// Prometheus metrics: HTTP per route, inbox counters, handling latency, open dead letters,
/// the consumer's lag.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses(
    (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"),
))]
async fn metrics(State(state): State<AppState>) -> Result<String, ApiError> {
    crate::console::update_gauges(&state).await?;
    Ok(service_kit::metrics::render())
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

/// Which open dead letters to list or replay: those matching every filter given, after
/// `cursor`, `limit` of them.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
struct DeadListParams {
    /// Items per page (or to replay), 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `nextCursor` of the previous answer: the number of the last item seen; the page, or the
    /// replay, goes on after it.
    #[param(pattern = r"^[0-9]{1,18}$")]
    cursor: Option<String>,
    /// Only letters whose `ce-type` header is this.
    #[param(pattern = r"^[A-Za-z0-9_:@-]{1,128}$")]
    event_type: Option<String>,
    /// Only letters whose error contains this text (1-500 characters, no NUL).
    #[param(min_length = 1, max_length = 500, pattern = r"^[^\x00]+$")]
    error_contains: Option<String>,
    /// Only letters whose error is of this class (as `invalid-payload`: the groups name them).
    #[param(min_length = 1, max_length = 500, pattern = r"^[^\x00]+$")]
    error_class: Option<String>,
    /// Only letters dead-lettered from this time on (RFC 3339, as `2026-12-06T09:00:00Z`).
    #[param(format = DateTime)]
    since: Option<String>,
    /// Only letters dead-lettered before this time (RFC 3339).
    #[param(format = DateTime)]
    until: Option<String>,
}

/// Which open dead letters to skip: those matching every filter given.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
struct DeadFilterParams {
    /// Only letters whose `ce-type` header is this.
    #[param(pattern = r"^[A-Za-z0-9_:@-]{1,128}$")]
    event_type: Option<String>,
    /// Only letters whose error contains this text (1-500 characters, no NUL).
    #[param(min_length = 1, max_length = 500, pattern = r"^[^\x00]+$")]
    error_contains: Option<String>,
    /// Only letters whose error is of this class (as `invalid-payload`: the groups name them).
    #[param(min_length = 1, max_length = 500, pattern = r"^[^\x00]+$")]
    error_class: Option<String>,
    /// Only letters dead-lettered from this time on (RFC 3339, as `2026-12-06T09:00:00Z`).
    #[param(format = DateTime)]
    since: Option<String>,
    /// Only letters dead-lettered before this time (RFC 3339).
    #[param(format = DateTime)]
    until: Option<String>,
}

/// The filter the query's `eventType`, `errorContains`, `errorClass`, `since` and `until`
/// make, or a 422 naming the bad one.
fn filter(
    event_type: Option<String>,
    error_contains: Option<String>,
    error_class: Option<String>,
    since: Option<String>,
    until: Option<String>,
) -> Result<DeadLetterFilter, ApiError> {
    let mut filter = DeadLetterFilter::all();
    filter.event_type = dead::token_filter("eventType", event_type)?;
    filter.error_contains = dead::text_filter("errorContains", error_contains)?;
    filter.error_class = dead::text_filter("errorClass", error_class)?;
    filter.since = dead::time_filter("since", since)?;
    filter.until = dead::time_filter("until", until)?;
    Ok(filter)
}

/// Lists open dead letters with their error and delivery count, optionally filtered (admin or
/// read-only token).
#[utoipa::path(get, path = "/inbox/dead", tag = "inbox", params(DeadListParams),
    security(("admin" = [])), responses(
    (status = 200, description = "A page of dead letters", body = Page<DeadLetter>),
    (status = 422, description = "Bad limit, cursor or filter", body = Problem,
        content_type = "application/problem+json"),
    AdminRefusals,
))]
async fn list_dead(
    _: Reader,
    State(state): State<AppState>,
    Query(params): Query<DeadListParams>,
) -> Result<Json<Page<DeadLetter>>, ApiError> {
    let limit = pagination::limit(params.limit)?;
    let after = pagination::after_number(params.cursor.as_deref())?;
    let filter = filter(
        params.event_type,
        params.error_contains,
        params.error_class,
        params.since,
        params.until,
    )?;
    let rows = state.rules.inbox().dead(&filter, after, limit + 1).await?;
    Ok(Json(Page::of(rows, limit, |d| d.id.to_string())))
}

/// Open dead letters grouped by `ce-type` and error class (by error without one), the largest
/// groups first (admin or read-only token): each group's values are a filter for its bulk action.
#[utoipa::path(get, path = "/inbox/dead/groups", tag = "inbox",
    security(("admin" = [])), responses(
    (status = 200, description = "The groups", body = DeadGroups),
    AdminRefusals,
))]
async fn dead_groups(
    _: Reader,
    State(state): State<AppState>,
) -> Result<Json<DeadGroups>, ApiError> {
    let groups = state.rules.inbox().dead_groups(dead::GROUPS_SHOWN).await?;
    Ok(Json(DeadGroups { groups }))
}

/// An open dead letter and its body.
#[derive(Debug, Serialize, ToSchema)]
struct DeadLetterDetail {
    #[serde(flatten)]
    letter: DeadLetter,
    /// Its body: text when it is UTF-8, else its bytes in hex.
    body: Body,
}

/// One open dead letter whole, its body included (admin or read-only token).
#[utoipa::path(get, path = "/inbox/dead/{id}", tag = "inbox",
    params(("id" = i64, Path, description = "Dead letter id", minimum = 1)),
    security(("admin" = [])), responses(
    (status = 200, description = "The dead letter", body = DeadLetterDetail),
    (status = 404, description = "No open dead letter with this id", body = Problem,
        content_type = "application/problem+json"),
    AdminRefusals,
))]
async fn dead_letter(
    _: Reader,
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<DeadLetterDetail>, ApiError> {
    let letter = state
        .rules
        .inbox()
        .dead_letter_by_id(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no open dead letter {id}")))?;
    let body = Body::of(&letter.payload);
    Ok(Json(DeadLetterDetail { letter, body }))
}

/// Gives up on every open dead letter matching the filters (all of them without a filter):
/// closed without applying them, kept as skipped; idempotent (admin).
#[utoipa::path(post, path = "/inbox/dead/skip", tag = "inbox", params(DeadFilterParams),
    security(("admin" = [])), responses(
    (status = 200, description = "`count` letters were skipped", body = BulkOutcome),
    (status = 422, description = "Bad filter", body = Problem,
        content_type = "application/problem+json"),
    AdminRefusals,
))]
async fn skip_matching(
    admin: Admin,
    State(state): State<AppState>,
    Query(params): Query<DeadFilterParams>,
) -> Result<Json<BulkOutcome>, ApiError> {
    let filter = filter(
        params.event_type,
        params.error_contains,
        params.error_class,
        params.since,
        params.until,
    )?;
    let mut tx = state.pool.begin().await?;
    let count = state
        .rules
        .inbox()
        .skip_dead_letters_in(&mut tx, &filter)
        .await?;
    let recorded = audit::record(&mut *tx, &admin.name, "skip", &described(&filter), count).await?;
    tx.commit().await?;
    recorded.committed();
    Ok(Json(BulkOutcome::took(count)))
}

/// A bulk action's filter as the audit log shows it.
fn described(filter: &DeadLetterFilter) -> String {
    let (since, until) = (
        filter.since.map(|t| t.to_rfc3339()),
        filter.until.map(|t| t.to_rfc3339()),
    );
    dead::described(&[
        ("eventType", filter.event_type.as_deref()),
        ("errorContains", filter.error_contains.as_deref()),
        ("errorClass", filter.error_class.as_deref()),
        ("since", since.as_deref()),
        ("until", until.as_deref()),
    ])
}

/// Gives up on a dead letter without applying it; it stays recorded as skipped (admin).
#[utoipa::path(post, path = "/inbox/dead/{id}/skip", tag = "inbox",
    params(("id" = i64, Path, description = "Dead letter id", minimum = 1)),
    security(("admin" = [])), responses(
    (status = 200, description = "Skipped; the dead letter is closed", body = ActionResult),
    (status = 404, description = "No open dead letter with this id", body = Problem,
        content_type = "application/problem+json"),
    AdminRefusals,
))]
async fn skip(
    admin: Admin,
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<ActionResult>, ApiError> {
    let mut tx = state.pool.begin().await?;
    if !state.rules.inbox().skip_dead_letter_in(&mut tx, id).await? {
        return Err(ApiError::not_found(format!("no open dead letter {id}")));
    }
    let target = format!("dead letter {id}");
    let recorded = audit::record(&mut *tx, &admin.name, "skip", &target, 1).await?;
    tx.commit().await?;
    recorded.committed();
    Ok(Json(ActionResult {
        id,
        outcome: "skipped",
    }))
}
