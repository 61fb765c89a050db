//! Admin endpoints: `Authorization: Bearer $ADMIN_TOKEN` to act (retry, skip, replay), or
//! `$READ_TOKEN` to read only (the dead letters, the audit log); compared in constant time.
//!
//! No token configured for what is asked → 403 (those endpoints are off); the read-only token
//! given to an action → 403; a missing or wrong token → 401. Tokens are never logged.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use subtle::ConstantTimeEq as _;

use crate::ApiError;
use crate::problem::Problem;

/// The configured tokens: the admin token, which acts and reads, and the read-only token.
#[derive(Clone, Default)]
pub struct AdminToken {
    admin: Option<Arc<str>>,
    read: Option<Arc<str>>,
}

impl AdminToken {
    /// Admin endpoints accept `token`; `None` turns the actions off.
    pub fn new(token: Option<&secrecy::SecretString>) -> Self {
        Self {
            admin: token.map(expose),
            read: None,
        }
    }

    /// Reading endpoints accept `token` too.
    #[must_use]
    pub fn with_read(mut self, token: Option<&secrecy::SecretString>) -> Self {
        self.read = token.map(expose);
        self
    }

    /// The name of the configured token `parts` carries, if any.
    fn caller(&self, parts: &Parts) -> Option<&'static str> {
        let given = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        let matches = |token: &Option<Arc<str>>| {
            token
                .as_ref()
                .is_some_and(|token| bool::from(given.as_bytes().ct_eq(token.as_bytes())))
        };
        if matches(&self.admin) {
            Some(ADMIN)
        } else if matches(&self.read) {
            Some(READ_ONLY)
        } else {
            None
        }
    }
}

fn expose(token: &secrecy::SecretString) -> Arc<str> {
    Arc::from(secrecy::ExposeSecret::expose_secret(token))
}

/// The admin token's name, as the audit log records it.
pub const ADMIN: &str = "admin";
/// The read-only token's name.
pub const READ_ONLY: &str = "read-only";

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = |token: &Option<Arc<str>>| {
            if token.is_some() {
                "<redacted>"
            } else {
                "None"
            }
        };
        f.debug_struct("AdminToken")
            .field("admin", &state(&self.admin))
            .field("read", &state(&self.read))
            .finish()
    }
}

/// Proof that the request carried the admin token. Handlers that take it are admin-only.
#[derive(Debug, Clone, Copy)]
pub struct Admin {
    /// The token's name, for the audit log.
    pub name: &'static str,
}

impl<S> FromRequestParts<S> for Admin
where
    S: Send + Sync,
    AdminToken: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let tokens = AdminToken::from_ref(state);
        if tokens.admin.is_none() {
            return Err(ApiError::forbidden(
                "admin endpoints are disabled: ADMIN_TOKEN is not set",
            ));
        }
        match tokens.caller(parts) {
            Some(ADMIN) => Ok(Admin { name: ADMIN }),
            Some(_) => Err(ApiError::forbidden(
                "the read-only token may read, not act: use the admin token",
            )),
            None => Err(ApiError::unauthorized(
                "a valid admin bearer token is required",
            )),
        }
    }
}

/// Proof that the request carried a token that may read: the admin or the read-only one.
#[derive(Debug, Clone, Copy)]
pub struct Reader {
    /// The token's name.
    pub name: &'static str,
}

impl<S> FromRequestParts<S> for Reader
where
    S: Send + Sync,
    AdminToken: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let tokens = AdminToken::from_ref(state);
        if tokens.admin.is_none() && tokens.read.is_none() {
            return Err(ApiError::forbidden(
                "admin endpoints are disabled: neither ADMIN_TOKEN nor READ_TOKEN is set",
            ));
        }
        tokens
            .caller(parts)
            .map(|name| Reader { name })
            .ok_or_else(|| {
                ApiError::unauthorized("a valid admin or read-only bearer token is required")
            })
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
            .description(Some(
                "The service's ADMIN_TOKEN; READ_TOKEN for the endpoints that only read",
            ))
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
    /// No bearer token, or not a configured one.
    #[response(
        status = 401,
        description = "Missing or wrong token",
        content_type = "application/problem+json"
    )]
    Unauthorized(Problem),
    /// No token is configured for what is asked (the endpoints are off), or the read-only
    /// token was given to an action.
    #[response(
        status = 403,
        description = "No token configured for this endpoint, or the read-only token given to an action",
        content_type = "application/problem+json"
    )]
    Forbidden(Problem),
}
