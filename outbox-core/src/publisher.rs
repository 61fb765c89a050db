//! Publishing to JetStream: the [`Publisher`] trait the relay uses, its JetStream
//! implementation, and the stream set-up.

use std::future::Future;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishAckFuture, stream};
use bytes::Bytes;
use uuid::Uuid;

use crate::{PublishError, StreamError};

/// One message ready for the broker.
#[derive(Debug, Clone)]
#[non_exhaustive]
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

impl Message {
    /// A message with these parts, for a [`Publisher`] of one's own to be tested with (the
    /// relay makes its messages from outbox rows).
    pub fn new(id: Uuid, subject: impl Into<String>, headers: HeaderMap, payload: Bytes) -> Self {
        Self {
            id,
            subject: subject.into(),
            headers,
            payload,
        }
    }
}

/// The broker's acknowledgement of one message: where the stream stored it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ack {
    /// The stream sequence of the message: for a duplicate, that of the copy stored first.
    pub stream_seq: u64,
    /// The broker had stored a message of this id within its duplicate window and dropped
    /// this one.
    pub duplicate: bool,
}

impl Ack {
    /// The acknowledgement of a message stored at `stream_seq`.
    pub fn new(stream_seq: u64, duplicate: bool) -> Self {
        Self {
            stream_seq,
            duplicate,
        }
    }
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
    ) -> impl Future<Output = Vec<Result<Ack, PublishError>>> + Send;

    /// Whether the broker answers now, when the publisher can tell without publishing
    /// (`None`: it cannot). The relay asks while it believes the broker unreachable and has
    /// nothing to publish, so that it notices the broker is back without an event to send.
    fn reachable(&self) -> impl Future<Output = Option<bool>> + Send {
        std::future::ready(None)
    }

    /// Where the stream holds `message`, if it does: asked before publishing again an event
    /// whose earlier publish may have been stored unacknowledged
    /// ([`PublishError::may_be_stored`]), since the broker's duplicate window may not drop the
    /// copy (the window passed, or the broker never noted the id). The relay publishes only
    /// one event per aggregate at a time, so the newest message on the event's subject is it,
    /// if anything is. `Ok(None)`: not stored, or the publisher cannot tell; the message is
    /// published again.
    fn stored(
        &self,
        message: &Message,
    ) -> impl Future<Output = Result<Option<Ack>, PublishError>> + Send {
        let _ = message;
        std::future::ready(Ok(None))
    }
}

/// Publishes to JetStream with pipelined acknowledgements.
///
/// Messages are sent in windows; the acknowledgements of a window are awaited together, so a
/// window takes at most about two publish timeouts (sending, then acknowledgements) however
/// many messages it holds. While the client is disconnected, publishes fail at once instead of
/// piling up in the client's buffer.
#[derive(Debug, Clone)]
pub struct JetStreamPublisher {
    context: jetstream::Context,
    window: usize,
    timeout: Duration,
}

impl JetStreamPublisher {
    /// Largest number of publishes sent before their acknowledgements are awaited; stays below
    /// async-nats' default limit of 5000 unacknowledged publishes.
    pub const DEFAULT_WINDOW: usize = 4096;

    /// A publisher over a JetStream context. Give the context the same timeout as
    /// [`JetStreamPublisher::with_timeout`] (default 5 s): it bounds each acknowledgement.
    pub fn new(context: jetstream::Context) -> Self {
        Self {
            context,
            window: Self::DEFAULT_WINDOW,
            timeout: Duration::from_secs(5),
        }
    }

    /// Sets how many publishes may await their acknowledgement at once.
    #[must_use]
    pub fn with_window(mut self, window: usize) -> Self {
        self.window = window.max(1);
        self
    }

    /// Sets the time allowed for sending one window.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sends one window and awaits its acknowledgements together.
    async fn publish_window(&self, window: Vec<Message>) -> Vec<Result<Ack, PublishError>> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut sent: Vec<Result<PublishAckFuture, PublishError>> =
            Vec::with_capacity(window.len());
        for message in window {
            let mut headers = message.headers;
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                async_nats::HeaderValue::from(message.id.to_string()),
            );
            let publish = jetstream::message::PublishMessage::build()
                .headers(headers)
                .payload(message.payload);
            let sending = self.context.send_publish(message.subject, publish);
            sent.push(match tokio::time::timeout_at(deadline, sending).await {
                Ok(Ok(ack)) => Ok(ack),
                Ok(Err(error)) => Err(classify_send_error(error)),
                Err(_) => Err(PublishError::Unreachable(
                    "publish timeout before sending".into(),
                )),
            });
        }
        futures::future::join_all(sent.into_iter().map(|sent| async move {
            match sent {
                Ok(ack) => ack
                    .await
                    .map(|ack| Ack::new(ack.sequence, ack.duplicate))
                    .map_err(classify_ack_error),
                Err(error) => Err(error),
            }
        }))
        .await
    }
}

impl Publisher for JetStreamPublisher {
    async fn publish(&self, messages: Vec<Message>) -> Vec<Result<Ack, PublishError>> {
        if self.context.client().connection_state() != async_nats::connection::State::Connected {
            return messages
                .iter()
                .map(|_| Err(PublishError::Unreachable("not connected to NATS".into())))
                .collect();
        }
        let mut results = Vec::with_capacity(messages.len());
        let mut messages = messages.into_iter().peekable();
        while messages.peek().is_some() {
            let window: Vec<Message> = messages.by_ref().take(self.window).collect();
            results.extend(self.publish_window(window).await);
        }
        results
    }

    /// The newest message on the subject, through the stream that captures it.
    async fn stored(&self, message: &Message) -> Result<Option<Ack>, PublishError> {
        let unreachable =
            |error: Box<dyn std::error::Error + Send + Sync>| PublishError::Unreachable(error);
        let stream = self
            .context
            .stream_by_subject(message.subject.as_str())
            .await;
        let name = match stream {
            Ok(name) => name,
            // No stream captures the subject: nothing is stored.
            Err(error)
                if matches!(
                    error.kind(),
                    jetstream::context::GetStreamByNameErrorKind::NotFound
                ) =>
            {
                return Ok(None);
            }
            Err(error) => return Err(unreachable(Box::new(error))),
        };
        let stream = self
            .context
            .get_stream_no_info(&name)
            .await
            .map_err(|error| unreachable(Box::new(error)))?;
        match stream
            .get_last_raw_message_by_subject(&message.subject)
            .await
        {
            Ok(newest) => {
                let id = newest.headers.get(async_nats::header::NATS_MESSAGE_ID);
                let ours = id.is_some_and(|id| id.as_str() == message.id.to_string());
                Ok(ours.then(|| Ack::new(newest.sequence, true)))
            }
            Err(error)
                if error.kind() == jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
            {
                Ok(None)
            }
            Err(error) => Err(unreachable(Box::new(error))),
        }
    }

    /// JetStream answers its account-info request (bounded by the context's timeout). Read as
    /// plain JSON: async-nats' typed account info does not parse from every server version.
    async fn reachable(&self) -> Option<bool> {
        let answer: Result<serde_json::Value, _> =
            self.context.request("INFO", &serde_json::json!({})).await;
        Some(answer.is_ok_and(|answer| answer.get("error").is_none()))
    }
}

/// A message too large for the server, or a subject the client will not send, is refused for
/// good; anything else that stops a send (the connection's queue closed, too many acks
/// outstanding) passes with the connection.
fn classify_send_error(error: jetstream::context::PublishError) -> PublishError {
    use jetstream::context::PublishErrorKind;
    let bad_subject = std::error::Error::source(&error)
        .is_some_and(<dyn std::error::Error>::is::<async_nats::SubjectError>);
    match error.kind() {
        PublishErrorKind::MaxPayloadExceeded => PublishError::NotAccepted(Box::new(error)),
        _ if bad_subject => PublishError::NotAccepted(Box::new(error)),
        _ => PublishError::Unreachable(Box::new(error)),
    }
}

/// JetStream's answers that the account or the server has no room; a stream that discards new
/// messages and is at its limits answers 10077 ("store failed") with the limit it met.
const STORAGE_FULL_CODES: [u64; 4] = [
    10002, // resource limits exceeded for account
    10023, // insufficient resources
    10028, // insufficient memory resources available
    10047, // insufficient storage resources available
];

/// No ack in time, or the connection lost while waiting: the outcome is unknown. No responders
/// (in a cluster, a stream between two leaders; the stream deleted) or the server's 503
/// (JetStream or its cluster not available now): nothing was stored, and it passes. No room in
/// the stream or the account: nothing was stored, and it passes once room is made. Anything
/// else is the broker refusing the message (the stream rejected it).
fn classify_ack_error(error: jetstream::context::PublishError) -> PublishError {
    use jetstream::context::PublishErrorKind;
    let answer = std::error::Error::source(&error)
        .and_then(|source| source.downcast_ref::<jetstream::Error>());
    let unavailable = answer.is_some_and(|answer| answer.code() == 503);
    let full = answer.is_some_and(|answer| {
        STORAGE_FULL_CODES.contains(&answer.error_code().0)
            || answer.error_code().0 == 10077
                && ["maximum bytes exceeded", "maximum messages exceeded"]
                    .iter()
                    .any(|limit| answer.to_string().contains(limit))
    });
    match error.kind() {
        PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
            PublishError::NoAck(Box::new(error))
        }
        PublishErrorKind::StreamNotFound => PublishError::StreamNotFound(Box::new(error)),
        // A full stream may answer 503 too.
        _ if full => PublishError::StorageFull(Box::new(error)),
        _ if unavailable => PublishError::Unreachable(Box::new(error)),
        _ => PublishError::NotAccepted(Box::new(error)),
    }
}

/// What the stream must look like.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StreamSpec {
    /// Stream name.
    pub name: String,
    /// Subjects it captures, e.g. `orders.>`.
    pub subjects: Vec<String>,
    /// The broker drops a message whose `Nats-Msg-Id` it saw within this window.
    pub duplicate_window: Duration,
    /// Number of replicas in a cluster.
    pub replicas: usize,
    /// The stream removes a message stored longer ago than this (zero: never). Keep it at least
    /// the consumers' inbox retention: a consumer down for less than that finds every message
    /// it missed, and one older is not applied anyway.
    pub max_age: Duration,
    /// The stream removes its oldest messages beyond this many bytes (`None`: no limit).
    pub max_bytes: Option<u64>,
}

impl StreamSpec {
    /// The stream `name` capturing `subjects`, one replica, a duplicate window of two minutes
    /// (JetStream's default), messages kept seven days (match it to the consumers' inbox
    /// retention) with no limit of bytes.
    pub fn new(name: impl Into<String>, subjects: Vec<String>) -> Self {
        Self {
            name: name.into(),
            subjects,
            duplicate_window: Duration::from_secs(120),
            replicas: 1,
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_bytes: None,
        }
    }

    /// The stream's configuration: file storage, the limits above.
    pub(crate) fn config(&self) -> stream::Config {
        stream::Config {
            name: self.name.clone(),
            subjects: self.subjects.clone(),
            storage: stream::StorageType::File,
            duplicate_window: self.duplicate_window,
            num_replicas: self.replicas,
            max_age: self.max_age,
            max_bytes: self
                .max_bytes
                .map_or(-1, |bytes| i64::try_from(bytes).unwrap_or(i64::MAX)),
            ..Default::default()
        }
    }
}

/// Creates the stream, or updates it to `spec`, with file storage.
pub async fn ensure_stream(
    context: &jetstream::Context,
    spec: &StreamSpec,
) -> Result<stream::Info, StreamError> {
    let info = context
        .create_or_update_stream(spec.config())
        .await
        .map_err(|e| StreamError::Create {
            stream: spec.name.clone(),
            source: e.into(),
        })?;
    // A shorter window would let a re-published event through as a second message.
    if info.config.duplicate_window < spec.duplicate_window {
        return Err(StreamError::DuplicateWindow {
            stream: spec.name.clone(),
            kept: info.config.duplicate_window,
            wanted: spec.duplicate_window,
        });
    }
    Ok(info)
}
