//! The simplest consumer loop: one message at a time, applied by the caller's function (through
//! [`super::Inbox::process`]) and acknowledged as that function answers. billing-service's
//! consumer is the fast path, several messages per transaction; this one is where to start.

use std::error::Error as StdError;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::PullConsumer, consumer::pull};
use futures::StreamExt as _;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::Inbox;
use crate::error::chain;
use crate::headers;

/// How [`consume`] pulls and retries: [`ConsumeConfig::default`], then the fields to change.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConsumeConfig {
    /// After `apply` failed: how long the message waits before it is delivered again (its
    /// `Nak` delay), and how long the loop pauses before the next one, so that an outage is
    /// not a burst of failures. Default 1 s.
    pub retry_after: Duration,
    /// How many messages each pull asks for (at least 1, at most the consumer's `max_batch`).
    /// async-nats pulls again when half of them are left, so up to 1.5 times as many wait
    /// behind the one being applied. A message's ack wait runs from when the broker sent it:
    /// what they take (`apply`, and `retry_after` after each failure) must stay well inside the
    /// consumer's ack wait (30 s by default), or messages waiting their turn are delivered
    /// again (which the inbox absorbs). Default 16.
    pub pull_ahead: usize,
}

impl Default for ConsumeConfig {
    fn default() -> Self {
        Self {
            retry_after: Duration::from_secs(1),
            pull_ahead: 16,
        }
    }
}

/// The idle heartbeat asked of the broker with each pull.
const HEARTBEAT: Duration = Duration::from_secs(15);

/// Why [`consume`] stopped before `stop`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// The consumer's message stream could not be opened.
    #[error("cannot open the consumer's message stream")]
    Stream(#[from] jetstream::consumer::StreamError),
    /// The message stream ended, with the last pull error when there was one: the broker
    /// answered a waiting pull that the consumer is gone or refused the pull's size, or the
    /// client closed. Nothing more arrives until the loop is started again. (A consumer
    /// deleted while the client was disconnected shows as pull errors, logged, instead.)
    #[error("the consumer's message stream ended")]
    Ended(#[source] Option<pull::MessagesError>),
}

/// Hands each message of `consumer` to `apply`, with `inbox`, in turn until `stop`, and
/// acknowledges it with the [`AckKind`] `apply` returns: `Ack` once applied, or kept as a dead
/// letter when it can never be ([`super::NewDeadLetter::of_message`]); `Nak` to have it
/// delivered again; `Term` to drop it (`Progress` would leave it unacknowledged until its ack
/// wait ran out). After an error it is delivered again after [`ConsumeConfig::retry_after`],
/// and the error is logged with its causes. A lost acknowledgement only means a redelivery,
/// which the inbox recognises. `stop` is seen between messages; those pulled ahead and not
/// yet applied come to another consumer instance after their ack wait.
///
/// `apply` returns its future boxed (`|inbox, message| Box::pin(apply(inbox, message))`), as
/// [`super::Inbox::process`]'s effect does: the future borrows the message and the inbox, and
/// a boxed `Send` future says so in a way that lets the loop run in a spawned task.
pub async fn consume<F, E>(
    consumer: &PullConsumer,
    inbox: &Inbox,
    stop: &CancellationToken,
    config: &ConsumeConfig,
    mut apply: F,
) -> Result<(), ConsumeError>
where
    F: for<'a> FnMut(&'a Inbox, &'a jetstream::Message) -> BoxFuture<'a, Result<AckKind, E>>,
    E: Into<Box<dyn StdError + Send + Sync>>,
{
    let max_batch = usize::try_from(consumer.cached_info().config.max_batch).unwrap_or(0);
    let batch = match max_batch {
        0 => config.pull_ahead.max(1),
        max => config.pull_ahead.clamp(1, max),
    };
    // async-nats's own default heartbeat, so that a stalled pull is noticed.
    let messages = consumer.stream().max_messages_per_batch(batch);
    let mut messages = messages.heartbeat(HEARTBEAT).messages().await?;
    let mut last_error = None;
    loop {
        let message = tokio::select! {
            biased;
            () = stop.cancelled() => return Ok(()),
            message = messages.next() => message,
        };
        let message = match message {
            Some(Ok(message)) => {
                last_error = None;
                message
            }
            // A missed heartbeat, say: the client recovers and the stream goes on, unless the
            // broker ends it.
            Some(Err(error)) => {
                tracing::warn!(error = %chain(&error), "pulling messages failed");
                last_error = Some(error);
                continue;
            }
            None => return Err(ConsumeError::Ended(last_error)),
        };
        let header = |name| {
            let value = message.headers.as_ref()?.get(name)?;
            Some(value.as_str())
        };
        // The producer's trace context, so that the message's logs can be found from its trace.
        let span = tracing::info_span!(
            "message",
            messaging.destination.name = %message.subject,
            messaging.message.id = header(headers::ID),
            traceparent = header(headers::TRACEPARENT),
            deliveries = message.info().map_or(0, |info| info.delivered),
        );
        let applied = apply(inbox, &message).instrument(span.clone()).await;
        let failed = applied.is_err();
        let ack = applied.unwrap_or_else(|error| {
            let error = error.into();
            span.in_scope(|| {
                tracing::warn!(error = %chain(&*error), "applying a message failed; delivered again");
            });
            AckKind::Nak(Some(config.retry_after))
        });
        if let Err(error) = message.ack_with(ack).await {
            span.in_scope(
                || tracing::warn!(error = %chain(&*error), "acknowledging a message failed"),
            );
        }
        if failed {
            tokio::select! {
                biased;
                () = stop.cancelled() => return Ok(()),
                () = tokio::time::sleep(config.retry_after) => {}
            }
        }
    }
}
