//! The WAL wake-up against the real PostgreSQL (`wal_level = logical`, as `scripts/test`
//! starts it) and nats-server: a commit made where no relay runs, and told to nobody, is
//! published at once; a standby instance takes over; a slot dropped under it is made again.
//!
//! Each relay here polls once an hour (`poll_interval`), so that only a wake-up can make it
//! publish within the tests' limits.

mod common;

use std::time::Duration;

use common::{TestStream, enqueue, migrate};
use jetstream_outbox::testing::{
    SlotGuard, eventually, hold_streaming_lock, slot_made_again_and_streamed, slot_streamed_by,
    slot_streamed_by_another,
};
use jetstream_outbox::wal::WalWakeup;
use jetstream_outbox::{Relay, Wakeup};
use serde_json::json;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const AT_ONCE: Duration = Duration::from_secs(10);

/// A relay polling once an hour, woken by `wakeup`, until `shutdown`.
fn sleepy_relay(pool: &PgPool, stream: &TestStream, wakeup: &Wakeup, shutdown: &CancellationToken) {
    let mut config = stream.relay_config();
    config.poll_interval = Duration::from_secs(3600);
    let relay = Relay::new(pool.clone(), stream.publisher(), config).with_wakeup(wakeup);
    tokio::spawn(relay.run(shutdown.clone()));
}

/// The URL of the test's own database.
fn url_of(pool: &PgPool) -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let mut url = url::Url::parse(&base).expect("DATABASE_URL is a URL");
    url.set_path(pool.connect_options().get_database().expect("a database"));
    url.to_string()
}

/// A slot name of the test's own, dropped with the guard.
fn slot_of(pool: &PgPool) -> SlotGuard {
    let name = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    SlotGuard::new(&pool.connect_options(), &name)
}

/// Streams `slot` for `wakeup` until `shutdown`, retrying quickly.
fn wal_wakeup(
    pool: &PgPool,
    slot: &str,
    wakeup: &Wakeup,
    shutdown: &CancellationToken,
) -> JoinHandle<()> {
    run(quick_wal_wakeup(pool, slot, wakeup), pool, shutdown)
}

/// A wake-up of `slot` for `wakeup`, retrying every 100 ms instead of every second, so that the
/// tests' many starts and takeovers stay quick; e2e's `wal_wakeup` takes over with the default.
fn quick_wal_wakeup(pool: &PgPool, slot: &str, wakeup: &Wakeup) -> WalWakeup {
    WalWakeup::new(&url_of(pool), slot, wakeup)
        .expect("a good URL")
        .retry(Duration::from_millis(100))
}

/// Runs `wal` until `shutdown`.
fn run(wal: WalWakeup, pool: &PgPool, shutdown: &CancellationToken) -> JoinHandle<()> {
    let (pool, shutdown) = (pool.clone(), shutdown.clone());
    tokio::spawn(async move { wal.run(pool, shutdown).await.expect("streams") })
}

/// Makes the logical slot `slot` by hand, as an operator would.
async fn create_slot(pool: &PgPool, slot: &str) {
    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(slot)
        .execute(pool)
        .await
        .expect("the slot made");
}

/// Stops `tasks`, then drops the slot (once its stream ends).
async fn finish(slot: SlotGuard, shutdown: CancellationToken, tasks: Vec<JoinHandle<()>>) {
    shutdown.cancel();
    for task in tasks {
        task.await.expect("the wake-up ends cleanly");
    }
    drop(slot);
}

async fn published(stream: &TestStream, want: usize) {
    eventually("the events published", AT_ONCE, || async {
        (stream.published().await.len() >= want).then_some(())
    })
    .await;
}

#[sqlx::test(migrations = false)]
async fn a_commit_told_to_nobody_is_published_at_once(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let slot = slot_of(&pool);
    let (wakeup, shutdown) = (Wakeup::in_process(), CancellationToken::new());
    sleepy_relay(&pool, &stream, &wakeup, &shutdown);
    let wal = wal_wakeup(&pool, slot.name(), &wakeup, &shutdown);
    slot_streamed_by(&pool, slot.name()).await;

    // `enqueue` commits on its own connection and tells no relay.
    enqueue(&pool, "o1", "OrderPlaced", json!({"orderId": "o1"})).await;
    published(&stream, 1).await;
    enqueue(&pool, "o1", "OrderPaid", json!({"orderId": "o1"})).await;
    published(&stream, 2).await;
    assert_eq!(stream.published().await, ["o1:OrderPlaced", "o1:OrderPaid"]);
    finish(slot, shutdown, vec![wal]).await;
}

#[sqlx::test(migrations = false)]
async fn a_standby_takes_over_when_the_streaming_instance_stops(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let slot = slot_of(&pool);
    // The first instance streams and wakes nobody; the second stands by, beside the relay.
    let (first_shutdown, shutdown) = (CancellationToken::new(), CancellationToken::new());
    let first = wal_wakeup(&pool, slot.name(), &Wakeup::in_process(), &first_shutdown);
    let first_pid = slot_streamed_by(&pool, slot.name()).await;
    let wakeup = Wakeup::in_process();
    sleepy_relay(&pool, &stream, &wakeup, &shutdown);
    let second = wal_wakeup(&pool, slot.name(), &wakeup, &shutdown);

    enqueue(&pool, "o1", "OrderPlaced", json!({"orderId": "o1"})).await;
    first_shutdown.cancel();
    first.await.expect("the first instance ends cleanly");
    // The standby streams, and looks at what committed before it did.
    slot_streamed_by_another(&pool, slot.name(), first_pid).await;
    published(&stream, 1).await;
    enqueue(&pool, "o1", "OrderPaid", json!({"orderId": "o1"})).await;
    published(&stream, 2).await;
    assert_eq!(stream.published().await, ["o1:OrderPlaced", "o1:OrderPaid"]);
    finish(slot, shutdown, vec![second]).await;
}

/// An operator drops the slot (or a failover leaves it behind): the wake-up makes it again,
/// and what committed meanwhile is published, since the table holds it.
#[sqlx::test(migrations = false)]
async fn a_slot_dropped_under_it_is_made_again(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let slot = slot_of(&pool);
    let (wakeup, shutdown) = (Wakeup::in_process(), CancellationToken::new());
    sleepy_relay(&pool, &stream, &wakeup, &shutdown);
    let wal = wal_wakeup(&pool, slot.name(), &wakeup, &shutdown);
    let before = slot_streamed_by(&pool, slot.name()).await;

    eventually("the slot dropped by the operator", AT_ONCE, || async {
        sqlx::query(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
             WHERE slot_name = $1 AND active_pid IS NOT NULL",
        )
        .bind(slot.name())
        .execute(&pool)
        .await
        .ok()?;
        sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(slot.name())
            .execute(&pool)
            .await
            .ok()
    })
    .await;
    enqueue(&pool, "o1", "OrderPlaced", json!({"orderId": "o1"})).await;
    slot_made_again_and_streamed(&pool, slot.name(), before).await;
    published(&stream, 1).await;
    enqueue(&pool, "o1", "OrderPaid", json!({"orderId": "o1"})).await;
    published(&stream, 2).await;
    finish(slot, shutdown, vec![wal]).await;
}

/// The streaming instance's lock session dies (its host cut off, say) while its stream runs
/// on: the standby takes the lock and ends that stream instead of waiting for the server to
/// notice, which takes `wal_sender_timeout`.
#[sqlx::test(migrations = false)]
async fn an_instance_that_lost_its_lock_stops_streaming(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let slot = slot_of(&pool);
    let shutdown = CancellationToken::new();
    let first = wal_wakeup(&pool, slot.name(), &Wakeup::in_process(), &shutdown);
    let first_pid = slot_streamed_by(&pool, slot.name()).await;
    let wakeup = Wakeup::in_process();
    sleepy_relay(&pool, &stream, &wakeup, &shutdown);
    let second = wal_wakeup(&pool, slot.name(), &wakeup, &shutdown);

    // The session holding the lock: the standby's, waiting for it, has the same name.
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE application_name = $1
            AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)",
    )
    .bind(format!("outbox-wal-lock/{}", slot.name()))
    .fetch_all(&pool)
    .await
    .expect("the lock's session ended");
    assert_eq!(ended, [true], "one session holds the lock");
    slot_streamed_by_another(&pool, slot.name(), first_pid).await;
    enqueue(&pool, "o1", "OrderPlaced", json!({"orderId": "o1"})).await;
    published(&stream, 1).await;
    finish(slot, shutdown, vec![first, second]).await;
}

/// A slot of the name that is not this database's `pgoutput` slot (here a physical one, as a
/// standby's) is refused at the check, and left alone.
#[sqlx::test(migrations = false)]
async fn a_slot_of_another_kind_is_refused_and_left_alone(pool: PgPool) {
    migrate(&pool).await;
    let slot = slot_of(&pool);
    sqlx::query("SELECT pg_create_physical_replication_slot($1)")
        .bind(slot.name())
        .execute(&pool)
        .await
        .unwrap();
    let wal =
        WalWakeup::new(&url_of(&pool), slot.name(), &Wakeup::in_process()).expect("a good URL");
    assert!(matches!(
        wal.check(&pool).await,
        Err(jetstream_outbox::wal::WalError::SlotTaken(_))
    ));
    let run = wal.run(pool.clone(), CancellationToken::new()).await;
    assert!(
        matches!(run, Err(jetstream_outbox::wal::WalError::SlotTaken(_))),
        "{run:?}"
    );
    drop(slot);
}

/// A slot nobody streams (here another session holds the lock that picks the streaming
/// instance) shows its lag in bytes and in seconds, and no wait once an instance streams it.
#[sqlx::test(migrations = false)]
async fn a_slot_nobody_streams_shows_how_long_its_wal_has_waited(pool: PgPool) {
    migrate(&pool).await;
    let slot = slot_of(&pool);
    let wal = quick_wal_wakeup(&pool, slot.name(), &Wakeup::in_process());
    // The publication first: a slot decodes with the catalog as it was when each change was
    // written, and a change from before the publication existed stops its stream.
    wal.check(&pool).await.expect("the publication made");
    create_slot(&pool, slot.name()).await;
    let holder = hold_streaming_lock(&pool, slot.name()).await;
    let shutdown = CancellationToken::new();
    let lag = wal.lag();
    let task = run(wal, &pool, &shutdown);
    enqueue(&pool, "o1", "OrderPlaced", json!({"orderId": "o1"})).await;

    // Readings come every five seconds: the second one that sees the WAL finds it waited.
    let waiting = eventually(
        "the slot's lag in seconds",
        Duration::from_secs(20),
        || async {
            lag.last()
                .filter(|lag| lag.waited >= Duration::from_secs(4))
        },
    )
    .await;
    assert!(waiting.bytes > 0, "{waiting:?}");
    sqlx::Connection::close(holder).await.unwrap();
    slot_streamed_by(&pool, slot.name()).await;
    // Other tests' WAL keeps the bytes above 0 for a moment at a time; the wait ends.
    eventually("no wait once streamed", Duration::from_secs(30), || async {
        lag.last().filter(|lag| lag.waited.is_zero())
    })
    .await;
    finish(slot, shutdown, vec![task]).await;
}

/// A slot made before its publication (by hand, or the publication dropped and made again
/// under it) cannot be streamed: decoding a change written while the publication did not exist
/// fails, each time. The wake-up makes the slot again, and it confirms what follows.
#[sqlx::test(migrations = false)]
async fn a_slot_older_than_its_publication_is_made_again(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let slot = slot_of(&pool);
    create_slot(&pool, slot.name()).await;
    // A change the slot must decode before any of the publication's time.
    enqueue(&pool, "o1", "OrderPlaced", json!({"orderId": "o1"})).await;
    let (wakeup, shutdown) = (Wakeup::in_process(), CancellationToken::new());
    sleepy_relay(&pool, &stream, &wakeup, &shutdown);
    let wal = wal_wakeup(&pool, slot.name(), &wakeup, &shutdown);

    enqueue(&pool, "o1", "OrderPaid", json!({"orderId": "o1"})).await;
    let written: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    // Making a slot waits for every transaction running on the server, other tests' too.
    eventually(
        "the slot confirmed past the commit",
        Duration::from_secs(30),
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots
             WHERE slot_name = $1",
            )
            .bind(slot.name())
            .bind(&written)
            .fetch_optional(&pool)
            .await
            .ok()
            .flatten()
            .filter(|confirmed| *confirmed)
        },
    )
    .await;
    published(&stream, 2).await;
    // Each new stream wakes the relay once; this commit is woken by the slot made again.
    enqueue(&pool, "o1", "OrderShipped", json!({"orderId": "o1"})).await;
    published(&stream, 3).await;
    finish(slot, shutdown, vec![wal]).await;
}
