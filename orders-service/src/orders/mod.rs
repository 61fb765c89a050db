//! The `/orders` resource. Every state change and its event commit together.

mod store;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use jetstream_outbox::{NewEvent, Wakeup};
use serde::{Deserialize, Serialize};
use service_kit::events::EventStatus;
use service_kit::http::TraceParent;
use service_kit::pagination::{self, Cursor, Page, PageParams};
use service_kit::problem::Problem;
use service_kit::{ApiError, Json, Path, Query};
use sqlx::{Connection as _, PgConnection};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;

/// Largest accepted `totalMinor`.
pub const MAX_TOTAL_MINOR: i64 = 1_000_000_000_000_000;
/// Longest accepted customer name, in characters.
pub const MAX_CUSTOMER_CHARS: usize = 200;

/// The aggregate type of order events.
const AGGREGATE: &str = "order";

/// Where an order is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "lowercase")]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum OrderStatus {
    /// Placed, not paid.
    Placed,
    /// Paid, not shipped.
    Paid,
    /// Shipped.
    Shipped,
}

/// An order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"id": "0193a0c4-7d1e-7c3b-9f1a-1b2c3d4e5f60", "customer": "ada",
    "totalMinor": 1999, "status": "placed", "createdAt": "2026-11-30T12:00:00Z",
    "updatedAt": "2026-11-30T12:00:00Z"}))]
pub struct Order {
    /// Order id: 1-128 of `[A-Za-z0-9_:@-]`.
    pub id: String,
    /// Who ordered.
    pub customer: String,
    /// Total in minor units (cents).
    pub total_minor: i64,
    /// Current status.
    pub status: OrderStatus,
    /// When it was placed.
    pub created_at: DateTime<Utc>,
    /// When its status last changed.
    pub updated_at: DateTime<Utc>,
}

/// The body of `POST /orders`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"customer": "ada", "totalMinor": 1999}))]
pub struct NewOrder {
    /// Optional client-chosen id (1-128 of `[A-Za-z0-9_:@-]`); repeating a request with the
    /// same id and body is safe. The server makes a UUIDv7 when absent.
    #[schema(min_length = 1, max_length = 128, pattern = r"^[A-Za-z0-9_:@-]+$")]
    pub id: Option<String>,
    /// Who orders: 1-200 characters, no control characters.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\x00-\x1f\x7f-\x9f]+$"
    )]
    pub customer: String,
    /// Total in minor units: 1 to 10^15.
    #[schema(minimum = 1, maximum = 1_000_000_000_000_000_i64)]
    #[serde(deserialize_with = "integral")]
    pub total_minor: i64,
}

/// Reads an integer that may be written with a zero fraction (`1999.0`): JSON, and JSON
/// Schema's `integer`, do not tell the two apart.
fn integral<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    // Every integer below 2^53 has an exact f64; beyond, a fraction could hide in rounding.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    let number = serde_json::Number::deserialize(deserializer)?;
    if let Some(n) = number.as_i64() {
        return Ok(n);
    }
    match number.as_f64() {
        #[allow(clippy::cast_possible_truncation)]
        Some(x) if x.fract() == 0.0 && x.abs() < EXACT => Ok(x as i64),
        _ => Err(serde::de::Error::custom(format!(
            "expected an integer, got {number}"
        ))),
    }
}

/// A [`NewOrder`] that passed validation.
#[derive(Debug, Clone)]
pub struct ValidOrder {
    id: String,
    customer: String,
    total_minor: i64,
}

impl NewOrder {
    /// Checks every field; the error names the first bad one.
    pub fn validate(self) -> Result<ValidOrder, ApiError> {
        let id = match self.id {
            Some(id) if jetstream_outbox::event::is_valid_token(&id) => id,
            Some(_) => {
                return Err(ApiError::validation(
                    "id",
                    "must be 1-128 ASCII letters, digits, '-', '_', ':' or '@'",
                ));
            }
            None => uuid::Uuid::now_v7().to_string(),
        };
        let chars = self.customer.chars().count();
        if chars == 0 || chars > MAX_CUSTOMER_CHARS || self.customer.chars().any(char::is_control) {
            return Err(ApiError::validation(
                "customer",
                "must be 1-200 characters without control characters",
            ));
        }
        if !(1..=MAX_TOTAL_MINOR).contains(&self.total_minor) {
            return Err(ApiError::validation(
                "totalMinor",
                format!("must be an integer from 1 to {MAX_TOTAL_MINOR}"),
            ));
        }
        Ok(ValidOrder {
            id,
            customer: self.customer,
            total_minor: self.total_minor,
        })
    }
}

impl Order {
    fn event(&self, event_type: &str, traceparent: Option<String>) -> Result<NewEvent, ApiError> {
        order_event(
            &self.id,
            &self.customer,
            self.total_minor,
            self.status,
            event_type,
            traceparent,
        )
    }
}

impl ValidOrder {
    /// The `OrderPlaced` event of this order once stored.
    fn placed_event(&self, traceparent: Option<String>) -> Result<NewEvent, ApiError> {
        order_event(
            &self.id,
            &self.customer,
            self.total_minor,
            OrderStatus::Placed,
            "OrderPlaced",
            traceparent,
        )
    }
}

fn order_event(
    order_id: &str,
    customer: &str,
    total_minor: i64,
    status: OrderStatus,
    event_type: &str,
    traceparent: Option<String>,
) -> Result<NewEvent, ApiError> {
    // The contract billing-service reads, and `/asyncapi.json` describes.
    let payload = service_kit::events::OrderEvent {
        order_id: order_id.to_owned(),
        customer: customer.to_owned(),
        total_minor,
        status: match status {
            OrderStatus::Placed => EventStatus::Placed,
            OrderStatus::Paid => EventStatus::Paid,
            OrderStatus::Shipped => EventStatus::Shipped,
        },
    };
    Ok(NewEvent::new(AGGREGATE, order_id, event_type, &payload)?.with_traceparent(traceparent))
}

/// The outcome of placing an order.
#[derive(Debug)]
pub struct Placed {
    /// The order as stored.
    pub order: Order,
    /// False when an identical order with this id already existed.
    pub created: bool,
}

/// Places an order and enqueues `OrderPlaced` in one statement (its own transaction: one round
/// trip), then wakes the relays through `wakeup`. Repeating an identical request returns the
/// stored order; the same id with another body is a conflict.
pub async fn place(
    conn: &mut PgConnection,
    wakeup: &Wakeup,
    new: ValidOrder,
    traceparent: Option<String>,
) -> Result<Placed, ApiError> {
    let event = new.placed_event(traceparent)?;
    if let Some(order) = store::insert_placed(&mut *conn, &new, &event).await? {
        wakeup.committed();
        return Ok(Placed {
            order,
            created: true,
        });
    }
    let existing = store::find(conn, &new.id)
        .await?
        .ok_or_else(|| ApiError::conflict("the order id was taken and released; retry"))?;
    if existing.customer == new.customer && existing.total_minor == new.total_minor {
        Ok(Placed {
            order: existing,
            created: false,
        })
    } else {
        Err(ApiError::conflict(format!(
            "order {} already exists with a different customer or total",
            new.id
        )))
    }
}

/// Moves an order from `from` to `to` and enqueues `event_type`, in one transaction, then wakes
/// the relays through `wakeup`.
pub async fn transition(
    conn: &mut PgConnection,
    wakeup: &Wakeup,
    id: &str,
    from: OrderStatus,
    to: OrderStatus,
    event_type: &str,
    traceparent: Option<String>,
) -> Result<Order, ApiError> {
    let mut tx = conn.begin().await?;
    let Some(order) = store::set_status(&mut tx, id, from, to).await? else {
        tx.rollback().await?;
        return Err(match store::find(conn, id).await? {
            None => ApiError::not_found(format!("no order {id}")),
            Some(order) => ApiError::conflict(format!(
                "order {id} is {:?}; it must be {:?} for this action",
                order.status, from
            )),
        });
    };
    jetstream_outbox::enqueue(&mut tx, &order.event(event_type, traceparent)?).await?;
    jetstream_outbox::commit(tx, wakeup).await?;
    Ok(order)
}

/// The `/orders` routes.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(place_order, list_orders))
        .routes(routes!(get_order))
        .routes(routes!(pay_order))
        .routes(routes!(ship_order))
}

/// Places an order.
#[utoipa::path(post, path = "/orders", tag = "orders", request_body = NewOrder, responses(
    (status = 201, description = "Placed", body = Order,
        headers(("Location" = String, description = "The order's URL"))),
    (status = 200, description = "The same request was made before: the stored order", body = Order),
    (status = 409, description = "The id exists with another body", body = Problem,
        content_type = "application/problem+json"),
    (status = 422, description = "A field is invalid", body = Problem,
        content_type = "application/problem+json"),
    (status = 400, description = "Malformed JSON", body = Problem,
        content_type = "application/problem+json"),
))]
async fn place_order(
    State(state): State<AppState>,
    TraceParent(traceparent): TraceParent,
    Json(new): Json<NewOrder>,
) -> Result<Response, ApiError> {
    let new = new.validate()?;
    let mut conn = state.connections.acquire().await?;
    let placed = place(&mut conn, &state.wakeup, new, traceparent).await?;
    conn.hand_back();
    if !placed.created {
        return Ok(Json(placed.order).into_response());
    }
    tracing::info!(order.id = %placed.order.id, "order placed");
    let location = format!("/orders/{}", placed.order.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(placed.order),
    )
        .into_response())
}

/// Lists orders, newest first.
#[utoipa::path(get, path = "/orders", tag = "orders", params(PageParams), responses(
    (status = 200, description = "A page of orders", body = Page<Order>),
    (status = 422, description = "Bad limit or cursor", body = Problem,
        content_type = "application/problem+json"),
))]
async fn list_orders(
    State(state): State<AppState>,
    Query(params): Query<PageParams>,
) -> Result<Json<Page<Order>>, ApiError> {
    let limit = pagination::limit(params.limit)?;
    let after = params.cursor.as_deref().map(Cursor::decode).transpose()?;
    let mut conn = state.connections.acquire().await?;
    let rows = store::list(&mut conn, after, limit + 1).await?;
    conn.hand_back();
    Ok(Json(Page::of(rows, limit, |o| {
        Cursor {
            t: o.created_at,
            id: o.id.clone(),
        }
        .encode()
    })))
}

/// Reads one order.
#[utoipa::path(get, path = "/orders/{id}", tag = "orders",
    params(("id" = String, Path, description = "Order id",
        min_length = 1, max_length = 128, pattern = r"^[A-Za-z0-9_:@-]+$")), responses(
    (status = 200, description = "The order", body = Order),
    (status = 404, description = "No such order", body = Problem,
        content_type = "application/problem+json"),
))]
async fn get_order(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Order>, ApiError> {
    let mut conn = state.connections.acquire().await?;
    let order = store::find(&mut conn, &id).await?;
    conn.hand_back();
    order
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no order {id}")))
}

/// Marks a placed order paid and emits `OrderPaid`.
#[utoipa::path(post, path = "/orders/{id}/pay", tag = "orders",
    params(("id" = String, Path, description = "Order id",
        min_length = 1, max_length = 128, pattern = r"^[A-Za-z0-9_:@-]+$")), responses(
    (status = 200, description = "Paid", body = Order),
    (status = 404, description = "No such order", body = Problem,
        content_type = "application/problem+json"),
    (status = 409, description = "The order is not placed", body = Problem,
        content_type = "application/problem+json"),
))]
async fn pay_order(
    State(state): State<AppState>,
    TraceParent(traceparent): TraceParent,
    Path(id): Path<String>,
) -> Result<Json<Order>, ApiError> {
    let mut conn = state.connections.acquire().await?;
    let order = transition(
        &mut conn,
        &state.wakeup,
        &id,
        OrderStatus::Placed,
        OrderStatus::Paid,
        "OrderPaid",
        traceparent,
    )
    .await?;
    conn.hand_back();
    Ok(Json(order))
}

/// Marks a paid order shipped and emits `OrderShipped`.
#[utoipa::path(post, path = "/orders/{id}/ship", tag = "orders",
    params(("id" = String, Path, description = "Order id",
        min_length = 1, max_length = 128, pattern = r"^[A-Za-z0-9_:@-]+$")), responses(
    (status = 200, description = "Shipped", body = Order),
    (status = 404, description = "No such order", body = Problem,
        content_type = "application/problem+json"),
    (status = 409, description = "The order is not paid", body = Problem,
        content_type = "application/problem+json"),
))]
async fn ship_order(
    State(state): State<AppState>,
    TraceParent(traceparent): TraceParent,
    Path(id): Path<String>,
) -> Result<Json<Order>, ApiError> {
    let mut conn = state.connections.acquire().await?;
    let order = transition(
        &mut conn,
        &state.wakeup,
        &id,
        OrderStatus::Paid,
        OrderStatus::Shipped,
        "OrderShipped",
        traceparent,
    )
    .await?;
    conn.hand_back();
    Ok(Json(order))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(id: Option<&str>, customer: &str, total_minor: i64) -> NewOrder {
        NewOrder {
            id: id.map(str::to_owned),
            customer: customer.to_owned(),
            total_minor,
        }
    }

    fn field(order: NewOrder) -> Option<String> {
        order.validate().unwrap_err().problem().field
    }

    #[test]
    fn total_may_be_written_with_a_zero_fraction_but_not_a_real_one() {
        let total = |json: &str| {
            serde_json::from_str::<NewOrder>(&format!(
                r#"{{"customer": "ada", "totalMinor": {json}}}"#
            ))
            .map(|order| order.total_minor)
        };
        assert_eq!(total("1999").unwrap(), 1999);
        assert_eq!(total("1999.0").unwrap(), 1999);
        assert_eq!(total("-5.0").unwrap(), -5, "range is validation's job");
        assert!(total("1999.5").is_err());
        assert!(total("1e300").is_err());
        assert!(total("\"1999\"").is_err());
    }

    #[test]
    fn validation_names_the_field() {
        assert_eq!(field(new(Some("a.b"), "ada", 1)).as_deref(), Some("id"));
        assert_eq!(field(new(None, "", 1)).as_deref(), Some("customer"));
        assert_eq!(field(new(None, "a\u{0}b", 1)).as_deref(), Some("customer"));
        assert_eq!(
            field(new(None, &"x".repeat(201), 1)).as_deref(),
            Some("customer")
        );
        assert_eq!(field(new(None, "ada", 0)).as_deref(), Some("totalMinor"));
        assert_eq!(
            field(new(None, "ada", MAX_TOTAL_MINOR + 1)).as_deref(),
            Some("totalMinor")
        );
    }

    #[test]
    fn valid_order_gets_an_id() {
        let valid = new(None, "Åsa", MAX_TOTAL_MINOR).validate().unwrap();
        assert!(uuid::Uuid::parse_str(&valid.id).is_ok());
        assert_eq!(new(Some("o-1"), "ada", 1).validate().unwrap().id, "o-1");
    }
}
