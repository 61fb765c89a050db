//! The JetStream consumer: pulls messages, hands them to the rules in as few transactions as
//! keep up, and acknowledges each after its transaction committed.
//!
//! What it does with each message, rule by rule and in order, is written once, in
//! `docs/messages.md` ("What billing does with each message"): [`crate::parse`] reads a message
//! (its headers and body), [`crate::age`] judges whether it is too old to deduplicate,
//! [`Rules`] applies what can be applied through the inbox, and `Consumer::settle` acknowledges
//! each as its verdict says. `work` holds the transactions in flight.

mod work;

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind};
use futures::StreamExt as _;
use jetstream_outbox::headers;
use jetstream_outbox::inbox::NewDeadLetter;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::age;
use crate::config::ConsumerConfig;
use crate::durable::Durable;
use crate::parse::header;
use crate::quarantine::Sweep;
use crate::reason::DeadReason;
pub use crate::rules::{Applicable, Rules, Verdict};
use work::{InHand, Work};

/// The consumer loop of billing-service.
#[derive(Debug)]
pub struct Consumer {
    durable: Durable,
    rules: Rules,
    config: ConsumerConfig,
    /// How long the inbox remembers a message: an older one could be a copy of a message whose
    /// record is gone, so it is not applied.
    inbox_retention: Duration,
    /// The stream's duplicate window: a copy of a message is stored at least this long after
    /// the first one.
    duplicate_window: Duration,
    /// Finds the messages this consumer is delivered but the client cannot read.
    sweep: Sweep,
}

impl Consumer {
    /// A consumer applying `rules`, to messages younger than `inbox_retention`; `sweep` looks
    /// for the messages it is delivered and cannot read.
    pub fn new(
        durable: Durable,
        rules: Rules,
        config: ConsumerConfig,
        inbox_retention: Duration,
        duplicate_window: Duration,
        sweep: Sweep,
    ) -> Self {
        Self {
            durable,
            rules,
            config,
            inbox_retention,
            duplicate_window,
            sweep,
        }
    }

    /// Why `message` is too old for the inbox to deduplicate, if it is: see [`crate::age`].
    fn too_old(&self, message: &jetstream::Message, headers: &HeaderMap) -> Option<String> {
        let time_of = |name: &str| {
            header(headers, name)
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.to_utc())
        };
        let info = message.info().ok()?;
        let delivery = age::Delivery {
            stored: chrono::DateTime::from_timestamp_nanos(
                i64::try_from(info.published.unix_timestamp_nanos()).unwrap_or(i64::MAX),
            ),
            delivered: info.delivered,
            first_published: time_of(headers::FIRST_PUBLISHED),
            made: time_of(headers::TIME),
            consumer_created: self.durable.created(),
        };
        age::too_old(
            &delivery,
            chrono::Utc::now(),
            self.inbox_retention,
            self.duplicate_window,
        )
    }

    /// Handles messages until `shutdown` is cancelled; messages in hand are finished first.
    ///
    /// The [`Batcher`](crate::batcher::Batcher) decides which messages each transaction
    /// applies: as few transactions as keep up, and one order's messages (by `ce-subject`) one
    /// after another in the order they arrive, while different orders' transactions may commit
    /// side by side.
    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(consumer = %self.config.name, "consumer started");
        let consumer = Arc::new(self);
        let sweep = tokio::spawn(consumer.sweep.clone().run(shutdown.clone()));
        let mut work = Work::new(consumer.clone());
        consumer.pull(&mut work, &shutdown).await;
        work.finish().await;
        let _ = sweep.await;
        tracing::info!("consumer stopped");
    }

    /// Pulls messages into `work` until `shutdown` is cancelled.
    async fn pull(&self, work: &mut Work, shutdown: &CancellationToken) {
        while !shutdown.is_cancelled() {
            if self.durable.keep().await {
                tracing::info!("pulling from the durable consumer made again");
            }
            let messages = self
                .durable
                .current()
                .stream()
                .max_messages_per_batch(self.config.batch)
                .expires(Duration::from_secs(5))
                .messages()
                .await;
            let mut messages = match messages {
                Ok(messages) => messages,
                Err(error) => {
                    tracing::warn!(error = %error, "cannot pull messages; retrying");
                    self.durable.suspect();
                    self.sweep.nudge();
                    let pause = tokio::time::sleep(Duration::from_secs(1));
                    tokio::pin!(pause);
                    loop {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            () = &mut pause => break,
                            Some(joined) = work.running.join_next_with_id() => work.finished(joined),
                        }
                    }
                    continue;
                }
            };
            let mut check = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    Some(joined) = work.running.join_next_with_id() => work.finished(joined),
                    // Without room the pull waits: few messages are held unacknowledged.
                    next = messages.next(), if work.batcher.has_room() => match next {
                        Some(Ok(message)) => {
                            if let Ok(info) = message.info() {
                                self.sweep.received(info.stream_sequence);
                                let id = message.headers.as_ref().and_then(|headers| {
                                    header(headers, async_nats::header::NATS_MESSAGE_ID.as_ref())
                                });
                                self.durable.received(info.stream_sequence, id);
                            }
                            work.add(message);
                        }
                        Some(Err(error)) => {
                            // Perhaps a message the client could not read cut the connection.
                            tracing::warn!(error = %error, "pull failed");
                            self.durable.suspect();
                            self.sweep.nudge();
                        }
                        None => break,
                    },
                    // The consumer made again: pull from the new one.
                    _ = check.tick() => if self.durable.keep().await {
                        break;
                    },
                }
            }
        }
    }

    /// Decides, applies (those that apply, in one transaction) and acknowledges a batch of
    /// messages, in their order.
    async fn handle(&self, messages: Vec<jetstream::Message>) {
        let in_hand: Vec<InHand> = messages.into_iter().map(InHand::new).collect();
        let mut verdicts: Vec<Option<Verdict>> = Vec::with_capacity(in_hand.len());
        let mut applicable = Vec::new();
        for (i, message) in in_hand.iter().enumerate() {
            let mut prepared = Rules::prepare(&message.headers, &message.message.payload);
            if let Ok(applicable) = &prepared
                && let Some(reason) = self.too_old(&message.message, &message.headers)
            {
                prepared = Err(self.too_old_verdict(applicable, reason).await);
            }
            match prepared {
                Ok(change) => {
                    applicable.push((i, change));
                    verdicts.push(None);
                }
                Err(verdict) => verdicts.push(Some(verdict)),
            }
        }
        let spans: Vec<tracing::Span> = in_hand.iter().map(|m| m.span.clone()).collect();
        for (i, verdict) in self.rules.apply_all(applicable, &spans).await {
            verdicts[i] = Some(verdict);
        }
        for (message, verdict) in in_hand.into_iter().zip(verdicts) {
            let verdict = verdict.unwrap_or_else(|| Verdict::Retry("not decided".into()));
            self.settle(message, verdict).await;
        }
    }

    /// The verdict on a message too old to deduplicate: a duplicate when its record is still
    /// there (the inbox keeps records at least the retention, often longer), else a dead
    /// letter rather than a risk of applying it twice.
    async fn too_old_verdict(&self, applicable: &Applicable, reason: String) -> Verdict {
        match self
            .rules
            .inbox()
            .is_recorded(applicable.id(), applicable.digest())
            .await
        {
            Ok(true) => {
                tracing::info!(
                    "a copy older than the inbox retention, still recorded: a duplicate"
                );
                Verdict::Ack
            }
            Ok(false) => Verdict::Dead(DeadReason::TooOld(reason)),
            Err(error) => {
                tracing::warn!(error = ?error, "cannot look the message up; delivered again later");
                Verdict::Failed { reached: true }
            }
        }
    }

    /// Keeps a dead message as a dead letter, then acknowledges the message as `verdict` says.
    async fn settle(&self, in_hand: InHand, verdict: Verdict) {
        let InHand {
            message,
            span,
            started,
            ..
        } = in_hand;
        let ack = match verdict {
            Verdict::Ack => {
                if let Ok(info) = message.info() {
                    let stored = info.published.unix_timestamp_nanos();
                    let now = i128::from(chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0));
                    metrics::histogram!("billing_publish_to_apply_seconds")
                        .record(((now - stored) as f64 / 1e9).max(0.0));
                }
                AckKind::Ack
            }
            Verdict::Retry(_) | Verdict::Failed { .. } => {
                AckKind::Nak(Some(self.config.retry_delay))
            }
            Verdict::Dead(reason) => {
                let (class, reason) = (reason.class(), reason.to_string());
                let letter = NewDeadLetter::of_message(&message, &reason).with_error_class(class);
                match self
                    .rules
                    .inbox()
                    .dead_letter(letter)
                    .instrument(span.clone())
                    .await
                {
                    Ok(id) => {
                        span.in_scope(|| {
                            tracing::error!(dead_letter.id = id, reason, "message dead-lettered");
                        });
                        AckKind::Term
                    }
                    Err(error) => {
                        span.in_scope(|| {
                            tracing::warn!(error = ?error, "cannot store dead letter; retrying");
                        });
                        AckKind::Nak(Some(self.config.retry_delay))
                    }
                }
            }
        };
        metrics::histogram!("billing_message_handling_seconds")
            .record(started.elapsed().as_secs_f64());
        // A lost ack only means a redelivery, which the inbox absorbs.
        if let Err(error) = message.ack_with(ack).await {
            span.in_scope(|| tracing::warn!(error = %error, "acknowledgement failed"));
        }
    }
}
