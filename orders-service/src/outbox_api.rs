//! `/outbox/stats`: how far behind the relay is.

use axum::extract::State;
use outbox_core::OutboxStats;
use service_kit::{ApiError, Json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;

/// The outbox routes.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(stats))
}

/// Pending and dead events and the age of the oldest pending one.
#[utoipa::path(get, path = "/outbox/stats", tag = "outbox",
    responses((status = 200, description = "Current outbox counts", body = OutboxStats)))]
async fn stats(State(state): State<AppState>) -> Result<Json<OutboxStats>, ApiError> {
    Ok(Json(outbox_core::outbox::stats(&state.pool).await?))
}
