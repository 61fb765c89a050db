//! For the tests of code built on this crate: fault injection, a [`Publisher`] that wraps a
//! real one and makes chosen publishes fail before reaching the broker, or lose their
//! acknowledgement after the broker stored the message; and [`eventually`], a bounded wait for
//! a condition instead of a sleep.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Barrier;

use crate::{Ack, Message, PublishError, Publisher, headers};

/// What happens to one publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The broker refuses the message: it is not stored, and the failure counts toward the
    /// relay's `max_attempts`.
    Before,
    /// The broker stores the message, but its acknowledgement is lost.
    After,
    /// The broker is unreachable: the message is not sent.
    Unreachable,
}

/// Wraps a publisher, injects [`Fault`]s, and records the id of every message it was asked to
/// publish. Publishes are passed on one at a time.
#[derive(Debug)]
pub struct FaultyPublisher<P> {
    inner: P,
    state: Mutex<State>,
    asked: Arc<Mutex<Vec<String>>>,
}

#[derive(Debug, Default)]
struct State {
    /// Next faults for any message, last first.
    faults: Vec<Fault>,
    /// Next faults per aggregate id, last first.
    per_aggregate: HashMap<String, Vec<Fault>>,
    /// Aggregates whose every publish fails.
    always: Vec<String>,
    /// Awaited by the first publish call.
    barrier: Option<Arc<Barrier>>,
    /// Probability that a publish meets a random fault (half before, half after).
    random_rate: f64,
    /// Shared with other publishers, to catch two of them publishing one row at once.
    in_flight: Option<Arc<Mutex<InFlight>>>,
}

/// Ids being published right now by any publisher sharing this.
#[derive(Debug, Default)]
pub struct InFlight {
    ids: std::collections::HashSet<String>,
    /// Times a publish started while the same id was in flight at another publisher.
    pub overlaps: usize,
}

impl<P: Publisher> FaultyPublisher<P> {
    /// Passes everything to `inner` until told otherwise.
    pub fn new(inner: P) -> Self {
        Self {
            inner,
            state: Mutex::default(),
            asked: Arc::default(),
        }
    }

    /// The next publishes, of any aggregate, meet `faults` in order.
    #[must_use]
    pub fn with_faults(self, faults: impl IntoIterator<Item = Fault>) -> Self {
        self.state().faults = reversed(faults);
        self
    }

    /// The next publishes of `aggregate_id` meet `faults` in order.
    #[must_use]
    pub fn with_aggregate_faults(
        self,
        aggregate_id: &str,
        faults: impl IntoIterator<Item = Fault>,
    ) -> Self {
        self.state()
            .per_aggregate
            .insert(aggregate_id.to_owned(), reversed(faults));
        self
    }

    /// Every publish of `aggregate_id` fails before reaching the broker.
    #[must_use]
    pub fn failing_forever(self, aggregate_id: &str) -> Self {
        self.state().always.push(aggregate_id.to_owned());
        self
    }

    /// The first publish call waits at `barrier` (with the relay's claim held) until the other
    /// parties arrive.
    #[must_use]
    pub fn with_first_call_barrier(self, barrier: Arc<Barrier>) -> Self {
        self.state().barrier = Some(barrier);
        self
    }

    /// Each publish meets a fault with probability `rate`, before or after the broker at
    /// random.
    #[must_use]
    pub fn with_random_faults(self, rate: f64) -> Self {
        self.state().random_rate = rate;
        self
    }

    /// Registers every publish in `in_flight`, shared with other publishers.
    #[must_use]
    pub fn with_in_flight(self, in_flight: Arc<Mutex<InFlight>>) -> Self {
        self.state().in_flight = Some(in_flight);
        self
    }

    /// The ids of every message this publisher was asked to publish, in order.
    pub fn asked(&self) -> Arc<Mutex<Vec<String>>> {
        self.asked.clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fault_for(&self, message: &Message) -> Option<Fault> {
        let aggregate = message
            .headers
            .get(headers::SUBJECT)
            .map(|v| v.as_str().to_owned())?;
        let mut state = self.state();
        if state.always.contains(&aggregate) {
            return Some(Fault::Before);
        }
        if let Some(fault) = state.per_aggregate.get_mut(&aggregate).and_then(Vec::pop) {
            return Some(fault);
        }
        if let Some(fault) = state.faults.pop() {
            return Some(fault);
        }
        let random = state.random_rate > 0.0 && rand::random_bool(state.random_rate);
        random.then(|| {
            if rand::random_bool(0.5) {
                Fault::Before
            } else {
                Fault::After
            }
        })
    }
}

fn reversed(faults: impl IntoIterator<Item = Fault>) -> Vec<Fault> {
    let mut faults: Vec<Fault> = faults.into_iter().collect();
    faults.reverse();
    faults
}

impl<P: Publisher> Publisher for FaultyPublisher<P> {
    async fn publish(&self, messages: Vec<Message>) -> Vec<Result<Ack, PublishError>> {
        let barrier = self.state().barrier.take();
        if let Some(barrier) = barrier {
            barrier.wait().await;
        }
        let in_flight = self.state().in_flight.clone();
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            let id = message.id.to_string();
            self.asked
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(id.clone());
            if let Some(in_flight) = &in_flight {
                let mut in_flight = in_flight.lock().unwrap_or_else(PoisonError::into_inner);
                if !in_flight.ids.insert(id.clone()) {
                    in_flight.overlaps += 1;
                }
            }
            let result = match self.fault_for(&message) {
                Some(Fault::Before) => Err(PublishError::NotAccepted(
                    "injected fault: message refused".into(),
                )),
                Some(Fault::Unreachable) => Err(PublishError::Unreachable(
                    "injected fault: broker unreachable".into(),
                )),
                Some(Fault::After) => match self.inner.publish(vec![message]).await.pop() {
                    Some(Ok(_)) => Err(PublishError::NoAck("injected fault: PubAck lost".into())),
                    Some(Err(error)) => Err(error),
                    None => Err(PublishError::NoAck("publisher returned no result".into())),
                },
                None => self
                    .inner
                    .publish(vec![message])
                    .await
                    .pop()
                    .unwrap_or_else(|| {
                        Err(PublishError::NoAck("publisher returned no result".into()))
                    }),
            };
            if let Some(in_flight) = &in_flight {
                in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .ids
                    .remove(&id);
            }
            results.push(result);
        }
        results
    }

    async fn reachable(&self) -> Option<bool> {
        self.inner.reachable().await
    }

    async fn stored(&self, message: &Message) -> Result<Option<Ack>, PublishError> {
        self.inner.stored(message).await
    }
}

/// Polls `check` every 20 ms until it returns `Some`, and panics naming `what` after `limit`.
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
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long a standby may take to stream a slot another instance left.
const SLOT_WITHIN: Duration = Duration::from_secs(10);

/// How long a slot's first streaming may take: making the slot waits for every transaction
/// that holds a transaction id on the whole server, other tests' too.
const SLOT_MADE_WITHIN: Duration = Duration::from_secs(30);

/// The backend streaming the replication slot `slot`, once one does; panics after
/// `SLOT_MADE_WITHIN`.
pub async fn slot_streamed_by(pool: &sqlx::PgPool, slot: &str) -> i32 {
    let what = format!("the slot {slot} streamed");
    eventually(&what, SLOT_MADE_WITHIN, || streamer(pool, slot)).await
}

/// The backend streaming the replication slot `slot` once it is another than `previous`, a
/// standby having taken over; panics after `SLOT_WITHIN`.
pub async fn slot_streamed_by_another(pool: &sqlx::PgPool, slot: &str, previous: i32) -> i32 {
    streamed_by_another(pool, slot, previous, SLOT_WITHIN).await
}

/// The backend streaming the replication slot `slot`, made again after it was dropped, once
/// it is another than `previous`; panics after `SLOT_MADE_WITHIN`.
pub async fn slot_made_again_and_streamed(pool: &sqlx::PgPool, slot: &str, previous: i32) -> i32 {
    streamed_by_another(pool, slot, previous, SLOT_MADE_WITHIN).await
}

async fn streamed_by_another(
    pool: &sqlx::PgPool,
    slot: &str,
    previous: i32,
    within: Duration,
) -> i32 {
    let what = format!("the slot {slot} streamed by another backend than {previous}");
    eventually(&what, within, || async {
        streamer(pool, slot).await.filter(|pid| *pid != previous)
    })
    .await
}

/// A connection of its own holding the lock that picks the instance streaming `slot`: while
/// it is open, every `WalWakeup` of that slot stands by and none streams it. Panics if the
/// lock is taken.
#[cfg(feature = "wal")]
pub async fn hold_streaming_lock(pool: &sqlx::PgPool, slot: &str) -> sqlx::PgConnection {
    let mut conn = pool.acquire().await.expect("a connection").detach();
    let locked = crate::wal::try_lock(&mut conn, slot)
        .await
        .expect("the lock asked for");
    assert!(locked, "the lock of the slot {slot} is free");
    conn
}

/// The backend streaming `slot` now, if any.
async fn streamer(pool: &sqlx::PgPool, slot: &str) -> Option<i32> {
    sqlx::query_scalar::<_, Option<i32>>(
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(pool)
    .await
    .ok()
    .flatten()
    .flatten()
}

/// Drops a test's replication slot when it goes out of scope, also when the test panics: a
/// slot left behind keeps its database from being dropped, and WAL on the server's disk until
/// someone drops it.
///
/// Drop it before dropping the slot's database. It waits up to ten seconds for nothing to
/// stream the slot, and panics if it is still there then; in a test already panicking it ends
/// whatever streams the slot instead, and only says when it could not drop it.
#[must_use = "the slot is dropped when the guard is"]
pub struct SlotGuard {
    options: sqlx::postgres::PgConnectOptions,
    slot: String,
}

impl SlotGuard {
    /// Guards the slot `slot` of the database `options` connect to.
    pub fn new(options: &sqlx::postgres::PgConnectOptions, slot: &str) -> Self {
        Self {
            options: options.clone(),
            slot: slot.to_owned(),
        }
    }

    /// The slot's name.
    pub fn name(&self) -> &str {
        &self.slot
    }
}

impl std::fmt::Debug for SlotGuard {
    // The connect options hold the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotGuard")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let (options, slot) = (self.options.clone(), std::mem::take(&mut self.slot));
        let panicking = std::thread::panicking();
        // Drop runs on the test's runtime, which may be unwinding: the slot is dropped from a
        // thread and a runtime of its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| error.to_string())?;
            runtime.block_on(drop_slot_within(&options, &slot, panicking))
        })
        .join()
        .unwrap_or_else(|_| Err("the thread dropping it panicked".to_owned()));
        if let Err(error) = dropped {
            assert!(
                panicking,
                "the test's replication slot was not dropped: {error}"
            );
            eprintln!("the test's replication slot was not dropped: {error}");
        }
    }
}

/// Drops `slot` once nothing streams it; with `end_streams`, ends what streams it.
async fn drop_slot_within(
    options: &sqlx::postgres::PgConnectOptions,
    slot: &str,
    end_streams: bool,
) -> Result<(), String> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect_with(options)
        .await
        .map_err(|error| error.to_string())?;
    let deadline = Instant::now() + SLOT_WITHIN;
    loop {
        if end_streams {
            sqlx::query(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
                 WHERE slot_name = $1 AND active_pid IS NOT NULL",
            )
            .bind(slot)
            .execute(&mut conn)
            .await
            .map_err(|error| error.to_string())?;
        }
        // Fails while a session streams the slot.
        let dropped = sqlx::query(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
             WHERE slot_name = $1",
        )
        .bind(slot)
        .execute(&mut conn)
        .await;
        match dropped {
            Ok(_) => return Ok(()),
            Err(error) if Instant::now() > deadline => {
                return Err(format!("{slot}: {error}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
