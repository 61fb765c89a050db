//! Admin endpoints: `Authorization: Bearer $ADMIN_TOKEN` (or an admin token of
//! `OPS_TOKENS_FILE`) to act (retry, skip, replay), or `$READ_TOKEN` (or a read token of the
//! file) to read only (the dead letters, the audit log); compared in constant time.
//!
//! No token configured for what is asked → 403 (those endpoints are off); the read-only token
//! given to an action → 403; a missing or wrong token → 401. Tokens are never logged.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use subtle::ConstantTimeEq as _;

use crate::ApiError;
use crate::ops_tokens::{OpsTokens, Role};
use crate::problem::Problem;

/// The configured tokens: the admin token, which acts and reads, the read-only token, and the
/// named ones of `OPS_TOKENS_FILE` ([`crate::ops_tokens`]).
#[derive(Clone, Default)]
pub struct AdminToken {
    tokens: Arc<[Configured]>,
}

#[derive(Clone)]
struct Configured {
    name: Arc<str>,
    role: Role,
    token: Arc<str>,
}

impl AdminToken {
    /// Admin endpoints accept `token`; `None` turns the actions off.
    pub fn new(token: Option<&secrecy::SecretString>) -> Self {
        Self::default().with(ADMIN, Role::Admin, token)
    }

    /// Reading endpoints accept `token` too.
    #[must_use]
    pub fn with_read(self, token: Option<&secrecy::SecretString>) -> Self {
        self.with(READ_ONLY, Role::Read, token)
    }

    /// The named tokens are accepted too, each for its role, under its name.
    #[must_use]
    pub fn with_named(self, named: &OpsTokens) -> Self {
        named.0.iter().fold(self, |tokens, t| {
            tokens.with(&t.name, t.role, Some(&t.token))
        })
    }

    fn with(self, name: &str, role: Role, token: Option<&secrecy::SecretString>) -> Self {
        let Some(token) = token else { return self };
        let added = Configured {
            name: Arc::from(name),
            role,
            token: expose(token),
        };
        Self {
            tokens: self.tokens.iter().cloned().chain([added]).collect(),
        }
    }

    fn has(&self, role: Role) -> bool {
        self.tokens.iter().any(|c| c.role == role)
    }

    /// The name and role of the configured token `parts` carries, if any. Every token is
    /// compared, in constant time, so that the time taken says nothing of which one matched.
    fn caller(&self, parts: &Parts) -> Option<(Arc<str>, Role)> {
        let given = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        self.tokens.iter().fold(None, |found, c| {
            let matches = bool::from(given.as_bytes().ct_eq(c.token.as_bytes()));
            found.or(matches.then(|| (c.name.clone(), c.role)))
        })
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
        let names: Vec<_> = self
            .tokens
            .iter()
            .map(|c| format!("{} ({:?}): <redacted>", c.name, c.role))
            .collect();
        f.debug_struct("AdminToken")
            .field("tokens", &names)
            .finish()
    }
}

/// Proof that the request carried a token that may act. Handlers that take it are admin-only.
#[derive(Debug, Clone)]
pub struct Admin {
    /// The token's name, for the audit log.
    pub name: Arc<str>,
}

impl<S> FromRequestParts<S> for Admin
where
    S: Send + Sync,
    AdminToken: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let tokens = AdminToken::from_ref(state);
        if !tokens.has(Role::Admin) {
            return Err(ApiError::forbidden(
                "admin endpoints are disabled: no ADMIN_TOKEN, and no admin in OPS_TOKENS_FILE",
            ));
        }
        match tokens.caller(parts) {
            Some((name, Role::Admin)) => Ok(Admin { name }),
            Some((_, Role::Read)) => Err(ApiError::forbidden(
                "a read-only token may read, not act: use an admin token",
            )),
            None => Err(ApiError::unauthorized(
                "a valid admin bearer token is required",
            )),
        }
    }
}

/// Proof that the request carried a token that may read: the admin or the read-only one.
#[derive(Debug, Clone)]
pub struct Reader {
    /// The token's name.
    pub name: Arc<str>,
}

impl<S> FromRequestParts<S> for Reader
where
    S: Send + Sync,
    AdminToken: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let tokens = AdminToken::from_ref(state);
        if tokens.tokens.is_empty() {
            return Err(ApiError::forbidden(
                "admin endpoints are disabled: no ADMIN_TOKEN, READ_TOKEN or OPS_TOKENS_FILE",
            ));
        }
        tokens
            .caller(parts)
            .map(|(name, _)| Reader { name })
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
                "The service's ADMIN_TOKEN or an admin token of OPS_TOKENS_FILE; READ_TOKEN or a \
                 read token of the file for the endpoints that only read",
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
