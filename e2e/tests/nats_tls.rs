//! orders-service against a nats-server that requires TLS, its certificate signed by a CA of
//! the test's own: trusted through `NATS_TLS_CA_FILE`, the whole path (stream set-up, relay)
//! works; without it the connection is refused.

use std::time::Duration;

use async_nats::jetstream;
use e2e::process::{NatsServer, TlsFiles};
use e2e::{Names, RunningApp, eventually};
use serde_json::json;
use service_kit::infra;
use service_kit::testing;

#[tokio::test]
async fn orders_service_publishes_over_tls_with_a_private_ca() {
    let dir = std::env::temp_dir().join(testing::unique("e2e-tls"));
    let tls = TlsFiles::generate(&dir);
    let nats = NatsServer::start_tls(&dir, tls).await;

    let untrusted = infra::connect_nats(&nats.url(), "e2e").await;
    assert!(
        untrusted.is_err(),
        "the server's certificate is not trusted without the CA"
    );

    let names = Names::unique();
    let mut config = names.orders_config();
    config.common.nats_url = nats.url().into();
    config.common.nats_tls_ca_file = nats.security().tls_ca_file;
    let orders = RunningApp::orders(config).await;
    let placed = reqwest::Client::new()
        .post(format!("{}/orders", orders.url))
        .json(&json!({"id": "o-tls-1", "customer": "ada", "totalMinor": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(placed.status(), 201);

    let client = infra::connect_nats_with(&nats.url(), "e2e", &nats.security())
        .await
        .unwrap();
    let js = jetstream::new(client);
    eventually(
        "the event on the TLS server's stream",
        Duration::from_secs(20),
        || async {
            let mut stream = js.get_stream(&names.stream).await.ok()?;
            (stream.info().await.ok()?.state.messages == 1).then_some(())
        },
    )
    .await;

    orders.stop().await;
    testing::drop_database(&names.orders_db).await;
    drop(nats);
    std::fs::remove_dir_all(&dir).ok();
}
