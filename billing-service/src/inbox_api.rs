//! `/inbox/stats`: what the consumer has processed.

use axum::extract::State;
use outbox_core::inbox::InboxStats;
use service_kit::{ApiError, Json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;

/// The inbox routes.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(stats))
}

/// Processed messages, recognised duplicates and open dead letters.
#[utoipa::path(get, path = "/inbox/stats", tag = "inbox",
    responses((status = 200, description = "Current inbox counts", body = InboxStats)))]
async fn stats(State(state): State<AppState>) -> Result<Json<InboxStats>, ApiError> {
    Ok(Json(state.inbox.stats().await?))
}
