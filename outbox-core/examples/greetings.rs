//! A service that adopts jetstream-outbox, in one file. `POST /greetings {"name": "Ada"}` saves a
//! greeting and its event in one transaction; the relay beside the handler publishes the event
//! to JetStream; a consumer counts greetings per name through the inbox, once per event however
//! often it is delivered (the count is not idempotent: the inbox is what keeps it right).
//! Run `cargo run -p jetstream-outbox --example greetings` with `DATABASE_URL` and `NATS_URL` set;
//! then `curl localhost:3000/greetings -H 'content-type: application/json' -d '{"name":"Ada"}'`.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull};
use axum::{Json, Router, extract::State, http::StatusCode, routing::post};
use jetstream_outbox::inbox::{ConsumeConfig, Digest, NewDeadLetter, consume, message_id};
use jetstream_outbox::publisher::{StreamSpec, ensure_stream};
use jetstream_outbox::{
    Cleanup, Inbox, JetStreamPublisher, NewEvent, Outcome, Relay, RelayConfig, StreamRepair, Wakeup,
};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Deserialize, Serialize)]
struct Greeting {
    name: String,
}

#[derive(Debug, Clone)]
struct App(PgPool, Wakeup); // the handler's state: its pool, and the relay's wake-up

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt::init();
    // This workspace builds the example with the `wal` feature, whose second TLS backend
    // leaves rustls to be told which to use before a `tls://` NATS_URL connects.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pool = PgPool::connect(&std::env::var("DATABASE_URL")?).await?;
    let nats = async_nats::connect(std::env::var("NATS_URL")?).await?;
    let listener = TcpListener::bind("127.0.0.1:3000").await?;
    let shutdown = CancellationToken::new();
    let on_ctrl_c = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_ctrl_c.cancel();
    });
    run(pool, nats, listener, "greetings".into(), shutdown).await
}

/// Creates the tables and the stream, then serves `listener` and runs the relay and the
/// consumer until `shutdown`. `prefix` names the subjects; the stream is the prefix in capitals.
pub async fn run(
    pool: PgPool,
    nats: async_nats::Client,
    listener: TcpListener,
    prefix: String,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    jetstream_outbox::migrate::outbox(&pool).await?;
    jetstream_outbox::migrate::inbox(&pool).await?;
    sqlx::raw_sql(TABLES).execute(&pool).await?;
    let jetstream = jetstream::new(nats);
    let stream = prefix.to_uppercase();
    let spec = StreamSpec::new(&stream, vec![format!("{prefix}.>")]);
    ensure_stream(&jetstream, &spec).await?;

    // The producer's half: the relay publishes what the handler commits, woken by the commit,
    // and publishes again what the broker acknowledged and lost (it checks the stream against
    // the published events the outbox keeps for a day).
    let wakeup = Wakeup::in_process();
    let publisher = JetStreamPublisher::new(jetstream.clone());
    let config = RelayConfig::new(prefix, "/greetings");
    let relay = Relay::new(pool.clone(), publisher, config)
        .with_wakeup(&wakeup)
        .with_repair(StreamRepair::new(jetstream.clone(), spec));
    let relay = tokio::spawn(relay.run(shutdown.clone()));
    let day = Duration::from_secs(24 * 3600);
    tokio::spawn(Cleanup::outbox(pool.clone(), day).run(shutdown.clone()));

    // The consumer's half: a durable pull consumer whose messages go through the inbox.
    let config = pull::Config {
        durable_name: Some("counter".into()),
        ..Default::default()
    };
    let stream = jetstream.get_stream(&stream).await?;
    let consumer = stream.get_or_create_consumer("counter", config).await?;
    let inbox = Inbox::new(pool.clone(), "counter");
    // A week: longer than any copy of a message can come (the stream keeps messages a week).
    tokio::spawn(Cleanup::inbox(inbox.clone(), 7 * day).run(shutdown.clone()));
    let stop = shutdown.clone();
    let consumer = tokio::spawn(async move {
        let config = ConsumeConfig::default();
        consume(&consumer, &inbox, &stop, &config, |inbox, message| {
            Box::pin(apply(inbox, message))
        })
        .await
        .inspect_err(|_| stop.cancel()) // the service stops with the consumer's error
    });

    let app = Router::new()
        .route("/greetings", post(greet))
        .with_state(App(pool, wakeup));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await?;
    relay.await?;
    Ok(consumer.await??)
}

/// Saves the greeting and its event in one transaction; committing wakes the relay.
async fn greet(State(App(pool, wakeup)): State<App>, Json(greeting): Json<Greeting>) -> StatusCode {
    let id = uuid::Uuid::now_v7();
    let Ok(event) = NewEvent::new("greeting", id.to_string(), "Greeted", &greeting) else {
        return StatusCode::UNPROCESSABLE_ENTITY;
    };
    let saved: sqlx::Result<()> = async {
        let mut tx = pool.begin().await?;
        sqlx::query("INSERT INTO greetings (id, name) VALUES ($1, $2)")
            .bind(id)
            .bind(&greeting.name)
            .execute(&mut *tx)
            .await?;
        jetstream_outbox::enqueue(&mut tx, &event).await?;
        jetstream_outbox::commit(tx, &wakeup).await
    }
    .await;
    if let Err(error) = saved {
        tracing::error!(error = %error, "saving a greeting failed");
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    StatusCode::CREATED
}

/// Counts the greeting once: the inbox records the message's `ce-id` in the transaction that
/// updates the count, so a redelivered copy finds the record and changes nothing. What can
/// never be counted is kept as a dead letter and acknowledged; after any other error the
/// message is delivered again.
async fn apply(inbox: &Inbox, message: &jetstream::Message) -> anyhow::Result<AckKind> {
    let id = message_id(message);
    let rejected = match (id, serde_json::from_slice(&message.payload)) {
        (Some(id), Ok(Greeting { name })) => {
            let digest = Digest::of(&[&message.payload]);
            let outcome = inbox.process(id, &digest, |conn| {
                Box::pin(sqlx::query(COUNT).bind(name).execute(conn))
            });
            match outcome.await {
                Ok(Outcome::Processed(_) | Outcome::Duplicate) => None,
                Ok(Outcome::IdReused) => Some("its id was used before by another message"),
                Err(error) if error.refused_for_good().is_some() => Some("PostgreSQL refuses it"),
                Err(error) => return Err(error.into()),
            }
        }
        (None, _) => Some("no valid ce-id"),
        (Some(_), Err(_)) => Some("not a greeting"),
    };
    if let Some(reason) = rejected {
        // Never applicable: kept for an operator (`Inbox::dead`), not delivered again.
        let letter = NewDeadLetter::of_message(message, reason);
        inbox.dead_letter(letter).await?;
    }
    Ok(AckKind::Ack)
}

const TABLES: &str = "CREATE TABLE IF NOT EXISTS greetings (id uuid PRIMARY KEY, name text);
    CREATE TABLE IF NOT EXISTS greeting_counts (name text PRIMARY KEY, count bigint NOT NULL)";
const COUNT: &str = "INSERT INTO greeting_counts (name, count) VALUES ($1, 1)
    ON CONFLICT (name) DO UPDATE SET count = greeting_counts.count + 1";
