//! Over HTTP with both services running: an order becomes exactly one invoice.

use std::path::Path;
use std::time::Duration;

use e2e::{Stack, eventually};
use serde_json::{Value, json};

async fn get_json(client: &reqwest::Client, url: String) -> Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

async fn invoices_of(client: &reqwest::Client, billing: &str, order_id: &str) -> Vec<Value> {
    let page = get_json(client, format!("{billing}/invoices?orderId={order_id}")).await;
    page["items"].as_array().unwrap().clone()
}

/// orders-service's `/metrics` once it shows no pending event. The gauges it reads from the
/// database are computed at most once per `service_kit::metrics::GAUGE_INTERVAL`: the last
/// may predate the relay's record.
async fn metrics_with_nothing_pending(client: &reqwest::Client, orders: &str) -> String {
    eventually(
        "no pending event in /metrics",
        Duration::from_secs(10),
        || async {
            let response = client.get(format!("{orders}/metrics")).send().await.ok()?;
            let text = response.text().await.ok()?;
            text.contains("outbox_pending_events 0").then_some(text)
        },
    )
    .await
}

#[tokio::test]
async fn an_order_becomes_exactly_one_invoice_and_a_repeated_post_is_safe() {
    let stack = Stack::start().await;
    let client = reqwest::Client::new();
    let body = json!({"id": "o-http-1", "customer": "ada", "totalMinor": 4200});

    let first = client
        .post(format!("{}/orders", stack.orders.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 201);
    assert_eq!(first.headers()["location"], "/orders/o-http-1");
    let placed: Value = first.json().await.unwrap();
    assert_eq!(placed["status"], "placed");

    let invoices = eventually("the invoice", Duration::from_secs(20), || async {
        let invoices = invoices_of(&client, &stack.billing.url, "o-http-1").await;
        (!invoices.is_empty()).then_some(invoices)
    })
    .await;
    assert_eq!(invoices.len(), 1);
    assert_eq!(invoices[0]["totalMinor"], 4200);
    assert_eq!(invoices[0]["status"], "open");

    let again = client
        .post(format!("{}/orders", stack.orders.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.json::<Value>().await.unwrap(), placed);

    // Paying goes through the same path and marks the one invoice paid.
    let paid = client
        .post(format!("{}/orders/o-http-1/pay", stack.orders.url))
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status(), 200);
    let invoices = eventually("the paid invoice", Duration::from_secs(20), || async {
        let invoices = invoices_of(&client, &stack.billing.url, "o-http-1").await;
        (invoices.first().is_some_and(|i| i["status"] == "paid")).then_some(invoices)
    })
    .await;
    assert_eq!(invoices.len(), 1, "still exactly one invoice: {invoices:?}");

    let stats = get_json(&client, format!("{}/inbox/stats", stack.billing.url)).await;
    assert_eq!(stats["processed"], 2, "OrderPlaced and OrderPaid: {stats}");
    // The relay records its pass after the broker acknowledged it: billing may be done first.
    eventually(
        "the relay's pass recorded",
        Duration::from_secs(20),
        || async {
            let outbox = get_json(&client, format!("{}/outbox/stats", stack.orders.url)).await;
            (outbox["pending"] == 0).then_some(())
        },
    )
    .await;

    for base in [&stack.orders.url, &stack.billing.url] {
        let docs = client.get(format!("{base}/docs")).send().await.unwrap();
        assert_eq!(docs.status(), 200);
        assert!(
            docs.text().await.unwrap().contains("swagger-ui"),
            "the docs page is served"
        );
        let api: Value = get_json(&client, format!("{base}/openapi.json")).await;
        assert!(api["paths"]["/healthz"].is_object(), "{api}");
    }

    let orders_metrics = metrics_with_nothing_pending(&client, &stack.orders.url).await;
    for expected in [
        "outbox_published_total",
        "outbox_pending_events 0",
        "outbox_commit_to_ack_seconds_bucket",
        r#"http_server_requests_total{method="POST",route="/orders",status="201"}"#,
    ] {
        assert!(
            orders_metrics.contains(expected),
            "{expected} missing:\n{orders_metrics}"
        );
    }
    let billing_metrics = client
        .get(format!("{}/metrics", stack.billing.url))
        .send()
        .await
        .unwrap();
    let billing_metrics = billing_metrics.text().await.unwrap();
    for expected in [
        "inbox_processed_total",
        "inbox_dead_letters_open 0",
        "billing_message_handling_seconds_bucket",
    ] {
        assert!(
            billing_metrics.contains(expected),
            "{expected} missing:\n{billing_metrics}"
        );
    }
    promtool_finds_nothing(&orders_metrics, "orders-service");
    promtool_finds_nothing(&billing_metrics, "billing-service");
    stack.stop().await;
}

/// Prometheus' own linter (`promtool check metrics`) has nothing to say of `metrics`: every
/// family has its HELP, counters end in `_total`, units are in the names, no two families
/// collide.
fn promtool_finds_nothing(metrics: &str, service: &str) {
    let Some(said) = e2e::promtool::run(&["check", "metrics"], Path::new("."), metrics) else {
        return;
    };
    assert!(
        said.success && said.text.trim().is_empty(),
        "promtool check metrics, on {service}'s /metrics:\n{}",
        said.text
    );
}
