//! The `/invoices` resource, and how order events change invoices.

pub(crate) mod store;

use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use service_kit::pagination::{self, Cursor, Page};
use service_kit::problem::Problem;
use service_kit::{ApiError, Json, Path, Query};
use sqlx::PgConnection;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::AppState;

/// Whether an invoice was paid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "lowercase")]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum InvoiceStatus {
    /// Waiting for payment.
    Open,
    /// Paid.
    Paid,
}

/// An invoice: exactly one per order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Invoice {
    /// Invoice id.
    pub id: Uuid,
    /// The order it bills.
    pub order_id: String,
    /// Total in minor units, as on the order.
    pub total_minor: i64,
    /// Current status.
    pub status: InvoiceStatus,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was paid.
    pub paid_at: Option<DateTime<Utc>>,
}

/// What an order event asks billing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// `OrderPlaced`: open the order's invoice.
    Open {
        /// The order.
        order_id: String,
        /// Its total.
        total_minor: i64,
    },
    /// `OrderPaid`: mark the order's invoice paid.
    Pay {
        /// The order.
        order_id: String,
    },
}

/// Why a change was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The change depends on one not seen yet (`OrderPaid` before `OrderPlaced`).
    #[error("not applicable yet: {0}")]
    NotYet(String),
    /// The database failed; trying again later may work.
    #[error("database error")]
    Database(#[from] sqlx::Error),
}

/// Applies `change` on `conn` (inside the inbox transaction).
pub async fn apply(conn: &mut PgConnection, change: Change) -> Result<(), ApplyError> {
    match change {
        Change::Open {
            order_id,
            total_minor,
        } => {
            // The unique order_id makes a second OrderPlaced for the same order a no-op.
            store::open(conn, Uuid::now_v7(), &order_id, total_minor).await?;
        }
        Change::Pay { order_id } => {
            if !store::pay(conn, &order_id).await? {
                return Err(ApplyError::NotYet(format!(
                    "no invoice for order {order_id} yet"
                )));
            }
        }
    }
    Ok(())
}

/// The `/invoices` routes.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_invoices))
        .routes(routes!(get_invoice))
}

/// Filter and page parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListParams {
    /// Only the invoice of this order (an order id: 1-128 of `[A-Za-z0-9_:@-]`).
    #[param(pattern = r"^[A-Za-z0-9_:@-]{1,128}$")]
    order_id: Option<String>,
    /// Items per page, 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `nextCursor` of the previous page: `{microseconds since 1970}.{id}` of the last invoice
    /// seen; the page holds the invoices after it.
    #[param(pattern = r"^[0-9]{1,16}\.[A-Za-z0-9_:@-]{1,128}$")]
    cursor: Option<String>,
}

/// Lists invoices, newest first, optionally of one order.
#[utoipa::path(get, path = "/invoices", tag = "invoices", params(ListParams), responses(
    (status = 200, description = "A page of invoices", body = Page<Invoice>),
    (status = 422, description = "Bad limit, cursor or orderId", body = Problem,
        content_type = "application/problem+json"),
))]
async fn list_invoices(
    State(state): State<AppState>,
    Query(params): Query<ListParams>,
) -> Result<Json<Page<Invoice>>, ApiError> {
    let limit = pagination::limit(params.limit)?;
    let after = params.cursor.as_deref().map(Cursor::decode).transpose()?;
    if let Some(order_id) = &params.order_id
        && !outbox_core::event::is_valid_token(order_id)
    {
        return Err(ApiError::validation(
            "orderId",
            "must be 1-128 of [A-Za-z0-9_:@-]",
        ));
    }
    let rows = store::list(&state.pool, params.order_id.as_deref(), after, limit + 1).await?;
    Ok(Json(Page::of(rows, limit, |i| {
        Cursor {
            t: i.created_at,
            id: i.id.to_string(),
        }
        .encode()
    })))
}

/// Reads one invoice.
#[utoipa::path(get, path = "/invoices/{id}", tag = "invoices",
    params(("id" = Uuid, Path, description = "Invoice id")), responses(
    (status = 200, description = "The invoice", body = Invoice),
    (status = 404, description = "No such invoice", body = Problem,
        content_type = "application/problem+json"),
    (status = 400, description = "Not a UUID", body = Problem,
        content_type = "application/problem+json"),
))]
async fn get_invoice(
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<Json<Invoice>, ApiError> {
    store::find(&state.pool, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no invoice {id}")))
}
