//! Publishing to JetStream: the [`Publisher`] trait the relay uses, its JetStream
//! implementation, and the stream set-up.

use std::future::Future;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishAckFuture, stream};
use bytes::Bytes;
use uuid::Uuid;

use crate::{Error, PublishError};

/// One message ready for the broker.
#[derive(Debug, Clone)]
pub struct Message {
    /// The CloudEvents id, also sent as `Nats-Msg-Id`.
    pub id: Uuid,
    /// The NATS subject.
    pub subject: String,
    /// CloudEvents attributes and trace context.
    pub headers: HeaderMap,
    /// The JSON body.
    pub payload: Bytes,
}

/// Something that publishes messages and reports, per message, whether the broker stored it.
///
/// The relay calls [`Publisher::publish`] with messages of distinct aggregates only, so an
/// implementation may send them all before awaiting any acknowledgement.
pub trait Publisher: Send + Sync {
    /// Publishes `messages`; the result at index `i` is the outcome of `messages[i]`.
    fn publish(
        &self,
        messages: Vec<Message>,
    ) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send;
}

/// Publishes to JetStream with pipelined acknowledgements.
#[derive(Debug, Clone)]
pub struct JetStreamPublisher {
    context: jetstream::Context,
    window: usize,
}

impl JetStreamPublisher {
    /// Largest number of publishes sent before their acknowledgements are awaited; stays below
    /// async-nats' default limit of 5000 unacknowledged publishes.
    pub const DEFAULT_WINDOW: usize = 4096;

    /// A publisher over a JetStream context.
    pub fn new(context: jetstream::Context) -> Self {
        Self {
            context,
            window: Self::DEFAULT_WINDOW,
        }
    }

    /// Sets how many publishes may await their acknowledgement at once.
    #[must_use]
    pub fn with_window(mut self, window: usize) -> Self {
        self.window = window.max(1);
        self
    }
}

impl Publisher for JetStreamPublisher {
    async fn publish(&self, messages: Vec<Message>) -> Vec<Result<(), PublishError>> {
        let mut results = Vec::with_capacity(messages.len());
        let mut messages = messages.into_iter().peekable();
        while messages.peek().is_some() {
            let mut pending: Vec<Result<PublishAckFuture, PublishError>> =
                Vec::with_capacity(self.window);
            for message in messages.by_ref().take(self.window) {
                let mut headers = message.headers;
                headers.insert(
                    async_nats::header::NATS_MESSAGE_ID,
                    message.id.to_string().as_str(),
                );
                let publish = jetstream::message::PublishMessage::build()
                    .headers(headers)
                    .payload(message.payload);
                pending.push(
                    self.context
                        .send_publish(message.subject, publish)
                        .await
                        .map_err(|e| PublishError::NotAccepted(Box::new(e))),
                );
            }
            for sent in pending {
                results.push(match sent {
                    Ok(ack) => ack.await.map(drop).map_err(classify_ack_error),
                    Err(e) => Err(e),
                });
            }
        }
        results
    }
}

/// A missing ack means the outcome is unknown; anything else means the broker refused.
fn classify_ack_error(error: jetstream::context::PublishError) -> PublishError {
    use jetstream::context::PublishErrorKind;
    match error.kind() {
        PublishErrorKind::TimedOut => PublishError::NoAck(Box::new(error)),
        _ => PublishError::NotAccepted(Box::new(error)),
    }
}

/// What the stream must look like.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    /// Stream name.
    pub name: String,
    /// Subjects it captures, e.g. `orders.>`.
    pub subjects: Vec<String>,
    /// The broker drops a message whose `Nats-Msg-Id` it saw within this window.
    pub duplicate_window: Duration,
    /// Number of replicas in a cluster.
    pub replicas: usize,
}

/// Creates the stream, or updates it to `spec`, with file storage.
pub async fn ensure_stream(
    context: &jetstream::Context,
    spec: &StreamSpec,
) -> Result<stream::Info, Error> {
    let config = stream::Config {
        name: spec.name.clone(),
        subjects: spec.subjects.clone(),
        storage: stream::StorageType::File,
        duplicate_window: spec.duplicate_window,
        num_replicas: spec.replicas,
        ..Default::default()
    };
    let info = context.create_or_update_stream(config).await.map_err(|e| {
        Error::Stream(
            format!("creating or updating stream {}", spec.name),
            e.into(),
        )
    })?;
    // A shorter window would let a re-published event through as a second message.
    if info.config.duplicate_window < spec.duplicate_window {
        let reason = format!(
            "stream {} keeps a duplicate window of {:?}, shorter than the configured {:?}",
            spec.name, info.config.duplicate_window, spec.duplicate_window
        );
        return Err(Error::Stream(reason.clone(), reason.into()));
    }
    Ok(info)
}
