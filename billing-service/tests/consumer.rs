//! billing-service's consumer against the real nats-server and PostgreSQL, with messages put on
//! the stream by hand.

use std::time::Duration;

use async_nats::HeaderMap;
use billing_service::{App, Config};
use bytes::Bytes;
use serde_json::{Value, json};
use service_kit::testing::{self, Running, eventually};
use sqlx::PgPool;

struct TestApp {
    running: Running,
    pool: PgPool,
    jetstream: async_nats::jetstream::Context,
    prefix: String,
    database: String,
    stream: String,
}

impl TestApp {
    async fn spawn() -> Self {
        Self::spawn_with(|_| {}).await
    }

    async fn spawn_with(adjust: impl FnOnce(&mut Config)) -> Self {
        let database = testing::unique("billing_test");
        let stream = testing::unique("BILLING_TEST");
        let mut config = Config::from_env().unwrap();
        testing::point_at(&mut config.common, &database, &stream);
        let prefix = config.common.subject_prefix.clone();
        config.consumer.retry_delay = Duration::from_millis(50);
        config.consumer.max_retries = 1000;
        adjust(&mut config);
        let app = App::build(config).await.unwrap();
        let pool = app.pool().clone();
        let running = Running::spawn(app.port(), |stop| app.run_until_stopped(stop));
        let client = async_nats::connect(testing::nats_url()).await.unwrap();
        let jetstream = async_nats::jetstream::new(client);
        Self {
            running,
            pool,
            jetstream,
            prefix,
            database,
            stream,
        }
    }

    /// Publishes a message as the relay would, with `ce-id` = `id`.
    async fn publish(&self, id: &str, event_type: &str, order_id: &str, body: impl Into<Bytes>) {
        let mut headers = HeaderMap::new();
        headers.insert("ce-specversion", "1.0");
        headers.insert("ce-id", id);
        headers.insert("ce-type", event_type);
        headers.insert("ce-source", "/test");
        headers.insert("ce-subject", order_id);
        // A fresh Nats-Msg-Id so the broker does not drop deliberate duplicates.
        headers.insert("Nats-Msg-Id", uuid::Uuid::new_v4().to_string().as_str());
        let subject = format!("{}.{event_type}.{order_id}", self.prefix);
        let ack = self
            .jetstream
            .publish_with_headers(subject, headers, body.into())
            .await
            .unwrap();
        ack.await.unwrap();
    }

    async fn invoice(&self, order_id: &str) -> Option<(i64, String)> {
        sqlx::query_as("SELECT total_minor, status FROM invoices WHERE order_id = $1")
            .bind(order_id)
            .fetch_optional(&self.pool)
            .await
            .unwrap()
    }

    async fn stats(&self) -> Value {
        reqwest::get(format!("{}/inbox/stats", self.running.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn stop(self) {
        self.running.stop().await;
        testing::drop_database(&self.database).await;
        testing::delete_stream(&self.stream).await;
    }
}

fn placed(order_id: &str, total_minor: i64) -> Vec<u8> {
    serde_json::to_vec(&json!({"orderId": order_id, "customer": "ada", "totalMinor": total_minor}))
        .unwrap()
}

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn poison_message_is_dead_lettered_and_others_flow() {
    let app = TestApp::spawn_with(|config| config.common.admin_token = Some("s3cret".into())).await;
    app.publish("m-poison", "OrderPlaced", "o1", "not json")
        .await;
    app.publish("m-ok", "OrderPlaced", "o2", placed("o2", 300))
        .await;

    let invoice = eventually("o2's invoice", WAIT, || async { app.invoice("o2").await }).await;
    assert_eq!(invoice, (300, "open".into()));
    let stats = eventually("the dead letter", WAIT, || async {
        let stats = app.stats().await;
        (stats["dead"] == 1).then_some(stats)
    })
    .await;
    assert_eq!(stats["processed"], 1, "{stats}");
    let (message_id, payload): (Option<String>, Vec<u8>) =
        sqlx::query_as("SELECT message_id, payload FROM inbox_dead")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        (message_id.as_deref(), payload.as_slice()),
        (Some("m-poison"), &b"not json"[..])
    );
    assert_eq!(app.invoice("o1").await, None);

    // An operator gives up on it: closed as skipped, still kept.
    let id: i64 = sqlx::query_scalar("SELECT id FROM inbox_dead")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let skip = || {
        reqwest::Client::new()
            .post(format!("{}/inbox/dead/{id}/skip", app.running.url))
            .bearer_auth("s3cret")
            .send()
    };
    assert_eq!(skip().await.unwrap().status(), 200);
    assert_eq!(skip().await.unwrap().status(), 404, "closed by the first");
    assert_eq!(app.stats().await["dead"], 0);
    let resolution: Option<String> = sqlx::query_scalar("SELECT resolution FROM inbox_dead")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(resolution.as_deref(), Some("skipped"));
    assert_eq!(app.invoice("o1").await, None);
    app.stop().await;
}

#[tokio::test]
async fn paid_before_placed_is_retried_not_lost() {
    let app = TestApp::spawn().await;
    app.publish("m-paid", "OrderPaid", "o1", placed("o1", 500))
        .await;
    app.publish("m-placed", "OrderPlaced", "o1", placed("o1", 500))
        .await;

    let invoice = eventually("o1 paid", WAIT, || async {
        app.invoice("o1")
            .await
            .filter(|(_, status)| status == "paid")
    })
    .await;
    assert_eq!(invoice.0, 500);
    let stats = app.stats().await;
    assert_eq!(
        (stats["processed"].as_i64(), stats["dead"].as_i64()),
        (Some(2), Some(0)),
        "{stats}"
    );
    app.stop().await;
}

#[tokio::test]
async fn redelivered_message_changes_nothing() {
    let app = TestApp::spawn().await;
    for _ in 0..3 {
        app.publish("m-same", "OrderPlaced", "o1", placed("o1", 900))
            .await;
    }
    app.publish("m-other", "OrderPlaced", "o2", placed("o2", 100))
        .await;

    let stats = eventually("all four deliveries", WAIT, || async {
        let stats = app.stats().await;
        (stats["processed"] == 2 && stats["duplicate"] == 2).then_some(stats)
    })
    .await;
    assert_eq!(stats["dead"], 0);
    let invoices: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(invoices, 2);
    app.stop().await;
}

/// A message that cannot be applied (OrderPaid for an order billing never saw) becomes a dead
/// letter; once the cause is fixed (the OrderPlaced arrives), an admin replay applies it
/// exactly once.
#[tokio::test]
async fn dead_letter_replay_after_the_cause_is_fixed_applies_once() {
    let app = TestApp::spawn_with(|config| {
        config.consumer.max_retries = 2;
        config.common.admin_token = Some("s3cret".into());
    })
    .await;
    app.publish("m-paid", "OrderPaid", "o1", placed("o1", 800))
        .await;
    eventually("the dead letter", WAIT, || async {
        (app.stats().await["dead"] == 1).then_some(())
    })
    .await;
    app.publish("m-other", "OrderPlaced", "o2", placed("o2", 100))
        .await;
    eventually("o2's invoice", WAIT, || async { app.invoice("o2").await }).await;

    let client = reqwest::Client::new();
    let dead: Value = client
        .get(format!("{}/inbox/dead", app.running.url))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = dead["items"][0]["id"].as_i64().unwrap();
    assert!(
        dead["items"][0]["error"]
            .as_str()
            .unwrap()
            .contains("no invoice for order o1")
    );
    let retry = |token: &'static str| {
        client
            .post(format!("{}/inbox/dead/{id}/retry", app.running.url))
            .bearer_auth(token)
            .send()
    };
    assert_eq!(retry("wrong").await.unwrap().status(), 401);
    assert_eq!(
        retry("s3cret").await.unwrap().status(),
        409,
        "o1 still has no invoice"
    );

    app.publish("m-placed", "OrderPlaced", "o1", placed("o1", 800))
        .await;
    eventually("o1's invoice", WAIT, || async { app.invoice("o1").await }).await;
    assert_eq!(retry("s3cret").await.unwrap().status(), 200);
    assert_eq!(app.invoice("o1").await, Some((800, "paid".into())));
    assert_eq!(
        retry("s3cret").await.unwrap().status(),
        404,
        "closed after the replay"
    );
    let stats = app.stats().await;
    assert_eq!(
        (stats["processed"].as_i64(), stats["dead"].as_i64()),
        (Some(3), Some(0)),
        "{stats}"
    );
    let invoices: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(invoices, 2);
    app.stop().await;
}
