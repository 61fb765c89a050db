//! Shared set-up of the outbox-core tests: a database migrated with both tables, a stream of
//! the test's own, publishers that fail on purpose, and bounded waits.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream::Stream};
use outbox_core::publisher::{StreamSpec, ensure_stream};
use outbox_core::{
    Backoff, JetStreamPublisher, Message, NewEvent, PublishError, Publisher, RelayConfig,
};
use sqlx::PgPool;

/// Applies both of the crate's migrations.
pub async fn migrate(pool: &PgPool) {
    outbox_core::migrate::outbox(pool).await.expect("outbox migrations");
    outbox_core::migrate::inbox(pool).await.expect("inbox migrations");
}

/// A stream and subject prefix owned by one test, deleted on drop of the returned guard.
pub struct TestStream {
    pub prefix: String,
    pub name: String,
    pub jetstream: jetstream::Context,
}

impl TestStream {
    pub async fn new() -> Self {
        let suffix = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
        let client = async_nats::connect(url).await.expect("NATS reachable");
        let jetstream = jetstream::new(client);
        let stream = Self { prefix: format!("t{suffix}"), name: format!("T{suffix}"), jetstream };
        let spec = StreamSpec {
            name: stream.name.clone(),
            subjects: vec![format!("{}.>", stream.prefix)],
            duplicate_window: Duration::from_secs(120),
            replicas: 1,
        };
        ensure_stream(&stream.jetstream, &spec).await.expect("stream created");
        stream
    }

    pub fn publisher(&self) -> JetStreamPublisher {
        JetStreamPublisher::new(self.jetstream.clone())
    }

    /// Relay settings for this stream with fast retries.
    pub fn relay_config(&self) -> RelayConfig {
        let mut config = RelayConfig::new(&self.prefix, "/test");
        config.backoff = Backoff { base: Duration::ZERO, max: Duration::ZERO };
        config
    }

    pub async fn stream(&self) -> Stream {
        self.jetstream.get_stream(&self.name).await.expect("stream exists")
    }

    /// Every message in the stream, in stream order, as (ce-subject, ce-type, ce-id).
    pub async fn contents(&self) -> Vec<(String, String, String)> {
        let stream = self.stream().await;
        let last = stream.get_info().await.expect("info").state.last_sequence;
        let mut out = Vec::new();
        for seq in 1..=last {
            let message = stream.get_raw_message(seq).await.expect("message");
            let header = |name: &str| {
                message.headers.get(name).map(|v| v.as_str().to_owned()).unwrap_or_default()
            };
            out.push((header("ce-subject"), header("ce-type"), header("ce-id")));
        }
        out
    }

    pub async fn delete(self) {
        let _ = self.jetstream.delete_stream(&self.name).await;
    }
}

/// Enqueues one event and commits.
pub async fn enqueue(pool: &PgPool, aggregate: &str, event_type: &str, payload: serde_json::Value) {
    let mut tx = pool.begin().await.expect("begin");
    let event = NewEvent::new("order", aggregate, event_type, &payload).expect("valid event");
    outbox_core::enqueue(&mut tx, &event).await.expect("enqueue");
    tx.commit().await.expect("commit");
}

/// What a [`FaultyPublisher`] does to the messages of one aggregate.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// The broker is unreachable: the message is never sent.
    Before,
    /// The broker stores the message, but its PubAck is lost.
    After,
}

/// Wraps the real JetStream publisher and injects faults, first come first served, and records
/// every message it was asked to publish.
pub struct FaultyPublisher {
    inner: JetStreamPublisher,
    faults: Mutex<Vec<Fault>>,
    per_aggregate: Mutex<HashMap<String, Vec<Fault>>>,
    always_fail: Mutex<Vec<String>>,
    first_call_barrier: Mutex<Option<Arc<tokio::sync::Barrier>>>,
    pub asked: Arc<Mutex<Vec<String>>>,
}

impl FaultyPublisher {
    pub fn new(inner: JetStreamPublisher) -> Self {
        Self {
            inner,
            faults: Mutex::new(Vec::new()),
            per_aggregate: Mutex::new(HashMap::new()),
            always_fail: Mutex::new(Vec::new()),
            first_call_barrier: Mutex::new(None),
            asked: Arc::default(),
        }
    }

    /// The next publishes, of any aggregate, meet these faults in order.
    pub fn with_faults(self, faults: Vec<Fault>) -> Self {
        *self.faults.lock().unwrap() = faults.into_iter().rev().collect();
        self
    }

    /// The next publishes of `aggregate` meet these faults in order.
    pub fn with_aggregate_faults(self, aggregate: &str, faults: Vec<Fault>) -> Self {
        self.per_aggregate
            .lock()
            .unwrap()
            .insert(aggregate.to_owned(), faults.into_iter().rev().collect());
        self
    }

    /// Every publish of `aggregate` fails before reaching the broker.
    pub fn failing_forever(self, aggregate: &str) -> Self {
        self.always_fail.lock().unwrap().push(aggregate.to_owned());
        self
    }

    /// The first publish call waits at `barrier`, with the relay's claim held, until the other
    /// parties arrive too.
    pub fn with_first_call_barrier(self, barrier: Arc<tokio::sync::Barrier>) -> Self {
        *self.first_call_barrier.lock().unwrap() = Some(barrier);
        self
    }

    fn fault_for(&self, message: &Message) -> Option<Fault> {
        let aggregate = message.headers.get("ce-subject").map(|v| v.as_str().to_owned())?;
        if self.always_fail.lock().unwrap().contains(&aggregate) {
            return Some(Fault::Before);
        }
        if let Some(fault) =
            self.per_aggregate.lock().unwrap().get_mut(&aggregate).and_then(Vec::pop)
        {
            return Some(fault);
        }
        self.faults.lock().unwrap().pop()
    }
}

impl Publisher for FaultyPublisher {
    async fn publish(&self, messages: Vec<Message>) -> Vec<Result<(), PublishError>> {
        let barrier = self.first_call_barrier.lock().unwrap().take();
        if let Some(barrier) = barrier {
            barrier.wait().await;
        }
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            self.asked.lock().unwrap().push(message.id.to_string());
            let result = match self.fault_for(&message) {
                Some(Fault::Before) => Err(PublishError::NotAccepted("injected: broker unreachable".into())),
                Some(Fault::After) => {
                    let stored = self.inner.publish(vec![message]).await;
                    assert!(stored[0].is_ok(), "real publish failed: {:?}", stored[0]);
                    Err(PublishError::NoAck("injected: PubAck lost".into()))
                }
                None => self.inner.publish(vec![message]).await.pop().expect("one result"),
            };
            results.push(result);
        }
        results
    }
}

/// Polls `check` every 10 ms until it returns `Some`; panics naming `what` after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
