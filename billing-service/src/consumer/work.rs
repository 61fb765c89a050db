//! The consumer's work in flight: the transactions running, the messages waiting for one (the
//! batcher decides which go together), and each message's span.

use std::collections::HashMap;
use std::hash::{BuildHasher as _, RandomState};
use std::sync::Arc;

use async_nats::HeaderMap;
use async_nats::jetstream;
use jetstream_outbox::headers;
use tokio::task::{JoinError, JoinSet};

use super::Consumer;
use crate::batcher::{Batcher, Key};
use crate::parse::header;

/// The consumer's transactions: those running, and the messages waiting for one.
pub(super) struct Work {
    consumer: Arc<Consumer>,
    pub(super) batcher: Batcher<jetstream::Message>,
    pub(super) running: JoinSet<()>,
    /// The keys each running transaction holds.
    keys: HashMap<tokio::task::Id, Vec<Key>>,
    hasher: RandomState,
}

impl Work {
    pub(super) fn new(consumer: Arc<Consumer>) -> Self {
        let batcher = Batcher::new(consumer.config.apply_batch, consumer.config.concurrency);
        Self {
            consumer,
            batcher,
            running: JoinSet::new(),
            keys: HashMap::new(),
            hasher: RandomState::new(),
        }
    }

    /// Puts `message` behind the waiting ones, keyed by its order id, and starts what may start.
    pub(super) fn add(&mut self, message: jetstream::Message) {
        let order = message
            .headers
            .as_ref()
            .and_then(|h| header(h, headers::SUBJECT));
        self.batcher.push(self.hasher.hash_one(order), message);
        self.start();
    }

    /// Starts every transaction the batcher allows now.
    pub(super) fn start(&mut self) {
        while let Some(batch) = self.batcher.start() {
            let consumer = self.consumer.clone();
            let task = self
                .running
                .spawn(async move { consumer.handle(batch.messages).await });
            self.keys.insert(task.id(), batch.keys);
        }
    }

    /// Releases the keys of a transaction that ended, and starts what may start now.
    pub(super) fn finished(&mut self, joined: Result<(tokio::task::Id, ()), JoinError>) {
        let id = match joined {
            Ok((id, ())) => id,
            Err(error) => {
                // The messages it had not settled stay unacknowledged and come back after the
                // ack wait; a later message of their order may go first (a payment before its
                // placement is then not applicable yet, and retried).
                tracing::error!(error = %error, "message handler failed");
                error.id()
            }
        };
        if let Some(keys) = self.keys.remove(&id) {
            self.batcher.finished(&keys);
        }
        self.start();
    }

    /// Applies every message waiting and waits for every transaction.
    pub(super) async fn finish(mut self) {
        while let Some(joined) = self.running.join_next_with_id().await {
            self.finished(joined);
        }
        debug_assert!(self.batcher.is_idle());
    }
}

/// A message being handled, with what is read of it once.
pub(super) struct InHand {
    pub(super) message: jetstream::Message,
    pub(super) headers: HeaderMap,
    /// The message's span, continuing its producer's trace.
    pub(super) span: tracing::Span,
    pub(super) started: std::time::Instant,
}

impl InHand {
    pub(super) fn new(message: jetstream::Message) -> Self {
        let started = std::time::Instant::now();
        let deliveries = message.info().map_or(1, |info| info.delivered);
        let headers = message.headers.clone().unwrap_or_default();
        let span = tracing::info_span!(
            "message",
            otel.name = format!("process {}", header(&headers, headers::TYPE).unwrap_or("message")),
            otel.kind = "consumer",
            messaging.message.id = header(&headers, headers::ID),
            messaging.destination.name = %message.subject,
            event.type = header(&headers, headers::TYPE),
            trace_id = header(&headers, headers::TRACEPARENT).map(service_kit::http::trace_id),
            deliveries,
        );
        service_kit::telemetry::continue_trace(&span, header(&headers, headers::TRACEPARENT));
        Self {
            message,
            headers,
            span,
            started,
        }
    }
}
