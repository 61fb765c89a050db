//! RFC 9457 problem+json errors.
//!
//! Handlers return [`ApiError`]; the [`Json`], [`Path`] and [`Query`] extractors turn axum's
//! rejections (malformed JSON, wrong content type, body too large, bad path or query) into the
//! same body. A 500, or a 503 for want of a database connection, never carries its cause: the
//! cause rides in a response extension and is logged by [`crate::http::log_failures`] inside
//! the request span.

use std::sync::Arc;

use axum::extract::FromRequest;
use axum::extract::FromRequestParts;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// The media type of problem bodies.
pub const CONTENT_TYPE: &str = "application/problem+json";

/// The problem+json body.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({
    "type": "/problems/validation",
    "title": "Unprocessable Content",
    "status": 422,
    "detail": "totalMinor must be a positive integer",
    "field": "totalMinor"
}))]
pub struct Problem {
    /// A URI reference naming the kind of problem.
    #[serde(rename = "type")]
    pub kind: String,
    /// The HTTP reason phrase.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong with this request, for a human.
    pub detail: String,
    /// The offending input field, where there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// The cause of a 500 (or of a 503 for want of a database connection), kept out of the body
/// and logged by middleware.
#[derive(Debug, Clone)]
pub struct InternalCause(pub Arc<anyhow::Error>);

/// An error answered as problem+json.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    detail: String,
    field: Option<String>,
    cause: Option<anyhow::Error>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            detail: detail.into(),
            field: None,
            cause: None,
        }
    }

    /// 422: a field's value is not acceptable.
    pub fn validation(field: &str, detail: impl Into<String>) -> Self {
        Self {
            field: Some(field.to_owned()),
            ..Self::new(StatusCode::UNPROCESSABLE_ENTITY, "validation", detail)
        }
    }

    /// 404.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", detail)
    }

    /// 409: the request conflicts with the resource's current state.
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", detail)
    }

    /// 401: the credentials are wrong.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", detail)
    }

    /// 403: the action is not allowed at all.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", detail)
    }

    /// 503: a dependency is unavailable.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
    }

    /// 500: `cause` is logged, never shown.
    pub fn internal(cause: impl Into<anyhow::Error>) -> Self {
        Self {
            cause: Some(cause.into()),
            ..Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the server failed to handle the request",
            )
        }
    }

    /// An error for any status, e.g. one taken from a rejection.
    pub fn from_status(status: StatusCode, detail: impl Into<String>) -> Self {
        if status.is_server_error() {
            return Self::internal(anyhow::anyhow!(detail.into()));
        }
        Self::new(status, "request", detail)
    }

    /// The status this error answers with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The body this error answers with.
    pub fn problem(&self) -> Problem {
        Problem {
            kind: format!("/problems/{}", self.kind),
            title: self.status.canonical_reason().unwrap_or("Error").to_owned(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            field: self.field.clone(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        let mut response =
            (self.status, [(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response();
        if let Some(cause) = self.cause {
            response
                .extensions_mut()
                .insert(InternalCause(Arc::new(cause)));
        }
        response
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(error: sqlx::Error) -> Self {
        if no_connection(&error) {
            return Self {
                cause: Some(error.into()),
                ..Self::unavailable(
                    "no connection to the database could be had (unreachable, starting, or \
                     every connection busy); retry shortly",
                )
            };
        }
        if let Some(db) = error.as_database_error() {
            // A character the database cannot store: U+0000 in text or JSON, or one outside
            // its encoding; a request's own values carry them.
            if db
                .code()
                .is_some_and(|code| matches!(&*code, "22021" | "22P05"))
            {
                return Self::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "validation",
                    "a value of the request holds a character the database cannot store \
                     (such as U+0000)",
                );
            }
            let constraint = db.constraint().unwrap_or("a constraint").to_owned();
            if db.is_unique_violation() {
                return Self::conflict(format!(
                    "the request conflicts with existing data ({constraint})"
                ));
            }
            if db.is_check_violation() || db.is_foreign_key_violation() {
                return Self::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "validation",
                    format!("the request violates {constraint}"),
                );
            }
        }
        Self::internal(error)
    }
}

/// Whether `error` says no connection could be had, so the statement that needed one never
/// reached the database (each handler's writes are one transaction). sqlx retries a refused
/// connection, a server starting up and one out of connections until its acquire timeout. A
/// connection lost mid-request is not among them: what it had sent may have been committed,
/// so it stays a 500.
pub fn no_connection(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        // Refusals of a connection being established: too many, starting up, or rejected.
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| matches!(&*code, "53300" | "57P03" | "08001" | "08004")),
        _ => false,
    }
}

impl From<jetstream_outbox::EventError> for ApiError {
    fn from(error: jetstream_outbox::EventError) -> Self {
        match error {
            jetstream_outbox::EventError::Invalid { field, reason } => {
                Self::validation(field, reason)
            }
            other => Self::internal(other),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        Self::from_status(rejection.status(), rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::from_status(rejection.status(), rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        Self::from_status(rejection.status(), rejection.body_text())
    }
}

/// `axum::Json` whose rejections are problem+json.
#[derive(Debug, Clone, Copy, Default, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct Json<T>(pub T);

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// `axum::extract::Path` whose rejections are problem+json.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Path<T>(pub T);

/// `axum::extract::Query` whose rejections are problem+json.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);

/// The fallback for unknown routes.
pub async fn not_found() -> ApiError {
    ApiError::not_found("no such resource")
}

/// The fallback for a known route with another method.
pub async fn method_not_allowed() -> ApiError {
    ApiError::from_status(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this resource",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_errors_hide_their_cause() {
        let error = ApiError::internal(anyhow::anyhow!("password=hunter2 connection refused"));
        let body = serde_json::to_string(&error.problem()).unwrap();
        assert!(!body.contains("hunter2"), "{body}");
        assert_eq!(error.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let response = error.into_response();
        assert!(response.extensions().get::<InternalCause>().is_some());
    }

    #[test]
    fn no_connection_is_a_503_that_keeps_its_cause_for_the_log() {
        let error = ApiError::from(sqlx::Error::PoolTimedOut);
        assert_eq!(error.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            error
                .into_response()
                .extensions()
                .get::<InternalCause>()
                .is_some()
        );
        // Lost mid-request: the request may have taken effect, a retry is not known safe.
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let error = ApiError::from(sqlx::Error::Io(reset));
        assert_eq!(error.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let error = ApiError::from(sqlx::Error::RowNotFound);
        assert_eq!(error.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn validation_names_the_field() {
        let problem = ApiError::validation("totalMinor", "must be positive").problem();
        assert_eq!(problem.status, 422);
        assert_eq!(problem.field.as_deref(), Some("totalMinor"));
        assert_eq!(problem.kind, "/problems/validation");
    }
}
