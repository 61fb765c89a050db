//! The stream checked against the published events the outbox keeps, against the real
//! PostgreSQL and nats-server: what it lost is published again, with its id, in order; what it
//! removed by its own limits is not. (The broker restarted on an older copy of its store, or
//! empty, is e2e/tests/broker_loss.rs.)

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::{TestStream, count, enqueue, migrate};
use jetstream_outbox::testing::{FaultyPublisher, eventually};
use jetstream_outbox::{Relay, StreamRepair, outbox};
use serde_json::json;
use sqlx::PgPool;
use tokio::sync::Barrier;

/// Five orders with two events each, published by one pass.
async fn ten_published(pool: &PgPool, relay: &Relay<jetstream_outbox::JetStreamPublisher>) {
    for event_type in ["OrderPlaced", "OrderPaid"] {
        for order in 0..5 {
            enqueue(pool, &format!("o{order}"), event_type, json!({})).await;
        }
    }
    let mut published = 0;
    while published < 10 {
        published += relay.run_once().await.unwrap().published;
    }
}

/// The ids of the stream's messages, in stream order, and whether each order's events are in
/// order (placed before paid).
async fn ids_in_order(stream: &TestStream) -> (Vec<String>, bool) {
    let contents = stream.contents().await;
    let mut placed = HashSet::new();
    let mut in_order = true;
    for (order, event_type, _) in &contents {
        match event_type.as_str() {
            "OrderPlaced" => {
                placed.insert(order.clone());
            }
            _ => in_order &= placed.contains(order),
        }
    }
    (
        contents.into_iter().map(|(_, _, id)| id).collect(),
        in_order,
    )
}

/// The stream's newest messages are gone (deleted here one by one, as a broker that lost its
/// unsynced tail has them gone): a check finds them missing, and the relay publishes them again,
/// with their ids, in each order's order. A broker that restarted forgets the ids of what it
/// lost; one that deleted messages remembers them for its duplicate window and drops a copy as
/// a duplicate, so the stream's window is 100 ms here and the check runs until every id is back.
#[sqlx::test(migrations = false)]
async fn messages_lost_from_the_streams_tail_are_published_again(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let mut short_window = stream.stream().await.cached_info().config.clone();
    short_window.duplicate_window = Duration::from_millis(100);
    stream.jetstream.update_stream(&short_window).await.unwrap();
    let repair = StreamRepair::new(stream.jetstream.clone(), stream.spec());
    let relay = Relay::new(pool.clone(), stream.publisher(), stream.relay_config());
    assert_eq!(repair.check(&pool).await.unwrap().republished, 0);
    ten_published(&pool, &relay).await;
    assert_eq!(repair.check(&pool).await.unwrap().republished, 0);
    let (before, _) = ids_in_order(&stream).await;

    let handle = stream.stream().await;
    for seq in 6..=10 {
        handle.delete_message(seq).await.unwrap();
    }
    let report = repair.check(&pool).await.unwrap();
    assert_eq!(report.republished, 5, "{report:?}");
    assert_eq!(outbox::stats(&pool).await.unwrap().pending, 5);
    let after = eventually(
        "every id back in the stream",
        Duration::from_secs(20),
        || async {
            while outbox::stats(&pool).await.ok()?.pending > 0 {
                relay.run_once().await.ok()?;
            }
            let (after, in_order) = ids_in_order(&stream).await;
            assert!(in_order, "each order's events in order");
            if after.len() < 10 {
                repair.check(&pool).await.ok()?;
                return None;
            }
            Some(after)
        },
    )
    .await;

    assert_eq!(
        after.iter().collect::<HashSet<_>>(),
        before.iter().collect::<HashSet<_>>()
    );
    assert_eq!(repair.check(&pool).await.unwrap().republished, 0);
    stream.delete().await;
}

/// An operator deletes the stream under a running relay: the relay's check makes it again and
/// publishes again every event it held, then the events committed since.
#[sqlx::test(migrations = false)]
async fn a_deleted_stream_is_made_again_with_what_it_held(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    // Light checks every 100 ms instead of 10 s: the deletion is found within the test's wait.
    let repair = StreamRepair::new(stream.jetstream.clone(), stream.spec())
        .every(Duration::from_millis(100));
    let relay =
        Relay::new(pool.clone(), stream.publisher(), stream.relay_config()).with_repair(repair);
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(relay.run(stop.clone()));
    for order in 0..5 {
        enqueue(&pool, &format!("o{order}"), "OrderPlaced", json!({})).await;
    }
    eventually("five published", Duration::from_secs(10), || async {
        (count(&pool, "outbox_published").await == 5).then_some(())
    })
    .await;

    stream.jetstream.delete_stream(&stream.name).await.unwrap();
    for order in 0..5 {
        enqueue(&pool, &format!("o{order}"), "OrderPaid", json!({})).await;
    }

    // Long enough for a second repair: nats-server 2.9 may take the files of a stream made
    // again at once, and only a stream that has returned nothing for a while is judged damaged.
    let (ids, in_order) = eventually(
        "ten in the stream made again",
        Duration::from_secs(60),
        || async {
            let (ids, in_order) = ids_in_order_if_any(&stream).await?;
            (ids.len() == 10).then_some((ids, in_order))
        },
    )
    .await;
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 10);
    assert!(in_order, "each order's events in order");
    stop.cancel();
    running.await.unwrap();
    stream.delete().await;
}

/// The stream is gone at the first check ever made of it (the relay ran without checks until
/// now): the check makes it again and publishes again every event published before, though no
/// position was recorded to compare with.
#[sqlx::test(migrations = false)]
async fn a_stream_gone_at_its_first_check_gets_what_was_published(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let relay = Relay::new(pool.clone(), stream.publisher(), stream.relay_config());
    ten_published(&pool, &relay).await;
    stream.jetstream.delete_stream(&stream.name).await.unwrap();

    let repair = StreamRepair::new(stream.jetstream.clone(), stream.spec());
    let report = repair.check(&pool).await.unwrap();
    assert!(report.created, "the stream is made again");
    assert_eq!(report.republished, 10, "what it held is published again");
    let mut published = 0;
    while published < 10 {
        published += relay.run_once().await.unwrap().published;
    }
    let (ids, in_order) = ids_in_order(&stream).await;
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 10);
    assert!(in_order, "each order's events in order");
    stream.delete().await;
}

/// [`ids_in_order`], or `None` while there is no stream.
async fn ids_in_order_if_any(stream: &TestStream) -> Option<(Vec<String>, bool)> {
    stream.jetstream.get_stream(&stream.name).await.ok()?;
    Some(ids_in_order(stream).await)
}

/// Messages the stream removed by its `max_age` were not lost: nothing is published again.
#[sqlx::test(migrations = false)]
async fn messages_aged_out_by_the_stream_are_not_published_again(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let mut short = stream.stream().await.cached_info().config.clone();
    // JetStream keeps the duplicate window within the age.
    short.max_age = Duration::from_secs(1);
    short.duplicate_window = short.max_age;
    stream.jetstream.update_stream(&short).await.unwrap();
    let mut spec = stream.spec();
    spec.max_age = short.max_age;
    spec.duplicate_window = short.max_age;
    let repair = StreamRepair::new(stream.jetstream.clone(), spec);
    let relay = Relay::new(pool.clone(), stream.publisher(), stream.relay_config());
    repair.check(&pool).await.unwrap();
    ten_published(&pool, &relay).await;
    repair.check(&pool).await.unwrap();

    eventually(
        "the stream to age its messages out",
        Duration::from_secs(10),
        || async {
            let info = stream.stream().await.get_info().await.ok()?;
            (info.state.messages == 0).then_some(())
        },
    )
    .await;
    assert_eq!(repair.check(&pool).await.unwrap().republished, 0);
    assert_eq!(outbox::stats(&pool).await.unwrap().pending, 0);
    stream.delete().await;
}

/// Another relay's pass begins before a check and is acknowledged after the check read the
/// stream's state (the check is held here, on the table of positions, until the pass recorded
/// its event): the event is above every message the check read, yet in the stream, and is not
/// taken for lost.
#[sqlx::test(migrations = false)]
async fn an_event_acknowledged_during_a_check_is_not_taken_for_lost(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let repair = StreamRepair::new(stream.jetstream.clone(), stream.spec());
    let relay = Relay::new(pool.clone(), stream.publisher(), stream.relay_config());
    enqueue(&pool, "o1", "OrderPlaced", json!({})).await;
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    repair.check(&pool).await.unwrap();

    enqueue(&pool, "o2", "OrderPlaced", json!({})).await;
    let barrier = Arc::new(Barrier::new(2));
    let held = FaultyPublisher::new(stream.publisher()).with_first_call_barrier(barrier.clone());
    let relay = Relay::new(pool.clone(), held, stream.relay_config());
    let pass = tokio::spawn(async move { relay.run_once().await });
    // Its transaction waits while the publisher does (a probe that locked the row could
    // take it from the claim).
    eventually("the pass's claim", Duration::from_secs(10), || async {
        let claiming: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND state = 'idle in transaction'",
        )
        .fetch_one(&pool)
        .await
        .ok()?;
        (claiming > 0).then_some(())
    })
    .await;

    let mut positions = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE outbox_stream_checks IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *positions)
        .await
        .unwrap();
    let check = tokio::spawn({
        let pool = pool.clone();
        async move { repair.check(&pool).await }
    });
    eventually("the check held", Duration::from_secs(10), || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND query LIKE '%outbox_stream_checks%'",
        )
        .fetch_one(&pool)
        .await
        .ok()?;
        (waiting > 0).then_some(())
    })
    .await;
    barrier.wait().await;
    assert_eq!(pass.await.unwrap().unwrap().published, 1);
    positions.commit().await.unwrap();

    let report = check.await.unwrap().unwrap();
    assert_eq!(report.republished, 0, "{report:?}");
    assert_eq!(outbox::stats(&pool).await.unwrap().pending, 0);
    assert_eq!(stream.contents().await.len(), 2);
    stream.delete().await;
}
