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

/// Applies `changes` on `conn` (inside the inbox transaction), in their order, and returns a
/// `()` for each, or the place (the number paired with it) of the first change that failed
/// with its error. Consecutive changes of one kind share a statement: one round trip for a run
/// of them instead of one each. A run of payments ends before an order it already pays, so
/// that each payment is a row update of its own, as the test log of applications counts them.
/// A statement's database error is laid at its run's first change: the one at fault may be
/// any of the run.
pub async fn apply(
    conn: &mut PgConnection,
    changes: &[(usize, Change)],
) -> Result<Vec<()>, (usize, ApplyError)> {
    let mut rest = changes;
    while let Some((first, change)) = rest.first() {
        let (run, later) = rest.split_at(run_length(rest));
        let failed = |error: sqlx::Error| (*first, ApplyError::from(error));
        let order_ids: Vec<&str> = run.iter().map(|(_, change)| change.order_id()).collect();
        match change {
            Change::Open { .. } => {
                // The unique order_id makes a second OrderPlaced for the same order a no-op.
                let ids: Vec<Uuid> = run.iter().map(|_| Uuid::now_v7()).collect();
                let totals: Vec<i64> = run
                    .iter()
                    .map(|(_, change)| match change {
                        Change::Open { total_minor, .. } => *total_minor,
                        Change::Pay { .. } => unreachable!("a run holds one kind of change"),
                    })
                    .collect();
                store::open(conn, &ids, &order_ids, &totals)
                    .await
                    .map_err(failed)?;
            }
            Change::Pay { .. } => {
                let paid = store::pay(conn, &order_ids).await.map_err(failed)?;
                if let Some((i, order_id)) = run
                    .iter()
                    .map(|(i, change)| (*i, change.order_id()))
                    .find(|(_, order_id)| !paid.iter().any(|paid| paid == order_id))
                {
                    return Err((
                        i,
                        ApplyError::NotYet(format!("no invoice for order {order_id} yet")),
                    ));
                }
            }
        }
        rest = later;
    }
    Ok(vec![(); changes.len()])
}

/// How many of `changes`, from the first, make one statement: consecutive changes of its kind,
/// up to a payment of an order the run already pays.
fn run_length(changes: &[(usize, Change)]) -> usize {
    let Some((_, first)) = changes.first() else {
        return 0;
    };
    let mut paying: Vec<&str> = Vec::new();
    changes
        .iter()
        .take_while(|(_, change)| {
            std::mem::discriminant(change) == std::mem::discriminant(first)
                && match change {
                    Change::Open { .. } => true,
                    Change::Pay { order_id } => {
                        let first_of_its_order = !paying.contains(&order_id.as_str());
                        paying.push(order_id);
                        first_of_its_order
                    }
                }
        })
        .count()
}

impl Change {
    /// The order the change is about.
    fn order_id(&self) -> &str {
        match self {
            Change::Open { order_id, .. } | Change::Pay { order_id } => order_id,
        }
    }
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
        && !jetstream_outbox::event::is_valid_token(order_id)
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
