//! With `OTEL_EXPORTER_OTLP_ENDPOINT` set, both services export their spans over OTLP/HTTP, and
//! the exported trace is one tree: the caller's span → `POST /orders` in orders-service → the
//! message's span in billing-service, linked through the outbox row and the NATS header.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::{Json, Router, extract::State, routing::post};
use e2e::cluster::{Cluster, Setup};
use serde_json::{Value, json};
use service_kit::testing::eventually;

/// One exported span: its service and the fields the test looks at.
#[derive(Debug, Clone)]
struct Exported {
    service: String,
    name: String,
    trace_id: String,
    id: String,
    parent_id: String,
}

type Received = Arc<Mutex<Vec<Exported>>>;

/// An OTLP/HTTP receiver (JSON encoding) on a free port, keeping every span it is sent.
async fn receiver() -> (String, Received) {
    async fn traces(State(received): State<Received>, Json(body): Json<Value>) -> Json<Value> {
        let mut spans = received.lock().unwrap();
        for resource in body["resourceSpans"].as_array().into_iter().flatten() {
            let service = resource["resource"]["attributes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["key"] == "service.name")
                .and_then(|a| a["value"]["stringValue"].as_str())
                .unwrap_or_default();
            let scopes = resource["scopeSpans"].as_array().into_iter().flatten();
            for span in scopes.flat_map(|s| s["spans"].as_array().into_iter().flatten()) {
                let text = |key: &str| span[key].as_str().unwrap_or_default().to_owned();
                spans.push(Exported {
                    service: service.to_owned(),
                    name: text("name"),
                    trace_id: text("traceId"),
                    id: text("spanId"),
                    parent_id: text("parentSpanId"),
                });
            }
        }
        Json(json!({}))
    }
    let received = Received::default();
    let app = Router::new()
        .route("/v1/traces", post(traces))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_exported_as_one_trace_from_the_post_to_the_invoice() {
    let (collector, received) = receiver().await;
    let mut cluster = Cluster::start_with(1, 1, Setup::default()).await;
    for service in cluster.orders.iter_mut().chain(cluster.billing.iter_mut()) {
        service.set_env("OTEL_EXPORTER_OTLP_ENDPOINT", Some(&collector));
        service.set_env("OTEL_EXPORTER_OTLP_PROTOCOL", Some("http/json"));
        // Spans leave in batches every 100 ms rather than 5 s: the wait is for the trace.
        service.set_env("OTEL_BSP_SCHEDULE_DELAY", Some("100"));
        // Spans are exported whatever the log level: the harness runs at RUST_LOG=warn.
        service.kill().await;
        service.restart().await;
    }

    let caller_trace = "0af7651916cd43dd8448eb211c80319c";
    let caller_span = "b7ad6b7169203331";
    let response = reqwest::Client::new()
        .post(format!("{}/orders", cluster.orders[0].url))
        .header("traceparent", format!("00-{caller_trace}-{caller_span}-01"))
        .json(&json!({"id": "otlp-1", "customer": "ada", "totalMinor": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);

    let spans_of = |service: &str, name: &str| {
        let spans = received.lock().unwrap();
        let found: Vec<Exported> = spans
            .iter()
            .filter(|s| s.service == service && s.name == name && s.trace_id == caller_trace)
            .cloned()
            .collect();
        found
    };
    let post = eventually(
        "orders-service's POST /orders span",
        Duration::from_secs(30),
        || async { spans_of("orders-service", "POST /orders").pop() },
    )
    .await;
    assert_eq!(post.parent_id, caller_span, "{post:?}");
    assert_eq!(post.id.len(), 16, "{post:?}");

    let consumed = eventually(
        "billing-service's span for the message",
        Duration::from_secs(30),
        || async { spans_of("billing-service", "process OrderPlaced").pop() },
    )
    .await;
    assert_eq!(
        consumed.parent_id, post.id,
        "billing's span continues the POST's span: {consumed:?}, {post:?}"
    );
    cluster.stop().await;
}
