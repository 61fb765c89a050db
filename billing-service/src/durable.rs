//! The durable consumer billing pulls from, kept usable when the broker loses state: a consumer
//! deleted (by an operator, or with its stream) is made again, and so is one whose stream lost
//! messages it had delivered (a crash before JetStream's lazy fsync, a store restored from a
//! copy), from where the stream still holds what billing received. Nothing needs a restart.
//!
//! Between checks billing remembers the newest message it received and, about once a second,
//! one more (a ring of positions), with the consumer's acknowledgement floor at the last check.
//! A stream that loses messages loses its newest ones, so the newest remembered position whose
//! message is still there vouches for every one before it. The consumer is made again to
//! deliver from just after the lower of that position and the acknowledgement floor; whatever
//! it delivers again that was applied is a duplicate to the inbox.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use async_nats::jetstream::{self, ErrorCode};

use crate::config::ConsumerConfig;

/// How often the consumer and its stream are checked (and after every reconnect).
const EVERY: Duration = Duration::from_secs(5);
/// Most positions remembered, one a second at most.
const REMEMBERED: usize = 1024;

/// The durable consumer and what billing knows of it.
#[derive(Debug)]
pub struct Durable {
    jetstream: jetstream::Context,
    stream: String,
    subjects: String,
    config: ConsumerConfig,
    consumer: Mutex<PullConsumer>,
    /// When the current consumer was created.
    created: Mutex<chrono::DateTime<chrono::Utc>>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The client's connects at the last check.
    connects: u64,
    last_check: Option<Instant>,
    /// A pull failed: check before the next.
    suspect: bool,
    /// The stream's creation time (nanoseconds) at the last check.
    stream_created: Option<i128>,
    /// The consumer's acknowledgement floor at the last check.
    ack_floor: u64,
    /// Positions received, the newest last: (stream sequence, `Nats-Msg-Id`).
    received: VecDeque<(u64, String)>,
    /// The newest position received, and when the last one was remembered.
    newest: Option<(u64, String)>,
    remembered_at: Option<Instant>,
}

/// Where a consumer made again starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// The whole stream.
    All,
    /// This stream sequence.
    At(u64),
}

impl Durable {
    /// Creates the durable pull consumer, or updates it to `config` when it exists, keeping
    /// where it delivers from (one made again starts at a sequence). A changed
    /// `CONSUMER_ACK_WAIT_MS` takes effect at the next start; `subjects` is the stream's
    /// filter.
    pub async fn create(
        jetstream: jetstream::Context,
        stream: &str,
        subjects: String,
        config: &ConsumerConfig,
    ) -> anyhow::Result<Self> {
        let handle = jetstream.get_stream(stream).await?;
        // The broker refuses to change a consumer's deliver policy, and one made again
        // starts where it must: keep it.
        let deliver_policy = match handle.consumer_info(&config.name).await {
            Ok(info) => info.config.deliver_policy,
            Err(error) if error.kind() == ConsumerInfoErrorKind::NotFound => DeliverPolicy::All,
            Err(error) => return Err(error.into()),
        };
        let consumer = handle
            .create_consumer(consumer_config(config, &subjects, deliver_policy))
            .await?;
        let state = State {
            connects: connects(&jetstream),
            stream_created: Some(handle.cached_info().created.unix_timestamp_nanos()),
            ..State::default()
        };
        let created = created_at(&consumer);
        Ok(Self {
            jetstream,
            stream: stream.to_owned(),
            subjects,
            config: config.clone(),
            consumer: Mutex::new(consumer),
            created: Mutex::new(created),
            state: Mutex::new(state),
        })
    }

    /// When the consumer pulled from now was created: what it delivers of messages stored
    /// before may have been delivered by the one it replaced.
    pub fn created(&self) -> chrono::DateTime<chrono::Utc> {
        *self.created.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The consumer to pull from now.
    pub fn current(&self) -> PullConsumer {
        self.consumer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Notes a message received at `stream_seq` with `Nats-Msg-Id` `id`.
    pub fn received(&self, stream_seq: u64, id: Option<&str>) {
        let Some(id) = id else { return };
        let mut state = self.state();
        state.newest = Some((stream_seq, id.to_owned()));
        if state
            .remembered_at
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
        {
            state.remembered_at = Some(Instant::now());
            if state.received.len() >= REMEMBERED {
                state.received.pop_front();
            }
            state.received.push_back((stream_seq, id.to_owned()));
        }
    }

    /// Notes that a pull failed: the next [`Durable::keep`] checks.
    pub fn suspect(&self) {
        self.state().suspect = true;
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks the consumer and its stream when due, and makes the consumer again when it is
    /// gone or its stream lost what it delivered; returns whether it did (pull from
    /// [`Durable::current`] anew). A check that cannot be made is tried again at the next call.
    pub async fn keep(&self) -> bool {
        let connects = connects(&self.jetstream);
        {
            let state = self.state();
            let due = state.suspect
                || state.connects != connects
                || state.last_check.is_none_or(|at| at.elapsed() >= EVERY);
            if !due {
                return false;
            }
        }
        match self.check(connects).await {
            Ok(None) => false,
            Ok(Some(start)) => match self.make_again(start).await {
                Ok(()) => true,
                Err(error) => {
                    tracing::warn!(error = %error, "cannot make the durable consumer again; retrying");
                    self.suspect();
                    false
                }
            },
            Err(error) => {
                tracing::warn!(error = %error, "cannot check the durable consumer; retrying");
                false
            }
        }
    }

    /// Where the consumer must start again, if it must.
    async fn check(&self, connects: u64) -> anyhow::Result<Option<Start>> {
        let stream = match self.jetstream.get_stream(&self.stream).await {
            Ok(stream) => stream,
            // Gone: orders-service makes it again; nothing to pull meanwhile.
            Err(error) if stream_not_found(&error) => {
                self.state().last_check = Some(Instant::now());
                return Ok(None);
            }
            Err(error) => return Err(error.into()),
        };
        let info = stream.cached_info().clone();
        let created = info.created.unix_timestamp_nanos();
        let (known_created, newest, ack_floor) = {
            let state = self.state();
            (state.stream_created, state.newest.clone(), state.ack_floor)
        };
        let lost_newest = match &newest {
            Some((seq, id)) => !holds(&stream, info.state.last_sequence, *seq, id).await?,
            None => false,
        };
        let start = if known_created.is_some_and(|known| known != created) {
            tracing::warn!(stream = %self.stream, "the stream was made again");
            Some(Start::All)
        } else if lost_newest {
            tracing::warn!(
                stream.seq = newest.map(|(seq, _)| seq),
                "the stream no longer holds a message it delivered: it lost messages"
            );
            Some(
                self.resume_point(&stream, info.state.last_sequence, ack_floor)
                    .await?,
            )
        } else {
            match stream.consumer_info(&self.config.name).await {
                Ok(consumer) => {
                    let floor = consumer.ack_floor.stream_sequence;
                    let delivered = consumer.delivered.stream_sequence;
                    if delivered > info.state.last_sequence {
                        tracing::warn!(
                            delivered,
                            last = info.state.last_sequence,
                            "the consumer is past the end of its stream: it lost messages"
                        );
                        Some(
                            self.resume_point(&stream, info.state.last_sequence, floor)
                                .await?,
                        )
                    } else {
                        self.state().ack_floor = floor;
                        None
                    }
                }
                Err(error)
                    if matches!(
                        error.kind(),
                        jetstream::context::ConsumerInfoErrorKind::NotFound
                    ) =>
                {
                    tracing::warn!(consumer = %self.config.name, "the durable consumer is gone");
                    Some(if ack_floor == 0 {
                        Start::All
                    } else {
                        Start::At(ack_floor + 1)
                    })
                }
                Err(error) => return Err(error.into()),
            }
        };
        let mut state = self.state();
        state.connects = connects;
        state.suspect = false;
        state.last_check = Some(Instant::now());
        state.stream_created = Some(created);
        Ok(start)
    }

    /// Just after the newest remembered position still held, or the acknowledgement floor
    /// when lower; the whole stream when no position holds.
    async fn resume_point(
        &self,
        stream: &Stream,
        last: u64,
        ack_floor: u64,
    ) -> anyhow::Result<Start> {
        let received: Vec<(u64, String)> = self.state().received.iter().rev().cloned().collect();
        for (seq, id) in received {
            if holds(stream, last, seq, &id).await? {
                return Ok(Start::At(seq.min(ack_floor) + 1));
            }
        }
        Ok(Start::All)
    }

    /// Deletes the consumer (if there is one) and creates it to start at `start`.
    async fn make_again(&self, start: Start) -> anyhow::Result<()> {
        let stream = self.jetstream.get_stream(&self.stream).await?;
        match stream.delete_consumer(&self.config.name).await {
            Ok(_) => {}
            Err(error) if consumer_not_found(&error) => {}
            Err(error) => return Err(error.into()),
        }
        let consumer = stream
            .create_consumer(consumer_config(&self.config, &self.subjects, start.into()))
            .await?;
        *self.created.lock().unwrap_or_else(PoisonError::into_inner) = created_at(&consumer);
        *self.consumer.lock().unwrap_or_else(PoisonError::into_inner) = consumer;
        let mut state = self.state();
        state.newest = None;
        state.received.clear();
        state.ack_floor = 0;
        metrics::counter!("billing_consumer_recreated_total").increment(1);
        tracing::warn!(
            consumer = %self.config.name, ?start,
            "durable consumer made again; what it delivers again that was applied is a duplicate"
        );
        Ok(())
    }
}

impl From<Start> for DeliverPolicy {
    fn from(start: Start) -> Self {
        match start {
            Start::All => DeliverPolicy::All,
            Start::At(start_sequence) => DeliverPolicy::ByStartSequence { start_sequence },
        }
    }
}

/// The consumer's settings, delivering by `deliver_policy`.
fn consumer_config(
    config: &ConsumerConfig,
    subjects: &str,
    deliver_policy: DeliverPolicy,
) -> pull::Config {
    pull::Config {
        durable_name: Some(config.name.clone()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: config.ack_wait,
        // Unlimited: the service decides when a message becomes a dead letter, so the
        // broker never drops one silently.
        max_deliver: -1,
        filter_subject: subjects.to_owned(),
        deliver_policy,
        ..Default::default()
    }
}

/// Whether `stream`, whose last sequence is `last`, still holds message `id` at `seq`.
async fn holds(stream: &Stream, last: u64, seq: u64, id: &str) -> anyhow::Result<bool> {
    if seq > last {
        return Ok(false);
    }
    match stream.get_raw_message(seq).await {
        Ok(message) => Ok(message
            .headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .is_some_and(|found| found.as_str() == id)),
        Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(false),
        Err(error) => Err(error.into()),
    }
}

/// When the broker created `consumer`.
fn created_at(consumer: &PullConsumer) -> chrono::DateTime<chrono::Utc> {
    let nanos = consumer.cached_info().created.unix_timestamp_nanos();
    chrono::DateTime::from_timestamp_nanos(i64::try_from(nanos).unwrap_or(i64::MAX))
}

fn connects(jetstream: &jetstream::Context) -> u64 {
    jetstream
        .client()
        .statistics()
        .connects
        .load(std::sync::atomic::Ordering::Relaxed)
}

fn stream_not_found(error: &jetstream::context::GetStreamError) -> bool {
    matches!(
        error.kind(),
        jetstream::context::GetStreamErrorKind::JetStream(answer)
            if answer.error_code() == ErrorCode::STREAM_NOT_FOUND
    )
}

fn consumer_not_found(error: &jetstream::stream::ConsumerError) -> bool {
    matches!(
        error.kind(),
        jetstream::stream::ConsumerErrorKind::JetStream(answer)
            if answer.error_code() == ErrorCode::CONSUMER_NOT_FOUND
    )
}
