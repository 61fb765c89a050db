//! One trace id follows an order from the POST, through the outbox row and the NATS message,
//! into billing's span for that message: the caller's trace, or one orders-service started.

use std::time::Duration;

use e2e::cluster::{Cluster, Setup};
use serde_json::{Value, json};
use service_kit::testing::eventually;

/// Each JSON log line of a service.
fn lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// The trace id on the span of the first line with `message` that mentions `needle`.
fn trace_of(log: &str, message: &str, needle: &str) -> Option<String> {
    lines(log).into_iter().find_map(|line| {
        let matches = line["message"] == message && line.to_string().contains(needle);
        matches
            .then(|| line["span"]["trace_id"].as_str().map(str::to_owned))
            .flatten()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_id_from_the_post_to_the_invoice() {
    let setup = Setup {
        info_logs: true,
        ..Setup::default()
    };
    let cluster = Cluster::start_with(1, 1, setup).await;
    let client = reqwest::Client::new();
    let given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    for (id, traceparent) in [("traced-given", Some(given)), ("traced-started", None)] {
        let mut request = client
            .post(format!("{}/orders", cluster.orders[0].url))
            .json(&json!({"id": id, "customer": "ada", "totalMinor": 100}));
        if let Some(traceparent) = traceparent {
            request = request.header("traceparent", traceparent);
        }
        assert_eq!(request.send().await.unwrap().status(), 201);
    }

    for id in ["traced-given", "traced-started"] {
        let in_orders = trace_of(&cluster.orders[0].log(), "order placed", id)
            .unwrap_or_else(|| panic!("orders-service logged no trace for {id}"));
        let in_billing = eventually("billing's log line", Duration::from_secs(20), || async {
            trace_of(&cluster.billing[0].log(), "message applied", id)
        })
        .await;
        assert_eq!(in_orders.len(), 32, "{in_orders}");
        assert_eq!(in_orders, in_billing, "trace of {id}");
    }
    let given_trace = trace_of(&cluster.orders[0].log(), "order placed", "traced-given");
    assert_eq!(
        given_trace.as_deref(),
        Some("0af7651916cd43dd8448eb211c80319c")
    );
    cluster.stop().await;
}
