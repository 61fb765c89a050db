//! The example service (`examples/greetings.rs`), run against the real PostgreSQL and
//! nats-server: what a team adopting the crate starts from must work.

#[allow(dead_code, unreachable_pub)] // the example's `main` is not the test's
#[path = "../examples/greetings.rs"]
mod greetings;

use std::time::Duration;

use async_nats::HeaderValue;
use async_nats::header::NATS_MESSAGE_ID;
use jetstream_outbox::testing::eventually;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

async fn count(pool: &PgPool, name: &str) -> i64 {
    sqlx::query_scalar("SELECT count FROM greeting_counts WHERE name = $1")
        .bind(name)
        .fetch_optional(pool)
        .await
        .unwrap()
        .unwrap_or(0)
}

/// Greetings posted over HTTP are counted once each; a copy of one, published again under a
/// new `Nats-Msg-Id` (so the broker keeps it, as after a relay crash past the duplicate window)
/// is recognised by the inbox and changes no count, though the count itself is not idempotent.
#[sqlx::test(migrations = false)]
async fn the_example_service_counts_each_greeting_once(pool: PgPool) {
    let prefix = format!("g{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let nats = async_nats::connect(url).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let service = tokio::spawn(greetings::run(
        pool.clone(),
        nats.clone(),
        listener,
        prefix.clone(),
        shutdown.clone(),
    ));
    let http = reqwest::Client::new();
    let greet = |name: &'static str| {
        http.post(format!("http://{address}/greetings"))
            .json(&serde_json::json!({ "name": name }))
            .send()
    };

    // The service may still be creating its tables: the first greeting is retried.
    eventually(
        "the service to accept a greeting",
        Duration::from_secs(30),
        || async {
            let response = greet("Ada").await.ok()?;
            (response.status() == reqwest::StatusCode::CREATED).then_some(())
        },
    )
    .await;
    for name in ["Ada", "Grace"] {
        assert_eq!(greet(name).await.unwrap().status(), 201);
    }
    eventually("Ada counted twice", Duration::from_secs(30), || async {
        (count(&pool, "Ada").await == 2).then_some(())
    })
    .await;

    let jetstream = async_nats::jetstream::new(nats);
    let mut stream = jetstream.get_stream(prefix.to_uppercase()).await.unwrap();
    let first = stream.get_raw_message(1).await.unwrap();
    let mut headers = first.headers.clone();
    headers.insert(
        NATS_MESSAGE_ID,
        HeaderValue::from(uuid::Uuid::new_v4().to_string()),
    );
    jetstream
        .publish_with_headers(first.subject.to_string(), headers, first.payload.clone())
        .await
        .unwrap()
        .await
        .unwrap();
    let mut not_a_greeting = async_nats::HeaderMap::new();
    not_a_greeting.insert(
        jetstream_outbox::headers::ID,
        uuid::Uuid::new_v4().to_string().as_str(),
    );
    jetstream
        .publish_with_headers(
            format!("{prefix}.Greeted.x"),
            not_a_greeting.clone(),
            "{}".into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    // Messages are applied in stream order: once a greeting posted after the copy and the
    // stray message is counted, both were handled.
    assert_eq!(greet("Edsger").await.unwrap().status(), 201);
    eventually("Edsger counted", Duration::from_secs(30), || async {
        (count(&pool, "Edsger").await == 1).then_some(())
    })
    .await;
    assert_eq!(
        stream.info().await.unwrap().state.messages,
        6,
        "the copy is in the stream"
    );
    assert_eq!(count(&pool, "Ada").await, 2, "the copy counted again");
    assert_eq!(count(&pool, "Grace").await, 1);
    let inbox = jetstream_outbox::Inbox::new(pool.clone(), "counter");
    assert_eq!(
        inbox.stats().await.unwrap().duplicate,
        1,
        "the copy is a duplicate"
    );
    let dead = inbox
        .dead(&jetstream_outbox::inbox::DeadLetterFilter::all(), 0, 10)
        .await
        .unwrap();
    let reasons: Vec<&str> = dead.iter().map(|letter| letter.error.as_str()).collect();
    assert_eq!(
        reasons,
        ["not a greeting"],
        "only the stray message is a dead letter"
    );
    let stray = &dead[0];
    let stray_id = not_a_greeting
        .get(jetstream_outbox::headers::ID)
        .unwrap()
        .as_str();
    assert_eq!(stray.message_id.as_deref(), Some(stray_id));
    assert_eq!(stray.subject, format!("{prefix}.Greeted.x"));
    assert_eq!(stray.deliveries, 1);
    let kept = stray.header_map();
    assert_eq!(
        kept.get(jetstream_outbox::headers::ID).unwrap().as_str(),
        stray_id
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), service)
        .await
        .expect("the service stops when told")
        .unwrap()
        .unwrap();
    jetstream
        .delete_stream(prefix.to_uppercase())
        .await
        .unwrap();
}
