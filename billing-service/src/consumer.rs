//! The JetStream consumer: each message through the inbox, acknowledged after commit.
//!
//! What it does with each message, rule by rule and in order, is written once, in
//! `docs/messages.md` ("What billing does with each message"): `Rules::prepare` reads a message
//! (its headers and body), [`crate::age`] judges whether it is too old to deduplicate,
//! `Rules::apply_all` applies what can be applied in one transaction, and `Consumer::settle`
//! acknowledges each as its verdict says.

use std::collections::HashMap;
use std::hash::{BuildHasher as _, RandomState};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind};
use futures::StreamExt as _;
use jetstream_outbox::headers;
use jetstream_outbox::inbox::{self, Digest, NewDeadLetter};
use jetstream_outbox::{BatchError, Inbox, InboxError, Outcome};
use serde::Deserialize;
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::age;
use crate::batcher::{Batcher, Key};
use crate::config::ConsumerConfig;
use crate::durable::Durable;
use crate::invoices::{self, ApplyError, Change};
use crate::quarantine::Sweep;

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

/// What to do with a message, decided (and applied) by [`Rules::verdict`].
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Applied now or before: acknowledge.
    Ack,
    /// Not applicable yet, or a transient failure: deliver again later.
    Retry(String),
    /// Can never be applied as it is: keep as a dead letter.
    Dead(String),
}

/// How billing treats one message: the rules in the module documentation.
#[derive(Debug, Clone)]
pub struct Rules {
    inbox: Inbox,
    max_retries: i64,
    not_yet: Arc<Mutex<HashMap<String, i64>>>,
}

/// Messages whose not-yet outcomes are counted at once; past this the counts start over (a
/// message then waits longer before it is dead, never less long).
const NOT_YET_TRACKED: usize = 100_000;

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
    /// [`Batcher`] decides which messages each transaction applies: as few transactions as
    /// keep up, and one order's messages (by `ce-subject`) one after another in the order they
    /// arrive, while different orders' transactions may commit side by side.
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
            let prepared = match self.too_old(&message.message, &message.headers) {
                Some(reason) => Err(Verdict::Dead(reason)),
                None => Rules::prepare(&message.headers, &message.message.payload),
            };
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

    /// Keeps a dead message as a dead letter, then acknowledges the message as `verdict` says.
    async fn settle(&self, in_hand: InHand, verdict: Verdict) {
        let InHand {
            message,
            span,
            started,
            ..
        } = in_hand;
        let ack = match verdict {
            Verdict::Ack => AckKind::Ack,
            Verdict::Retry(_) => AckKind::Nak(Some(self.config.retry_delay)),
            Verdict::Dead(reason) => {
                let letter = NewDeadLetter::of_message(&message, &reason);
                match self
                    .rules
                    .inbox
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

/// The consumer's transactions: those running, and the messages waiting for one.
struct Work {
    consumer: Arc<Consumer>,
    batcher: Batcher<jetstream::Message>,
    running: JoinSet<()>,
    /// The keys each running transaction holds.
    keys: HashMap<tokio::task::Id, Vec<Key>>,
    hasher: RandomState,
}

impl Work {
    fn new(consumer: Arc<Consumer>) -> Self {
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
    fn add(&mut self, message: jetstream::Message) {
        let order = message
            .headers
            .as_ref()
            .and_then(|h| header(h, headers::SUBJECT));
        self.batcher.push(self.hasher.hash_one(order), message);
        self.start();
    }

    /// Starts every transaction the batcher allows now.
    fn start(&mut self) {
        while let Some(batch) = self.batcher.start() {
            let consumer = self.consumer.clone();
            let task = self
                .running
                .spawn(async move { consumer.handle(batch.messages).await });
            self.keys.insert(task.id(), batch.keys);
        }
    }

    /// Releases the keys of a transaction that ended, and starts what may start now.
    fn finished(&mut self, joined: Result<(tokio::task::Id, ()), JoinError>) {
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
    async fn finish(mut self) {
        while let Some(joined) = self.running.join_next_with_id().await {
            self.finished(joined);
        }
        debug_assert!(self.batcher.is_idle());
    }
}

/// A message being handled, with what is read of it once.
struct InHand {
    message: jetstream::Message,
    headers: HeaderMap,
    /// The message's span, continuing its producer's trace.
    span: tracing::Span,
    started: std::time::Instant,
}

impl InHand {
    fn new(message: jetstream::Message) -> Self {
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

/// A message billing can apply: its inbox key and content, and the change it asks for.
#[derive(Debug, Clone)]
pub struct Applicable {
    id: String,
    digest: Digest,
    change: Change,
}

impl Rules {
    /// Rules over `inbox`; `max_retries` bounds how often a message may be not applicable yet.
    pub fn new(inbox: Inbox, max_retries: i64) -> Self {
        Self {
            inbox,
            max_retries,
            not_yet: Arc::default(),
        }
    }

    /// Counts one more not-yet outcome of message `id`, and returns how many there were.
    fn not_yet_again(&self, id: &str) -> i64 {
        let mut counts = self.not_yet.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.len() >= NOT_YET_TRACKED && !counts.contains_key(id) {
            counts.clear();
        }
        let count = counts.entry(id.to_owned()).or_default();
        *count += 1;
        *count
    }

    /// Forgets the not-yet count of message `id`: it was applied or dead-lettered.
    fn settled(&self, id: &str) {
        self.not_yet
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// The inbox the rules apply messages through.
    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    /// Decides what to do with a message and, when it can, applies it through the inbox.
    pub async fn verdict(&self, headers: &HeaderMap, payload: &[u8]) -> Verdict {
        match Self::prepare(headers, payload) {
            Ok(applicable) => self.apply_one(applicable).await,
            Err(verdict) => verdict,
        }
    }

    /// The change a message asks for, or the verdict when none is to be applied: parsed and
    /// checked, its inbox key and digest taken.
    fn prepare(headers: &HeaderMap, payload: &[u8]) -> Result<Applicable, Verdict> {
        let change = match parse(headers, payload) {
            Ok(Some(change)) => change,
            Ok(None) => return Err(Verdict::Ack),
            Err(reason) => return Err(Verdict::Dead(reason)),
        };
        let (Some(id), Some(event_type)) =
            (header(headers, headers::ID), header(headers, headers::TYPE))
        else {
            return Err(Verdict::Dead("missing ce-id".into()));
        };
        // A copy has the same type and body; the subject names the same type and order.
        Ok(Applicable {
            id: id.to_owned(),
            digest: Digest::of(&[event_type.as_bytes(), payload]),
            change,
        })
    }

    /// Applies one message through the inbox.
    async fn apply_one(&self, applicable: Applicable) -> Verdict {
        let Applicable { id, digest, change } = applicable;
        let outcome = self
            .inbox
            .process(&id, &digest, move |conn| {
                Box::pin(async move {
                    let applied = invoices::apply(conn, &[(0, change)]).await;
                    applied.map(|_| ()).map_err(|(_, error)| error)
                })
            })
            .await;
        if matches!(outcome, Ok(Outcome::Processed(()))) {
            crate::failpoints::after_commit();
        }
        self.judge(&id, outcome)
    }

    /// Applies a batch's messages (numbered as `spans`) in one inbox transaction (their
    /// changes in a statement per run of one kind, see `invoices::apply`), and returns each
    /// one's verdict. A message whose effect fails is taken out: the ones before it
    /// are applied together, then it is judged on its own, then the ones after it go on
    /// together, so each order's order holds and it never fails its batch-mates.
    async fn apply_all(
        &self,
        batch: Vec<(usize, Applicable)>,
        spans: &[tracing::Span],
    ) -> Vec<(usize, Verdict)> {
        let mut verdicts = Vec::with_capacity(batch.len());
        let mut groups = std::collections::VecDeque::from([batch]);
        while let Some(mut group) = groups.pop_front() {
            if group.len() < 2 {
                for (i, applicable) in group {
                    let verdict = self
                        .apply_one(applicable)
                        .instrument(spans[i].clone())
                        .await;
                    verdicts.push((i, verdict));
                }
                continue;
            }
            let keys: Vec<(&str, Digest)> = group
                .iter()
                .map(|(_, a)| (a.id.as_str(), a.digest))
                .collect();
            let changes: Vec<Change> = group.iter().map(|(_, a)| a.change.clone()).collect();
            let outcome = self
                .inbox
                .process_batch_together(&keys, |conn, new| {
                    let changes: Vec<(usize, Change)> =
                        new.iter().map(|&i| (i, changes[i].clone())).collect();
                    Box::pin(async move { invoices::apply(conn, &changes).await })
                })
                .await;
            match outcome {
                Ok(outcomes) => {
                    if outcomes.iter().any(|o| matches!(o, Outcome::Processed(()))) {
                        crate::failpoints::after_commit();
                    }
                    for ((i, applicable), outcome) in group.into_iter().zip(outcomes) {
                        let verdict = spans[i].in_scope(|| self.judge(&applicable.id, Ok(outcome)));
                        verdicts.push((i, verdict));
                    }
                }
                Err(BatchError::Effect { index, error }) => {
                    let after = group.split_off(index + 1);
                    let failed = group.pop().into_iter().collect();
                    if let ApplyError::Database(_) = error {
                        // Laid at the first change of the statement that failed, not at the one
                        // at fault (`invoices::apply`): the rest goes one by one, so each is
                        // judged on its own error.
                        for single in after.into_iter().rev() {
                            groups.push_front(vec![single]);
                        }
                        groups.push_front(failed);
                        groups.push_front(group);
                    } else {
                        for part in [after, failed, group] {
                            groups.push_front(part);
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(error = ?error, "batch failed; applying its messages one by one");
                    for single in group.into_iter().rev() {
                        groups.push_front(vec![single]);
                    }
                }
            }
        }
        verdicts
    }

    /// The verdict on message `id` from what the inbox did with it.
    fn judge(&self, id: &str, outcome: Result<Outcome<()>, InboxError<ApplyError>>) -> Verdict {
        if !matches!(outcome, Err(InboxError::Effect(ApplyError::NotYet(_)))) {
            self.settled(id);
        }
        match outcome {
            Ok(Outcome::Processed(())) => {
                tracing::info!("message applied");
                Verdict::Ack
            }
            Ok(Outcome::Duplicate) => {
                tracing::info!("duplicate delivery ignored");
                Verdict::Ack
            }
            Ok(Outcome::IdReused) => Verdict::Dead(format!(
                "ce-id {id} was applied before for a message with another type or body: this \
                 one is not a copy, and applying or dropping it would both be wrong"
            )),
            Err(InboxError::Effect(ApplyError::NotYet(reason))) => {
                let attempts = self.not_yet_again(id);
                if attempts >= self.max_retries {
                    self.settled(id);
                    Verdict::Dead(format!("{reason} after {attempts} attempts"))
                } else {
                    tracing::info!(reason, "not applicable yet; delivered again later");
                    Verdict::Retry(reason)
                }
            }
            Err(error) => {
                if let Some(code) = permanent_sqlstate(&error) {
                    return Verdict::Dead(format!(
                        "the database refused the message for good (SQLSTATE {code}): {error}"
                    ));
                }
                tracing::warn!(error = ?error, "transient failure; delivered again later");
                Verdict::Retry("a transient failure; see the logs".into())
            }
        }
    }
}

/// The SQLSTATE of a database error that no retry can fix ([`inbox::refused_for_good`]).
fn permanent_sqlstate(error: &InboxError<ApplyError>) -> Option<String> {
    let (InboxError::Database(database) | InboxError::Effect(ApplyError::Database(database))) =
        error
    else {
        return None;
    };
    inbox::refused_for_good(database).map(std::borrow::Cow::into_owned)
}

/// The payload fields billing reads; other fields are ignored.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct OrderEvent {
    order_id: String,
    total_minor: i64,
}

/// Largest body billing reads; a larger one is dead-lettered unread.
const MAX_BODY: usize = 1024 * 1024;

/// The change a message asks for: `None` for event types billing does not handle.
fn parse(headers: &HeaderMap, payload: &[u8]) -> Result<Option<Change>, String> {
    // Two values of one of these would leave the message's identity or meaning ambiguous.
    for name in [headers::ID, headers::TYPE] {
        if headers.get_all(name).count() > 1 {
            return Err(format!("{name} appears more than once"));
        }
    }
    let Some(event_type) = header(headers, headers::TYPE) else {
        return Err("missing ce-type".into());
    };
    if !matches!(event_type, "OrderPlaced" | "OrderPaid") {
        return Ok(None);
    }
    // The inbox key: anything else (empty, oversized, a NUL byte) could not be told apart from
    // another message's id, or could not be stored at all.
    match header(headers, headers::ID) {
        None => return Err("missing ce-id".into()),
        Some(id) if !jetstream_outbox::event::is_valid_token(id) => {
            return Err(format!(
                "invalid ce-id of {} bytes: must be 1-128 of [A-Za-z0-9_:@-] (a UUID is)",
                id.len()
            ));
        }
        Some(_) => {}
    }
    if payload.len() > MAX_BODY {
        return Err(format!("body of {} bytes is over 1 MiB", payload.len()));
    }
    let event: OrderEvent = serde_json::from_slice(payload)
        .map_err(|e| format!("invalid {event_type} payload: {e}"))?;
    if !jetstream_outbox::event::is_valid_token(&event.order_id) {
        return Err(format!("invalid orderId in {event_type}"));
    }
    Ok(Some(match event_type {
        "OrderPlaced" if event.total_minor > 0 => Change::Open {
            order_id: event.order_id,
            total_minor: event.total_minor,
        },
        "OrderPlaced" => return Err("OrderPlaced with a non-positive totalMinor".into()),
        _ => Change::Pay {
            order_id: event.order_id,
        },
    }))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(async_nats::HeaderValue::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(event_type: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(headers::ID, "0193a0c4-7d1e-7c3b-9f1a-1b2c3d4e5f60");
        headers.insert(headers::TYPE, event_type);
        headers
    }

    /// The contract's body (`service_kit::events::OrderEvent`, what orders-service publishes
    /// and `/asyncapi.json` describes) is what billing reads: each event type it consumes
    /// becomes its change.
    #[test]
    fn the_contracts_events_are_understood() {
        let event = service_kit::events::OrderEvent {
            order_id: "o-1".into(),
            customer: "ada".into(),
            total_minor: 1999,
            status: service_kit::events::EventStatus::Placed,
        };
        let body = serde_json::to_vec(&event).unwrap();
        assert_eq!(
            parse(&headers("OrderPlaced"), &body).unwrap(),
            Some(Change::Open {
                order_id: "o-1".into(),
                total_minor: 1999
            })
        );
        assert!(matches!(
            parse(&headers("OrderPaid"), &body).unwrap(),
            Some(Change::Pay { .. })
        ));
        assert_eq!(parse(&headers("OrderShipped"), &body).unwrap(), None);
    }

    proptest::proptest! {
        /// Whatever the bytes, parsing answers (a change, "ignore" or a reason) without panicking.
        #[test]
        fn parsing_arbitrary_bodies_never_panics(
            event_type in "(OrderPlaced|OrderPaid|OrderShipped|[A-Za-z]{0,12})",
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        ) {
            let _ = parse(&headers(&event_type), &body);
        }

        /// Every well-formed OrderPlaced opens an invoice with its order id and total.
        #[test]
        fn well_formed_order_placed_is_understood(
            order_id in "[A-Za-z0-9_:@-]{1,128}",
            total_minor in 1_i64..=i64::MAX,
        ) {
            let body = serde_json::json!({"orderId": order_id, "totalMinor": total_minor});
            let change = parse(&headers("OrderPlaced"), body.to_string().as_bytes()).unwrap();
            proptest::prop_assert_eq!(change, Some(Change::Open { order_id, total_minor }));
        }

        /// Order ids that could not be a NATS subject token, and non-positive totals, are refused.
        #[test]
        fn hostile_values_are_refused(
            order_id in "[a-z]{0,5}[.*> \t][a-z]{0,5}",
            total_minor in i64::MIN..=0,
        ) {
            let bad_id = serde_json::json!({"orderId": order_id, "totalMinor": 5});
            proptest::prop_assert!(parse(&headers("OrderPlaced"), bad_id.to_string().as_bytes()).is_err());
            let bad_total = serde_json::json!({"orderId": "o1", "totalMinor": total_minor});
            proptest::prop_assert!(parse(&headers("OrderPlaced"), bad_total.to_string().as_bytes()).is_err());
        }
    }

    #[test]
    fn order_placed_opens_an_invoice() {
        let body = br#"{"orderId":"o1","customer":"ada","totalMinor":500,"status":"placed"}"#;
        assert_eq!(
            parse(&headers("OrderPlaced"), body).unwrap(),
            Some(Change::Open {
                order_id: "o1".into(),
                total_minor: 500
            })
        );
    }

    #[test]
    fn unknown_types_are_ignored_and_garbage_is_refused() {
        assert_eq!(parse(&headers("OrderShipped"), b"not json").unwrap(), None);
        assert!(parse(&headers("OrderPlaced"), b"not json").is_err());
        assert!(
            parse(
                &headers("OrderPlaced"),
                br#"{"orderId":"o1","totalMinor":-5}"#
            )
            .is_err()
        );
        assert!(
            parse(
                &headers("OrderPaid"),
                br#"{"orderId":"a.b","totalMinor":5}"#
            )
            .is_err()
        );
        assert!(parse(&HeaderMap::new(), b"{}").is_err());
    }

    #[test]
    fn repeated_identity_headers_and_huge_bodies_are_refused() {
        let placed = br#"{"orderId":"o1","totalMinor":5}"#;
        for name in [headers::ID, headers::TYPE] {
            let mut twice = headers("OrderPlaced");
            twice.append(name, "OrderPaid");
            let error = parse(&twice, placed).unwrap_err();
            assert!(error.contains(name), "{error}");
        }
        let mut huge = placed.to_vec();
        huge.resize(MAX_BODY + 1, b' ');
        assert!(
            parse(&headers("OrderPlaced"), &huge)
                .unwrap_err()
                .contains("1 MiB")
        );
        // An event type billing ignores is ignored whatever its size.
        assert_eq!(parse(&headers("OrderShipped"), &huge).unwrap(), None);
    }
}
