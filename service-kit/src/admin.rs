//! Admin endpoints: `Authorization: Bearer $ADMIN_TOKEN`, compared in constant time.
//!
//! No token configured → 403 (admin endpoints are off); a missing or wrong token → 401. The
//! token is never logged.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use subtle::ConstantTimeEq as _;

use crate::ApiError;
use crate::problem::Problem;

/// The configured admin token, if any.
#[derive(Clone, Default)]
pub struct AdminToken(Option<Arc<str>>);

impl AdminToken {
    /// Admin endpoints accept `token`; `None` turns them off.
    pub fn new(token: Option<&secrecy::SecretString>) -> Self {
        Self(token.map(|token| Arc::from(secrecy::ExposeSecret::expose_secret(token))))
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "AdminToken(<redacted>)"
        } else {
            "AdminToken(None)"
        })
    }
}

/// Proof that the request carried the admin token. Handlers that take it are admin-only.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl<S> FromRequestParts<S> for Admin
where
    S: Send + Sync,
    AdminToken: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let AdminToken(expected) = AdminToken::from_ref(state);
        let Some(expected) = expected else {
            return Err(ApiError::forbidden(
                "admin endpoints are disabled: ADMIN_TOKEN is not set",
            ));
        };
        let given = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
            Ok(Admin)
        } else {
            Err(ApiError::unauthorized(
                "a valid admin bearer token is required",
            ))
        }
    }
}

/// Declares the `admin` bearer security scheme that admin routes reference.
#[derive(Debug)]
pub struct AdminSecurity;

impl utoipa::Modify for AdminSecurity {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some("The service's ADMIN_TOKEN"))
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("admin", SecurityScheme::Http(scheme));
    }
}

/// The guard's refusals, declared once for the `responses(...)` of every admin endpoint's
/// `#[utoipa::path]`.
#[derive(Debug, utoipa::IntoResponses)]
pub enum AdminRefusals {
    /// No bearer token, or not the configured one.
    #[response(
        status = 401,
        description = "Missing or wrong admin token",
        content_type = "application/problem+json"
    )]
    Unauthorized(Problem),
    /// No token is configured: admin endpoints are off.
    #[response(
        status = 403,
        description = "ADMIN_TOKEN is not configured",
        content_type = "application/problem+json"
    )]
    Forbidden(Problem),
}
