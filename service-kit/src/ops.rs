//! `GET /ops`: a plain operations page for people without a dashboard yet.
//!
//! It polls the service's stats endpoint and, once a token is typed in, lists the dead letters
//! (filtered as the operator chooses) with a button per admin action, buttons that take the
//! action on every dead letter the filters match (after a preview of how many and which first),
//! and the audit log of operator actions (`GET /ops/audit`). It is a thin face over the JSON
//! endpoints: the page holds no logic an operator could not run with curl. No external assets,
//! and a strict Content-Security-Policy: scripts and styles only from the service itself.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{FromRef, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::admin::{AdminRefusals, AdminToken, Reader};
use crate::audit::{self, AuditEntry};
use crate::history::{Chart, History, Samples};
use crate::pagination::{self, Page};
use crate::{ApiError, Json, Query};

const PAGE: &str = include_str!("ops/page.html");
const SCRIPT: &str = include_str!("ops/app.js");
const STYLE: &str = include_str!("ops/app.css");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// What a service's ops page shows.
#[derive(Debug, Clone, Serialize)]
pub struct OpsPage {
    /// The service's name, as the page title.
    pub service: &'static str,
    /// Path of the stats JSON (an object of numbers).
    pub stats: &'static str,
    /// The stats to show, in order.
    pub tiles: &'static [Tile],
    /// Path of the dead-letter list; an action on item `id` is `POST {dead}/{id}/{action}`.
    pub dead: &'static str,
    /// The columns of the dead-letter table.
    pub columns: &'static [Column],
    /// The admin actions offered on each dead letter, and on every one matching the filters
    /// at once (`POST {dead}/{action}?{filters}`, repeated while it answers a `nextCursor`).
    pub actions: &'static [Action],
    /// The filters of the dead-letter list and of the bulk actions.
    pub filters: &'static [Filter],
    /// The charts of the last hour (`GET /ops/history`).
    pub charts: &'static [Chart],
    /// How long the backlog takes to drain at the recent rates, shown as a tile.
    pub drain: Option<Drain>,
}

/// A backlog: the page divides it by how fast its chart line shrank in the last minute.
#[derive(Debug, Clone, Serialize)]
pub struct Drain {
    /// The stat holding the backlog.
    pub backlog: &'static str,
    /// The chart line of the same backlog.
    pub series: &'static str,
}

/// One stat of the stats JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Tile {
    /// Its key in the stats JSON.
    pub key: &'static str,
    /// What the page calls it.
    pub label: &'static str,
    /// Highlighted when above zero, or, for a text, when other than `ok`.
    pub alert: bool,
}

/// One column of the dead-letter table.
#[derive(Debug, Clone, Serialize)]
pub struct Column {
    /// Its key in a dead-letter item.
    pub key: &'static str,
    /// Its heading.
    pub label: &'static str,
}

/// One admin action on a dead letter.
#[derive(Debug, Clone, Serialize)]
pub struct Action {
    /// The last path segment of its endpoint.
    pub name: &'static str,
    /// The button's text.
    pub label: &'static str,
}

/// One filter of the dead-letter list: a query parameter of the list and the bulk actions.
#[derive(Debug, Clone, Serialize)]
pub struct Filter {
    /// The query parameter.
    pub key: &'static str,
    /// The input's label.
    pub label: &'static str,
    /// An example of a value, shown in the empty input.
    pub hint: &'static str,
}

impl Filter {
    /// The message's event type, on both services.
    pub const EVENT_TYPE: Self = Self {
        key: "eventType",
        label: "Event type",
        hint: "",
    };
    /// Text the error contains.
    pub const ERROR_CONTAINS: Self = Self {
        key: "errorContains",
        label: "Error contains",
        hint: "",
    };
    /// The class of the error, as the groups name it.
    pub const ERROR_CLASS: Self = Self {
        key: "errorClass",
        label: "Error class",
        hint: "",
    };
    /// From this time on (RFC 3339).
    pub const SINCE: Self = Self {
        key: "since",
        label: "Since",
        hint: "2026-12-06T09:00:00Z",
    };
    /// Before this time (RFC 3339).
    pub const UNTIL: Self = Self {
        key: "until",
        label: "Until",
        hint: "2026-12-06T10:00:00Z",
    };
}

#[derive(Clone)]
struct Html(Arc<str>);

impl OpsPage {
    /// The page as served: the template with this page's settings.
    fn render(&self) -> String {
        let config = serde_json::to_string(self)
            .expect("OpsPage serializes")
            // Inside <script>, "</script>" must not appear; \u003c is the same JSON string.
            .replace('<', "\\u003c");
        PAGE.replace("{{service}}", self.service)
            .replace("{{config}}", &config)
    }

    /// `/ops`, its script and stylesheet, `/ops/audit` and `/ops/history`.
    pub fn router<S>(&self) -> OpenApiRouter<S>
    where
        S: Clone + Send + Sync + 'static,
        PgPool: FromRef<S>,
        AdminToken: FromRef<S>,
        History: FromRef<S>,
    {
        OpenApiRouter::new()
            .routes(routes!(ops_page))
            .routes(routes!(audit_log))
            .routes(routes!(history))
            .route(
                "/ops/app.js",
                get(|| async { with_headers("text/javascript", SCRIPT) }),
            )
            .route(
                "/ops/app.css",
                get(|| async { with_headers("text/css", STYLE) }),
            )
            .layer(Extension(Html(self.render().into())))
    }
}

/// The operations page: live outbox or inbox counts, and the dead letters with their admin
/// actions (the admin token is typed into the page and sent as a Bearer header).
#[utoipa::path(get, path = "/ops", tag = "operations", responses(
    (status = 200, description = "An HTML page", body = String, content_type = "text/html"),
))]
async fn ops_page(Extension(Html(html)): Extension<Html>) -> Response {
    with_headers("text/html; charset=utf-8", html.to_string())
}

/// The last hour of the charts' lines: a sample every `intervalSeconds`, oldest first.
#[utoipa::path(get, path = "/ops/history", tag = "operations", responses(
    (status = 200, description = "The charts' samples", body = Samples),
))]
async fn history(State(history): State<History>) -> Json<Samples> {
    Json(history.samples())
}

/// A page of the audit log.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
struct AuditParams {
    /// Entries per page, 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `nextCursor` of the previous page: the number of the last entry seen; the page holds
    /// the older ones.
    #[param(pattern = r"^[0-9]{1,18}$")]
    cursor: Option<String>,
}

/// The operator actions taken through the admin API, newest first: which token, what, on
/// what, how many items, when (admin or read-only token).
#[utoipa::path(get, path = "/ops/audit", tag = "operations", params(AuditParams),
    security(("admin" = [])), responses(
    (status = 200, description = "A page of the audit log", body = Page<AuditEntry>),
    (status = 422, description = "Bad limit or cursor", body = crate::problem::Problem,
        content_type = "application/problem+json"),
    AdminRefusals,
))]
async fn audit_log(
    _: Reader,
    State(pool): State<PgPool>,
    Query(params): Query<AuditParams>,
) -> Result<Json<Page<AuditEntry>>, ApiError> {
    let limit = pagination::limit(params.limit)?;
    let before = params
        .cursor
        .map(|cursor| pagination::after_number(Some(&cursor)))
        .transpose()?;
    let rows = audit::list(&pool, before, limit + 1).await?;
    Ok(Json(Page::of(rows, limit, |entry| entry.id.to_string())))
}

fn with_headers(content_type: &'static str, body: impl IntoResponse) -> Response {
    (
        [
            (CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
            (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                HeaderName::from_static("x-content-type-options"),
                HeaderValue::from_static("nosniff"),
            ),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE_SETTINGS: OpsPage = OpsPage {
        service: "test-service",
        stats: "/x/stats",
        tiles: &[Tile {
            key: "dead",
            label: "Dead </script><script>alert(1)</script>",
            alert: true,
        }],
        dead: "/x/dead",
        columns: &[],
        actions: &[],
        filters: &[],
        charts: &[],
        drain: None,
    };

    #[test]
    fn settings_cannot_close_the_config_script() {
        let html = PAGE_SETTINGS.render();
        let config = html
            .split_once(r#"<script type="application/json" id="ops-config">"#)
            .and_then(|(_, rest)| rest.split_once("</script>"))
            .map(|(config, _)| config)
            .expect("config block");
        let parsed: serde_json::Value = serde_json::from_str(config).expect("valid JSON");
        assert_eq!(
            parsed["tiles"][0]["label"],
            "Dead </script><script>alert(1)</script>"
        );
        assert!(!html.contains("{{"), "every placeholder filled");
    }
}
