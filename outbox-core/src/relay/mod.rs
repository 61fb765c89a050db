//! The relay: claims pending outbox rows, publishes them, and records the outcome.
//!
//! One pass ([`Relay::run_once`]; its steps are in `pass`) works in one database transaction:
//! 1. claim up to `batch_size` due rows with `FOR UPDATE SKIP LOCKED`, keeping only rows whose
//!    earlier unpublished events are in the same claim (another relay may hold the rest);
//! 2. publish in waves: the first event of every aggregate, then the second, and so on, each
//!    wave pipelined; a failed event drops its aggregate's later events from the pass;
//! 3. move the acknowledged rows to `outbox_published`, into the partition of the current two
//!    hours (or delete them, see [`RelayConfig::delete_published`]), and mark the failed ones
//!    retried later (or dead), commit.
//!
//! [`Relay::run`] overlaps passes (`schedule`): one is recorded while the next is claimed and
//! published; under a backlog one pass is claimed while the one before it is published and the
//! one before that is recorded. A pass whose record fails is recorded again, alone and after a
//! growing pause, never published again for it.
//!
//! Every row becomes a message or a dead event: a row whose names are not subject tokens
//! (written before the table refused them) is dead at once with the reason, a malformed
//! traceparent is left out. With [`Relay::with_repair`], the relay checks its stream for what
//! the broker acknowledged and lost (`watch`, [`crate::repair`]) and publishes it again.
//!
//! # What keeps each aggregate's events in order
//!
//! Every mechanism below is needed; each names what it relies on.
//! 1. **Commit order is seq order** (the SQL function `outbox_enqueue`, migration
//!    `20261203000009_outbox_enqueue`, which `outbox::storage::insert` calls): an enqueue
//!    takes a transaction-scoped advisory lock on its aggregate before inserting, so two
//!    transactions with events of one aggregate commit one after the other and the later one's
//!    rows get the higher seqs. Relies on every event being written through [`crate::enqueue`]
//!    or `outbox_enqueue`.
//! 2. **The claim's barrier** (`storage::claim`): a row behind a dead event or behind an event
//!    whose publish failed (`attempts > 0`) is not claimed, only the failing head is (when
//!    due). A row whose earlier unpublished event is outside the claim (locked by another pass
//!    or relay, or not yet due) is claimed but marked `held_back` and let go unpublished.
//! 3. **The `passed_over` premise** (`storage::claim`): `held_back` is computed only when the
//!    claim passed over a pending row below its highest seq (locked by another pass or relay,
//!    not yet due, or behind a dead or failing event). If it passed over none, every pending
//!    row below its highest seq is in the claim, so every earlier unpublished event of a
//!    claimed row is claimed too (a dead one excludes its followers through 2). Relies on the
//!    claim taking rows in seq order from the lowest, so that what it skipped is all it left
//!    below.
//! 4. **Waves** (`pass`): a pass publishes one event per aggregate per wave and awaits every
//!    acknowledgement of a wave before the next, so a later event is sent only after the
//!    broker stored the earlier one. Relies on the publisher's result per message
//!    ([`crate::Publisher`]).
//! 5. **The failed-aggregate barrier** (`pass`): an event whose publish failed drops its
//!    aggregate's later events from the rest of the pass. The record then delays it: a refusal
//!    also counts an attempt, which is 2's barrier for the next claims; a transient failure
//!    (an unreachable broker) counts none, and its later events are held back through 3 while
//!    it is not due.
//! 6. **Rows stay locked until recorded** (`pass`, `schedule`): a pass holds its rows in its
//!    transaction until their outcome is committed, so no other pass or relay claims a later
//!    event of theirs meanwhile (2 and 3 hold it back); held-back rows are claimed again after
//!    `HELD_BACK_WAIT` (longer only after a failed round, or during an outage's pauses).
//! 7. **The lease** (`storage::begin_claim`, [`RelayConfig::lease`]): a pass stops starting
//!    waves when half its lease has gone, and PostgreSQL ends a session silent for the whole
//!    lease, rolling its transaction back: the rows become pending again, unpublished or
//!    published, never published out of order, since 4 kept what was sent in order.
//!
//! A crash between publish and commit publishes the row again, as does one just after the
//! commit (the relay does not wait for its record to be flushed, see `storage::begin_claim`);
//! the broker drops the copy inside its duplicate window (`Nats-Msg-Id`) and the consumer's
//! inbox drops it after that.
//!
//! 8. **Events published again come first** (`watch`, [`crate::repair`]): an event the broker
//!    lost is moved back into the outbox with its original seq, below every later event of its
//!    aggregate, and after a reconnect or a sign of loss nothing is published (a pass stops
//!    between waves) until the stream was checked and what it lost moved back.
//!
//! Modules: `schedule` (the overlap of passes, a small state machine driven by [`Relay::run`]),
//! `pass` (claim, waves, record), `message` (the CloudEvents message of a row), `watch` (when
//! the stream is checked), `health` (its gauges of the broker's state, [`RelayHealth`])
//! and `storage` (every SQL statement of the relay).

mod health;
mod message;
mod pass;
mod schedule;
pub(crate) mod storage;
mod watch;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::{Backoff, Publisher, StreamRepair, Wakeup};
use schedule::{Round, Scheduler};

pub use health::{BrokerState, RelayHealth};

/// The most connections a relay holds at once: its three overlapping passes (one recorded, one
/// published, one claimed, see [`Relay::run`]) and its `LISTEN`. The size of a pool of its own.
pub const RELAY_CONNECTIONS: u32 = 4;

/// How the relay runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    /// First subject token; a message goes to `{prefix}.{event_type}.{aggregate_id}`.
    pub subject_prefix: String,
    /// The CloudEvents `source` attribute, e.g. `/orders-service`.
    pub source: String,
    /// Most rows claimed per pass.
    pub batch_size: i64,
    /// Attempts after which an event is dead and parks its aggregate.
    pub max_attempts: i32,
    /// Wait between passes when there was nothing (more) to do.
    pub poll_interval: Duration,
    /// Delay between attempts of an event the broker refused; each refusal counts toward
    /// `max_attempts`.
    pub backoff: Backoff,
    /// Delay before publishing again while the broker is unreachable or does not acknowledge,
    /// by the number of passes in a row that reached nothing. These failures never count
    /// toward `max_attempts`: an outage, however long, makes no event dead.
    pub unreachable_backoff: Backoff,
    /// Delete rows as they are published instead of moving them to `outbox_published` (and
    /// leaving them to [`crate::Cleanup`]). Cheaper still for the database: the move's insert
    /// is not made.
    pub delete_published: bool,
    /// Longest a pass holds its claimed rows. PostgreSQL ends the session of a relay that stays
    /// silent inside its transaction for longer (`idle_in_transaction_session_timeout`, set
    /// for the claim's transaction only), so a relay cut off from the database after a claim
    /// lets its rows go to the other relays within this time; a pass starts no new wave of
    /// publishes once half of it has gone (the rest stay pending for the next pass). Keep it
    /// above twice the longest a wave can take (two publish timeouts, sending then
    /// acknowledgements, for each window a batch fills): four publish timeouts per window.
    pub lease: Duration,
}

impl RelayConfig {
    /// Defaults for everything but the subject prefix and the CloudEvents source.
    pub fn new(subject_prefix: impl Into<String>, source: impl Into<String>) -> Self {
        Self {
            subject_prefix: subject_prefix.into(),
            source: source.into(),
            batch_size: 1000,
            max_attempts: 10,
            poll_interval: Duration::from_millis(500),
            backoff: Backoff::default(),
            unreachable_backoff: Backoff {
                base: Duration::from_millis(100),
                max: Duration::from_secs(5),
            },
            delete_published: false,
            lease: Duration::from_secs(30),
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchReport {
    /// Rows claimed and eligible (heads of their aggregate within the claim).
    pub claimed: usize,
    /// Rows acknowledged by the broker and recorded published.
    pub published: usize,
    /// Rows whose publish failed this pass (including those that became dead).
    pub failed: usize,
    /// Rows that became dead this pass.
    pub dead: usize,
}

/// Publishes committed outbox rows.
#[derive(Debug)]
pub struct Relay<P> {
    pool: PgPool,
    publisher: P,
    config: RelayConfig,
    /// Passes in a row whose publishes all failed transiently (0: the broker is reachable).
    outage: AtomicU32,
    /// Changes when code of this process committed events ([`Relay::with_wakeup`]).
    woken: Option<tokio::sync::watch::Receiver<u64>>,
    /// Where the relay notes what it claims, so that a wake-up for those events is left out.
    wakeup: Option<Wakeup>,
    /// The highest stream sequence acknowledged to this relay (or found at a check): a later
    /// acknowledgement at or below it means the stream lost messages.
    acked_high: AtomicU64,
    /// Checks of the stream for what the broker forgot ([`Relay::with_repair`]).
    watch: Option<watch::Watch>,
    /// Its gauges of the broker's state, which a console reads too.
    health: RelayHealth,
}

impl<P: Publisher> Relay<P> {
    /// A relay over the outbox in `pool`, of which it holds up to [`RELAY_CONNECTIONS`] at once:
    /// best a pool of its own with all of them open, so that it does not wait for request
    /// handlers, nor for a connection to be made.
    ///
    /// # Panics
    /// When `config.source` holds a line break: it goes into every message's headers.
    pub fn new(pool: PgPool, publisher: P, config: RelayConfig) -> Self {
        assert!(
            config.source.parse::<async_nats::HeaderValue>().is_ok(),
            "RelayConfig::source may not hold a line break"
        );
        Self {
            pool,
            publisher,
            config,
            outage: AtomicU32::new(0),
            woken: None,
            wakeup: None,
            acked_high: AtomicU64::new(0),
            watch: None,
            health: RelayHealth::default(),
        }
    }

    /// Checks the stream with `repair` (see [`crate::repair`]): at start, after every
    /// reconnect, on evidence of loss and lightly every [`StreamRepair::every`]; events the
    /// broker acknowledged and lost are moved back into the outbox and published again. Nothing
    /// is published after a reconnect before its check. Needs published events kept
    /// ([`RelayConfig::delete_published`] off) to have anything to publish again.
    #[must_use]
    pub fn with_repair(mut self, repair: StreamRepair) -> Self {
        let repair = repair
            .with_lease(self.config.lease)
            .with_health(self.health.clone());
        self.watch = Some(watch::Watch::new(repair));
        self
    }

    /// Wakes this relay when code of this process commits through `wakeup` (see
    /// [`crate::wakeup`]), as soon as the commit is made.
    #[must_use]
    pub fn with_wakeup(mut self, wakeup: &Wakeup) -> Self {
        self.woken = Some(wakeup.subscribe());
        self.wakeup = Some(wakeup.clone());
        self
    }

    /// What the relay sees of the broker while it runs, as its gauges say it: whether it is
    /// reachable, has room, and keeps what it counts (with [`Relay::with_repair`]).
    pub fn health(&self) -> RelayHealth {
        self.health.clone()
    }

    /// Runs passes until `shutdown` is cancelled; published passes are recorded first, a
    /// claimed one not yet published is let go.
    ///
    /// Commits wake the relay at once when they are told through its [`Wakeup`] (in this
    /// process) or a `NOTIFY` on [`crate::outbox::CHANNEL`] (from others; the relay listens
    /// before its first pass, and a dropped listener connection is re-established by the next
    /// wait); `poll_interval` is the fallback for commits nobody told about.
    ///
    /// Passes overlap, each on its own transaction: while one pass's outcome is recorded the
    /// next is claimed and published, and while claims come back full (a backlog) a full claim
    /// is published in the following round, alongside the next claim. `SKIP LOCKED` keeps each
    /// pass's rows out of the others' claims, and the per-aggregate barrier holds back any
    /// later event of theirs, exactly as between two relays; rows held back are claimed again
    /// as soon as the passes ahead of them are recorded.
    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(prefix = %self.config.subject_prefix, "relay started");
        start_metrics(&self.health, self.watch.is_some());
        let mut scheduler = Scheduler::new(&self);
        loop {
            match scheduler.round(&shutdown).await {
                Round::Busy => {}
                Round::Idle(wait) => scheduler.idle(wait, &shutdown).await,
                Round::Stopped => break,
            }
        }
        scheduler.finish().await;
        tracing::info!("relay stopped");
    }

    /// One pass: claim, publish, record. See the module documentation.
    pub async fn run_once(&self) -> sqlx::Result<BatchReport> {
        let claim = self.claim().await?;
        let pass = self.publish(claim).await;
        self.record(pass)
            .await
            .map_err(|unrecorded| unrecorded.error)
    }

    /// The longest delay the relay sets before an event's next attempt: a row due later than
    /// this was not scheduled by it (a clock that ran ahead), and is claimed at once.
    fn longest_delay(&self) -> Duration {
        self.config
            .backoff
            .max
            .max(self.config.unreachable_backoff.max)
            + Duration::from_secs(1)
    }

    /// Tracks whether the broker's storage is full, logging each change and keeping
    /// `outbox_broker_storage_full` (1 while full) up to date.
    fn note_storage_full(&self, full: bool) {
        if self.health.swap_storage_full(full) == full {
            return;
        }
        if full {
            tracing::warn!(
                "the broker's storage is full (the stream's or its account's limits): events \
                 stay pending and are retried until room is made (a full broker never makes an \
                 event dead)"
            );
        } else {
            tracing::info!("the broker has room again; publishing resumes");
        }
    }

    /// Tracks whether the broker is reachable from what a pass saw, logging each change and
    /// keeping `outbox_broker_unreachable` (1 while unreachable) up to date.
    fn note_reachability(&self, reached: bool, unreached: bool) {
        if reached {
            self.note_storage_full(false);
            self.note_reached();
        } else if unreached {
            self.note_unreached();
        }
    }

    /// The broker answered: a pass published, or a check of the stream ran.
    fn note_reached(&self) {
        let attempts = self.outage.swap(0, Ordering::Relaxed);
        if attempts > 0 {
            tracing::info!(attempts, "broker reachable again; publishing resumes");
            self.health.set_unreachable(false);
        }
    }

    /// The broker did not answer a pass's publishes or a check of the stream.
    fn note_unreached(&self) {
        if self.outage.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                "broker unreachable: events stay pending and are retried until it is back \
                 (an outage never makes an event dead)"
            );
            self.health.set_unreachable(true);
        }
    }
}

/// Makes the relay's series exist from its start, the counters at zero and the gauges as
/// `health` says: `rate()`, `increase()` and the alerts on them see a relay that has had
/// nothing to count yet.
fn start_metrics(health: &RelayHealth, repairs: bool) {
    for counter in [
        "outbox_published_total",
        "outbox_publish_failures_total",
        "outbox_dead_total",
        "outbox_record_failures_total",
        "outbox_found_stored_total",
    ] {
        metrics::counter!(counter).increment(0);
    }
    for outcome in ["rows", "empty"] {
        metrics::counter!("outbox_relay_claims_total", "outcome" => outcome).increment(0);
    }
    if repairs {
        metrics::counter!("outbox_republished_total").increment(0);
        metrics::counter!("outbox_stream_damaged_total").increment(0);
        for outcome in ["ok", "failed"] {
            metrics::counter!("outbox_stream_checks_total", "outcome" => outcome).increment(0);
        }
    }
    health.write_gauges(repairs);
}
