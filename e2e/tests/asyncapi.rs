//! The events' AsyncAPI document is valid, and the messages actually on the stream match it:
//! an order placed, paid and shipped, its three messages read back from the stream are put in
//! the document as its messages' examples, and the AsyncAPI Initiative's own parser
//! (`@asyncapi/parser`, `e2e/browser/validate-asyncapi.mjs`) checks the document and each
//! example against its headers' and payload's schemas. Both services serve the same document.
//!
//! Needs `node` and `npm ci` run in `e2e/browser` (`scripts/test` does that); without them the
//! test says so and passes, except under `CI`, where it fails.

use std::path::Path;

use e2e::{Stack, eventually};
use serde_json::{Value, json};

/// The messages of `stream`, as (subject, headers, body).
async fn stream_messages(stream: &str) -> Vec<(String, Value, Value)> {
    let client = async_nats::connect(service_kit::testing::nats_url())
        .await
        .unwrap();
    let stream = async_nats::jetstream::new(client)
        .get_stream(stream)
        .await
        .unwrap();
    let last = stream.get_info().await.unwrap().state.last_sequence;
    let mut messages = Vec::new();
    for seq in 1..=last {
        let message = stream.get_raw_message(seq).await.unwrap();
        let headers: serde_json::Map<String, Value> = message
            .headers
            .iter()
            .map(|(name, values)| (name.to_string(), json!(values[0].as_str())))
            .collect();
        let body: Value = serde_json::from_slice(&message.payload).unwrap();
        messages.push((message.subject.to_string(), Value::Object(headers), body));
    }
    messages
}

#[tokio::test]
async fn the_messages_on_the_stream_match_the_asyncapi_document() {
    let stack = Stack::start().await;
    let client = reqwest::Client::new();
    let order = json!({"id": "o-async", "customer": "ada", "totalMinor": 1999});
    let placed = client
        .post(format!("{}/orders", stack.orders.url))
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(placed.status(), 201);
    for action in ["pay", "ship"] {
        let changed = client
            .post(format!("{}/orders/o-async/{action}", stack.orders.url))
            .send()
            .await
            .unwrap();
        assert_eq!(changed.status(), 200);
    }
    let messages = eventually(
        "three events on the stream",
        std::time::Duration::from_secs(20),
        || async {
            let messages = stream_messages(&stack.names.stream).await;
            (messages.len() == 3).then_some(messages)
        },
    )
    .await;

    let get = |url: String| {
        let client = client.clone();
        async move {
            client
                .get(url)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let mut document = get(format!("{}/asyncapi.json", stack.orders.url)).await;
    let from_billing = get(format!("{}/asyncapi.json", stack.billing.url)).await;
    assert_eq!(document, from_billing, "both services serve one contract");
    let address = document["channels"]["orderEvents"]["address"]
        .as_str()
        .unwrap()
        .to_owned();
    for (subject, headers, body) in messages {
        let event_type = headers["ce-type"].as_str().unwrap().to_owned();
        let expected_subject = address
            .replace("{eventType}", &event_type)
            .replace("{orderId}", body["orderId"].as_str().unwrap());
        assert_eq!(subject, expected_subject);
        let examples = &mut document["components"]["messages"][&event_type]["examples"];
        if !examples.is_array() {
            *examples = json!([]);
        }
        examples
            .as_array_mut()
            .unwrap()
            .push(json!({"name": format!("{event_type} of o-async"), "headers": headers, "payload": body}));
    }
    stack.stop().await;

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("browser");
    if !dir.join("node_modules/@asyncapi/parser").exists() {
        let reason = format!(
            "@asyncapi/parser missing (npm ci --prefix {})",
            dir.display()
        );
        assert!(std::env::var_os("CI").is_none(), "{reason}");
        eprintln!("SKIPPED the document's validation: {reason}");
        return;
    }
    let file =
        std::env::temp_dir().join(format!("{}.json", service_kit::testing::unique("asyncapi")));
    std::fs::write(&file, serde_json::to_vec_pretty(&document).unwrap()).unwrap();
    let output = std::process::Command::new("node")
        .arg("validate-asyncapi.mjs")
        .arg(&file)
        .current_dir(&dir)
        .output()
        .expect("node runs");
    let _ = std::fs::remove_file(&file);
    assert!(
        output.status.success(),
        "the AsyncAPI parser refused the document with the stream's messages:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
