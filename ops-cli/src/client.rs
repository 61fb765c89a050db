//! The service over HTTP: which one it is, and its JSON answers, a refusal turned into an error
//! that carries the service's own explanation (the `detail` of its problem+json).

use anyhow::{Context as _, bail};
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::Value;

/// Which service answers, and so which endpoints hold its dead items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// orders-service: dead events of the outbox.
    Orders,
    /// billing-service: dead letters of the inbox.
    Billing,
}

impl Kind {
    /// The dead items' endpoint.
    pub(crate) fn dead(self) -> &'static str {
        match self {
            Self::Orders => "/outbox/dead",
            Self::Billing => "/inbox/dead",
        }
    }

    /// The counts' endpoint.
    pub(crate) fn stats(self) -> &'static str {
        match self {
            Self::Orders => "/outbox/stats",
            Self::Billing => "/inbox/stats",
        }
    }

    /// What one dead item is called.
    pub(crate) fn noun(self) -> &'static str {
        match self {
            Self::Orders => "dead event",
            Self::Billing => "dead letter",
        }
    }

    /// The fields a table of dead items shows.
    pub(crate) fn columns(self) -> &'static [&'static str] {
        match self {
            Self::Orders => &[
                "id",
                "aggregateId",
                "eventType",
                "attempts",
                "errorClass",
                "lastError",
                "createdAt",
            ],
            Self::Billing => &[
                "id",
                "messageId",
                "subject",
                "deliveries",
                "errorClass",
                "error",
                "createdAt",
            ],
        }
    }
}

/// One service's admin API.
#[derive(Debug)]
pub(crate) struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<SecretString>,
    /// The service answering.
    pub(crate) kind: Kind,
}

impl Client {
    /// Asks the service at `base` which it is.
    pub(crate) async fn connect(base: &str, token: Option<SecretString>) -> anyhow::Result<Self> {
        let base = base.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") {
            bail!(
                "--url must be an http:// URL: give opsctl the service's own address, not a TLS proxy's"
            );
        }
        let mut client = Self {
            http: reqwest::Client::new(),
            base,
            token,
            kind: Kind::Orders,
        };
        let openapi = client.get("/openapi.json", &[]).await?;
        client.kind = match openapi["info"]["title"].as_str() {
            Some("orders-service") => Kind::Orders,
            Some("billing-service") => Kind::Billing,
            other => bail!(
                "{} is neither orders-service nor billing-service (its API is {other:?})",
                client.base
            ),
        };
        Ok(client)
    }

    /// `GET path?query`.
    pub(crate) async fn get(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<Value> {
        let request = self.http.get(format!("{}{path}", self.base)).query(query);
        self.send(request, path).await
    }

    /// `POST path?query`.
    pub(crate) async fn post(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<Value> {
        let request = self.http.post(format!("{}{path}", self.base)).query(query);
        self.send(request, path).await
    }

    async fn send(&self, request: reqwest::RequestBuilder, path: &str) -> anyhow::Result<Value> {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token.expose_secret()),
            None => request,
        };
        let response = request
            .send()
            .await
            .with_context(|| format!("{} did not answer", self.base))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        let detail = body["detail"]
            .as_str()
            .or_else(|| body["title"].as_str())
            .unwrap_or("no explanation");
        let hint = match status.as_u16() {
            401 if self.token.is_none() => " (set OPS_TOKEN or --token)",
            _ => "",
        };
        bail!("{path}: {status}: {detail}{hint}")
    }
}
