//! The simplest consumer loop: one message at a time, applied by the caller's function (through
//! [`super::Inbox::process`]) and acknowledged as that function answers. billing-service's
//! consumer is the fast path, several messages per transaction; this one is where to start.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::PullConsumer};
use futures::StreamExt as _;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::Inbox;

/// Why [`consume`] stopped before `stop`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// The consumer's message stream could not be opened.
    #[error("cannot open the consumer's message stream")]
    Stream(#[from] jetstream::consumer::StreamError),
}

/// Hands each message of `consumer` to `apply`, with `inbox`, in turn until `stop` (or the
/// stream's end), and acknowledges it with the [`AckKind`] `apply` returns; after an error,
/// with a `Nak` that has it delivered again after `retry_after`. `apply` keeps what can never
/// be applied as a dead letter and acknowledges it ([`super::NewDeadLetter::of_message`]): a
/// message it fails on is delivered again and again. A lost acknowledgement only means a
/// redelivery, which the inbox recognises.
///
/// `apply` returns its future boxed (`|inbox, message| Box::pin(apply(inbox, message))`), as
/// [`super::Inbox::process`]'s effect does, so that the loop can run in a spawned task.
pub async fn consume<F, E>(
    consumer: &PullConsumer,
    inbox: &Inbox,
    stop: &CancellationToken,
    retry_after: Duration,
    mut apply: F,
) -> Result<(), ConsumeError>
where
    F: for<'a> FnMut(&'a Inbox, &'a jetstream::Message) -> BoxFuture<'a, Result<AckKind, E>>,
    E: std::fmt::Display,
{
    let mut messages = consumer.messages().await?;
    while let Some(message) = tokio::select! {
        message = messages.next() => message,
        () = stop.cancelled() => None,
    } {
        let message = match message {
            Ok(message) => message,
            // A missed heartbeat, say: the client recovers and the stream goes on.
            Err(error) => {
                tracing::warn!(%error, "pulling messages failed");
                continue;
            }
        };
        let ack = apply(inbox, &message).await.unwrap_or_else(|error| {
            tracing::warn!(%error, "applying a message failed; it is delivered again");
            AckKind::Nak(Some(retry_after))
        });
        if let Err(error) = message.ack_with(ack).await {
            tracing::warn!(%error, "acknowledging a message failed");
        }
    }
    Ok(())
}
