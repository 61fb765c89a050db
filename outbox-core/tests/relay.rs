//! The relay against the real PostgreSQL and nats-server.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{TestStream, count, enqueue, migrate, publish_earlier};
use jetstream_outbox::headers;
use jetstream_outbox::inbox::Digest;
use jetstream_outbox::outbox::DeadFilter;
use jetstream_outbox::testing::eventually;
use jetstream_outbox::testing::{Fault, FaultyPublisher, InFlight};
use jetstream_outbox::{Backoff, NewEvent, Relay, Wakeup, outbox};
use serde_json::json;
use sqlx::PgPool;

async fn pending(pool: &PgPool) -> i64 {
    outbox::stats(pool).await.unwrap().pending
}

#[sqlx::test(migrations = false)]
async fn rolled_back_enqueue_leaves_nothing(pool: PgPool) {
    migrate(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    let event = jetstream_outbox::NewEvent::new("order", "o1", "OrderPlaced", &json!({})).unwrap();
    jetstream_outbox::enqueue(&mut tx, &event).await.unwrap();
    tx.rollback().await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

/// o7 has three events and its first publish fails once; o8 has one. The first pass publishes
/// only o8; at the end the stream holds o8, then o7's three events in commit order.
#[sqlx::test(migrations = false)]
async fn failed_publish_holds_back_later_events_of_its_aggregate(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    for event_type in ["OrderPlaced", "OrderPaid", "OrderShipped"] {
        enqueue(&pool, "o7", event_type, json!({"orderId": "o7"})).await;
    }
    enqueue(&pool, "o8", "OrderPlaced", json!({"orderId": "o8"})).await;
    let publisher =
        FaultyPublisher::new(stream.publisher()).with_aggregate_faults("o7", [Fault::Before]);
    let relay = Relay::new(pool.clone(), publisher, stream.relay_config());

    let first = relay.run_once().await.unwrap();
    assert_eq!((first.published, first.failed), (1, 1), "{first:?}");
    let only_o8: Vec<_> = stream
        .contents()
        .await
        .into_iter()
        .map(|(s, t, _)| (s, t))
        .collect();
    assert_eq!(only_o8, [("o8".to_owned(), "OrderPlaced".to_owned())]);

    eventually("the outbox to drain", Duration::from_secs(10), || async {
        relay.run_once().await.unwrap();
        (pending(&pool).await == 0).then_some(())
    })
    .await;
    let order: Vec<_> = stream
        .contents()
        .await
        .into_iter()
        .map(|(s, t, _)| format!("{s}:{t}"))
        .collect();
    assert_eq!(
        order,
        [
            "o8:OrderPlaced",
            "o7:OrderPlaced",
            "o7:OrderPaid",
            "o7:OrderShipped"
        ]
    );
    stream.delete().await;
}

/// Two relays at once over 20 pending rows: every row is handed to a publisher exactly once.
#[sqlx::test(migrations = false)]
async fn two_relays_publish_each_row_once(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    for i in 0..20 {
        enqueue(&pool, &format!("o{i}"), "OrderPlaced", json!({"i": i})).await;
    }
    let mut relays = Vec::new();
    let mut asked = Vec::new();
    // Both relays hold their first claim at once: without SKIP LOCKED they would claim the same
    // rows.
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    for _ in 0..2 {
        let publisher =
            FaultyPublisher::new(stream.publisher()).with_first_call_barrier(barrier.clone());
        asked.push(publisher.asked());
        let mut config = stream.relay_config();
        // Small batches so that the two relays interleave.
        config.batch_size = 3;
        relays.push(Relay::new(pool.clone(), publisher, config));
    }
    let drains = relays.into_iter().map(|relay| {
        let pool = pool.clone();
        tokio::spawn(async move {
            while pending(&pool).await > 0 {
                relay.run_once().await.unwrap();
            }
        })
    });
    for drain in drains.collect::<Vec<_>>() {
        drain.await.unwrap();
    }

    let all: Vec<String> = asked
        .iter()
        .flat_map(|a| a.lock().unwrap().clone())
        .collect();
    let distinct: HashSet<&String> = all.iter().collect();
    assert_eq!(all.len(), 20, "publish calls: {all:?}");
    assert_eq!(distinct.len(), 20);
    assert!(
        asked.iter().all(|a| !a.lock().unwrap().is_empty()),
        "both relays took part"
    );
    let contents = stream.contents().await;
    let ids: HashSet<&String> = contents.iter().map(|(_, _, id)| id).collect();
    assert_eq!((contents.len(), ids.len()), (20, 20));
    stream.delete().await;
}

/// An event whose publish always fails becomes dead after max_attempts; cleanup then removes
/// published outbox rows and old inbox rows but keeps the dead one.
#[sqlx::test(migrations = false)]
async fn always_failing_event_becomes_dead_and_cleanup_keeps_it(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    enqueue(&pool, "doomed", "OrderPlaced", json!({})).await;
    enqueue(&pool, "fine", "OrderPlaced", json!({})).await;
    let publisher = FaultyPublisher::new(stream.publisher()).failing_forever("doomed");
    let mut config = stream.relay_config();
    // Dead after three refusals rather than the default ten: the count is what is tested.
    config.max_attempts = 3;
    let relay = Relay::new(pool.clone(), publisher, config);

    // A failed event is not due again for a moment (the backoff): passes until it is dead.
    let dead = &std::cell::Cell::new(0);
    let relay = &relay;
    eventually(
        "the doomed event dead",
        Duration::from_secs(10),
        || async move {
            dead.set(dead.get() + relay.run_once().await.unwrap().dead);
            (dead.get() > 0).then_some(())
        },
    )
    .await;
    assert_eq!(dead.get(), 1);
    let stats = outbox::stats(&pool).await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 1), "{stats:?}");
    let dead_rows = outbox::dead(&pool, &DeadFilter::all(), 0, 10)
        .await
        .unwrap();
    assert_eq!(dead_rows.len(), 1);
    assert_eq!(dead_rows[0].aggregate_id, "doomed");
    assert_eq!(dead_rows[0].attempts, 3);
    assert!(
        dead_rows[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("message refused")
    );
    // Nothing more to do: a dead event is not retried by the relay.
    assert_eq!(relay.run_once().await.unwrap().claimed, 0);

    let inbox = jetstream_outbox::Inbox::new(pool.clone(), "billing");
    let outcome = inbox
        .process("m1", &Digest::of(&[b"body"]), |_conn| {
            Box::pin(async { Ok::<_, std::convert::Infallible>(()) })
        })
        .await
        .unwrap();
    assert_eq!(outcome, jetstream_outbox::Outcome::Processed(()));

    // A partition of published events is emptied once its two hours are over.
    publish_earlier(&pool, 4).await;
    assert_eq!(outbox::cleanup(&pool, Duration::ZERO, 1).await.unwrap(), 1);
    assert_eq!(inbox.cleanup(Duration::ZERO, 100).await.unwrap(), 1);
    let statuses: Vec<String> = sqlx::query_scalar("SELECT status FROM outbox_events")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(statuses, ["dead"]);
    assert_eq!(inbox.stats().await.unwrap().processed, 0);
    stream.delete().await;
}

/// However long the broker is unreachable or its acknowledgements are lost, no event becomes
/// dead: only the broker's refusals count toward `max_attempts` (the default, 10). Three times
/// that many transient failures, then the event is published, and is on the stream once.
#[sqlx::test(migrations = false)]
async fn an_outage_never_makes_an_event_dead(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    enqueue(&pool, "o1", "OrderPlaced", json!({})).await;
    // The last failure stores the message, its acknowledgement lost.
    let mut faults = [Fault::Unreachable].repeat(29);
    faults.push(Fault::After);
    let publisher = FaultyPublisher::new(stream.publisher()).with_faults(faults);
    let config = stream.relay_config();
    assert_eq!(config.max_attempts, 10, "the default");
    let relay = Relay::new(pool.clone(), publisher, config);

    // A failed event is not due again for a moment (the backoff): passes until it is out.
    let totals = &std::cell::Cell::new((0, 0, 0));
    let relay = &relay;
    eventually(
        "the event published",
        Duration::from_secs(20),
        || async move {
            let report = relay.run_once().await.unwrap();
            let (dead, failed, published) = totals.get();
            totals.set((
                dead + report.dead,
                failed + report.failed,
                published + report.published,
            ));
            (totals.get().2 > 0).then_some(())
        },
    )
    .await;
    assert_eq!(totals.get(), (0, 30, 1));
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM outbox_events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(attempts, 0, "transient failures are not attempts");
    // The relay found the message the lost acknowledgement left rather than store a copy.
    assert_eq!(stream.contents().await.len(), 1);
    stream.delete().await;
}

/// A dead head parks its aggregate: later events of that aggregate are not published, others
/// are.
#[sqlx::test(migrations = false)]
async fn dead_head_parks_its_aggregate(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    enqueue(&pool, "o1", "OrderPlaced", json!({})).await;
    let publisher = FaultyPublisher::new(stream.publisher()).failing_forever("o1");
    let mut config = stream.relay_config();
    // Dead at the first refusal, in one pass: what follows a dead event is under test.
    config.max_attempts = 1;
    let relay = Relay::new(pool.clone(), publisher, config.clone());
    assert_eq!(relay.run_once().await.unwrap().dead, 1);

    enqueue(&pool, "o1", "OrderPaid", json!({})).await;
    enqueue(&pool, "o2", "OrderPlaced", json!({})).await;
    let healthy = Relay::new(pool.clone(), stream.publisher(), config);
    let report = healthy.run_once().await.unwrap();
    assert_eq!(report.published, 1, "{report:?}");
    let contents: Vec<_> = stream
        .contents()
        .await
        .into_iter()
        .map(|(s, t, _)| format!("{s}:{t}"))
        .collect();
    assert_eq!(contents, ["o2:OrderPlaced"]);
    let stats = outbox::stats(&pool).await.unwrap();
    assert_eq!(
        (stats.pending, stats.dead, stats.parked),
        (1, 1, 1),
        "{stats:?}"
    );
    // The dead head says what waits behind it, and carries its body for an operator to read.
    let dead = outbox::dead(&pool, &DeadFilter::all(), 0, 10)
        .await
        .unwrap();
    assert_eq!(
        (dead[0].aggregate_id.as_str(), dead[0].waiting_behind),
        ("o1", 1),
        "{dead:?}"
    );
    assert_eq!(dead[0].payload, None, "listings leave payloads out");
    let whole = outbox::dead_event(&pool, dead[0].id)
        .await
        .unwrap()
        .unwrap();
    assert!(whole.payload.is_some_and(|p| p.is_object()), "{dead:?}");
    // Still parked on the next pass.
    assert_eq!(healthy.run_once().await.unwrap().claimed, 0);

    // An operator retries the dead head: it is published, then the event it held back.
    let dead = outbox::dead(&pool, &DeadFilter::all(), 0, 10)
        .await
        .unwrap();
    assert!(outbox::retry_dead(&pool, dead[0].id).await.unwrap());
    assert!(
        !outbox::retry_dead(&pool, dead[0].id).await.unwrap(),
        "no longer dead"
    );
    healthy.run_once().await.unwrap();
    assert_eq!(
        stream.published().await,
        ["o2:OrderPlaced", "o1:OrderPlaced", "o1:OrderPaid"]
    );
    let stats = outbox::stats(&pool).await.unwrap();
    assert_eq!(
        (stats.pending, stats.dead, stats.parked),
        (0, 0, 0),
        "{stats:?}"
    );
    stream.delete().await;
}

/// The stats count up to `COUNT_LIMIT`, estimate a pending count past it (`tests/stats.rs`) and
/// say so; the oldest pending event's age is read all the same.
#[sqlx::test(migrations = false)]
async fn stats_say_when_they_stop_counting(pool: PgPool) {
    migrate(&pool).await;
    let stats = outbox::stats(&pool).await.unwrap();
    assert_eq!(
        (stats.pending, stats.oldest_pending_seconds, stats.exact),
        (0, 0.0, true)
    );
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
         SELECT gen_random_uuid(), 'order', 'o' || i, 'OrderPlaced', '{}',
                now() - interval '1 minute'
         FROM generate_series(1, $1) AS i",
    )
    .bind(outbox::COUNT_LIMIT + 5)
    .execute(&pool)
    .await
    .unwrap();
    let stats = outbox::stats(&pool).await.unwrap();
    let truth = outbox::COUNT_LIMIT + 5;
    assert!(!stats.exact, "{stats:?}");
    assert!(
        (stats.pending - truth).abs() <= stats.pending_margin,
        "{stats:?}"
    );
    assert!(stats.oldest_pending_seconds >= 60.0, "{stats:?}");
}

/// Skipping a dead head records it as skipped and lets the held-back events follow.
#[sqlx::test(migrations = false)]
async fn skipped_dead_head_releases_its_aggregate(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    enqueue(&pool, "o1", "OrderPlaced", json!({})).await;
    enqueue(&pool, "o1", "OrderPaid", json!({})).await;
    let mut config = stream.relay_config();
    // Dead at the first refusal, in one pass: what follows a dead event is under test.
    config.max_attempts = 1;
    let failing =
        FaultyPublisher::new(stream.publisher()).with_aggregate_faults("o1", [Fault::Before]);
    let report = Relay::new(pool.clone(), failing, config.clone())
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.dead, 1);

    let dead = outbox::dead(&pool, &DeadFilter::all(), 0, 10)
        .await
        .unwrap();
    assert!(outbox::skip_dead(&pool, dead[0].id).await.unwrap());
    Relay::new(pool.clone(), stream.publisher(), config)
        .run_once()
        .await
        .unwrap();
    assert_eq!(stream.published().await, ["o1:OrderPaid"]);
    let statuses: Vec<String> = sqlx::query_scalar("SELECT status FROM outbox_events ORDER BY seq")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(statuses, ["skipped", "published"]);
    stream.delete().await;
}

/// An operator retries or skips every dead event a filter matches, in one call each, while a
/// relay runs: only the matching events move, the calls are idempotent, and the retried events
/// are published ahead of the events they held back.
#[sqlx::test(migrations = false)]
async fn bulk_actions_take_the_dead_events_their_filter_matches(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    // The stream refuses the large events (the broker's own refusal, counted as an attempt);
    // the cart's event is refused by the test's publisher, with another error.
    let mut refusing = stream.stream().await.cached_info().config.clone();
    // The headers of a small event take about 320 bytes.
    refusing.max_message_size = 400;
    stream.jetstream.update_stream(&refusing).await.unwrap();
    let large = json!({"note": "x".repeat(400)});
    for (aggregate_type, aggregate, event_type, payload) in [
        ("order", "o1", "OrderPlaced", large.clone()),
        ("order", "o1", "OrderPaid", json!({})),
        ("order", "o2", "OrderPlaced", large.clone()),
        ("order", "o3", "OrderShipped", large.clone()),
        ("cart", "c1", "CartOpened", json!({})),
        ("order", "o4", "OrderPlaced", json!({})),
    ] {
        let mut tx = pool.begin().await.unwrap();
        let event = NewEvent::new(aggregate_type, aggregate, event_type, &payload).unwrap();
        jetstream_outbox::enqueue(&mut tx, &event).await.unwrap();
        tx.commit().await.unwrap();
    }
    let mut config = stream.relay_config();
    // Dead at the first refusal, in one pass: what follows a dead event is under test.
    config.max_attempts = 1;
    let publisher =
        FaultyPublisher::new(stream.publisher()).with_aggregate_faults("c1", [Fault::Before]);
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(Relay::new(pool.clone(), publisher, config).run(stop.clone()));
    let dead = eventually("four dead events", Duration::from_secs(20), || async {
        let dead = outbox::dead(&pool, &DeadFilter::all(), 0, 10)
            .await
            .unwrap();
        (dead.len() == 4).then_some(dead)
    })
    .await;
    let refusal = dead
        .iter()
        .find(|event| event.aggregate_id == "o2")
        .and_then(|event| event.last_error.clone())
        .unwrap();
    let injected = dead
        .iter()
        .find(|event| event.aggregate_id == "c1")
        .unwrap();
    assert!(!injected.last_error.as_ref().unwrap().contains(&refusal));
    let o2 = dead
        .iter()
        .find(|event| event.aggregate_id == "o2")
        .unwrap();
    assert_eq!(
        o2.error_class.as_deref(),
        Some(outbox::error_classes::TOO_LARGE)
    );
    // The broker's words, without the parts that name the event.
    let refused_by_stream = DeadFilter::all().error_contains(&refusal[refusal.len() - 20..]);

    let listed = outbox::dead(&pool, &refused_by_stream, 0, 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");
    let carts = DeadFilter::all().aggregate_type("cart");
    assert_eq!(outbox::skip_dead_matching(&pool, &carts).await.unwrap(), 1);
    assert_eq!(outbox::skip_dead_matching(&pool, &carts).await.unwrap(), 0);

    // The cause fixed, the orders placed are retried; the shipped one stays dead.
    refusing.max_message_size = -1;
    stream.jetstream.update_stream(&refusing).await.unwrap();
    let placed = refused_by_stream.clone().event_type("OrderPlaced");
    assert_eq!(
        outbox::retry_dead_matching(&pool, &placed).await.unwrap(),
        2
    );
    eventually(
        "the retried events published",
        Duration::from_secs(20),
        || async { (pending(&pool).await == 0).then_some(()) },
    )
    .await;
    assert_eq!(
        outbox::retry_dead_matching(&pool, &placed).await.unwrap(),
        0
    );
    let published = stream.published().await;
    let position = |entry: &str| published.iter().position(|p| p == entry);
    assert_eq!(published.len(), 4, "each event once: {published:?}");
    for entry in ["o4:OrderPlaced", "o2:OrderPlaced"] {
        assert!(position(entry).is_some(), "{published:?}");
    }
    assert!(
        position("o1:OrderPlaced") < position("o1:OrderPaid") && position("o1:OrderPaid").is_some(),
        "o1's events in order: {published:?}"
    );
    let still_dead = outbox::dead(&pool, &DeadFilter::all(), 0, 10)
        .await
        .unwrap();
    assert_eq!(
        still_dead
            .iter()
            .map(|e| e.aggregate_id.as_str())
            .collect::<Vec<_>>(),
        ["o3"]
    );
    let statuses: Vec<(String, String)> =
        sqlx::query_as("SELECT aggregate_id, status FROM outbox ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(
        statuses.contains(&("c1".into(), "skipped".into())),
        "{statuses:?}"
    );
    stop.cancel();
    running.await.unwrap();
    stream.delete().await;
}

/// Each message carries the CloudEvents attributes and Nats-Msg-Id of DESIGN.md.
#[sqlx::test(migrations = false)]
async fn messages_carry_cloudevents_headers(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut tx = pool.begin().await.unwrap();
    let event =
        jetstream_outbox::NewEvent::new("order", "o9", "OrderPlaced", &json!({"orderId": "o9"}))
            .unwrap()
            .with_traceparent(Some(traceparent.into()));
    let id = jetstream_outbox::enqueue(&mut tx, &event).await.unwrap();
    tx.commit().await.unwrap();
    Relay::new(pool.clone(), stream.publisher(), stream.relay_config())
        .run_once()
        .await
        .unwrap();

    let message = stream.stream().await.get_raw_message(1).await.unwrap();
    assert_eq!(
        message.subject.as_str(),
        format!("{}.OrderPlaced.o9", stream.prefix)
    );
    let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned());
    assert_eq!(header(headers::SPECVERSION).as_deref(), Some("1.0"));
    assert_eq!(header(headers::ID), Some(id.to_string()));
    assert_eq!(
        header(async_nats::header::NATS_MESSAGE_ID.as_ref()),
        Some(id.to_string())
    );
    assert_eq!(header(headers::TYPE).as_deref(), Some("OrderPlaced"));
    assert_eq!(header(headers::SOURCE).as_deref(), Some("/test"));
    assert_eq!(header(headers::SUBJECT).as_deref(), Some("o9"));
    assert!(chrono::DateTime::parse_from_rfc3339(&header(headers::TIME).unwrap()).is_ok());
    assert_eq!(header(headers::TRACEPARENT).as_deref(), Some(traceparent));
    let body: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
    assert_eq!(body, json!({"orderId": "o9"}));
    stream.delete().await;
}

/// With polling set to minutes, a commit still reaches the stream at once: committed through
/// the relay's own `Wakeup` (its process), or through a `Wakeup` of another process's, which
/// notifies after the commit (the relay listens).
#[sqlx::test(migrations = false)]
async fn commit_wakes_the_relay_long_before_the_poll_interval(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let mut config = stream.relay_config();
    config.poll_interval = Duration::from_secs(600);
    let here = Wakeup::in_process();
    let relay = Relay::new(pool.clone(), stream.publisher(), config).with_wakeup(&here);
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(relay.run(stop.clone()));
    let elsewhere = Wakeup::across_processes(pool.clone());

    // Let the relay finish its first (empty) pass, so only a wake-up can wake it.
    relay_listening(&pool).await;
    for (i, wakeup) in [&here, &elsewhere, &here, &elsewhere]
        .into_iter()
        .enumerate()
    {
        enqueue_and_commit(&pool, wakeup, &format!("o{i}")).await;
        eventually(
            "the event on the stream",
            Duration::from_secs(10),
            || async { (stream.contents().await.len() == i + 1).then_some(()) },
        )
        .await;
    }
    stop.cancel();
    running.await.unwrap();
    stream.delete().await;
}

/// A retry in the caller's transaction is undone with it, leaves the transaction usable, and
/// once committed wakes the relay though it polls every ten minutes.
#[sqlx::test(migrations = false)]
async fn a_retry_in_the_callers_transaction_commits_with_it_and_wakes_the_relay(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    enqueue(&pool, "o1", "OrderPlaced", json!({})).await;
    let id: uuid::Uuid =
        sqlx::query_scalar("UPDATE outbox SET status = 'dead', attempts = 10 RETURNING id")
            .fetch_one(&pool)
            .await
            .unwrap();
    let mut config = stream.relay_config();
    config.poll_interval = Duration::from_secs(600);
    let stop = tokio_util::sync::CancellationToken::new();
    let running =
        tokio::spawn(Relay::new(pool.clone(), stream.publisher(), config).run(stop.clone()));
    relay_listening(&pool).await;

    // In this transaction the wake fails (a pg_notify of its own, found first), and the
    // transaction goes on.
    sqlx::raw_sql(
        "CREATE FUNCTION public.pg_notify(text, text) RETURNS void LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'no wake'; END $$",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL search_path = public, pg_catalog")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(outbox::retry_dead_in(&mut tx, id).await.unwrap());
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(outbox::stats(&pool).await.unwrap().dead, 1);

    let mut tx = pool.begin().await.unwrap();
    assert!(outbox::retry_dead_in(&mut tx, id).await.unwrap());
    tx.commit().await.unwrap();
    eventually(
        "the event on the stream",
        Duration::from_secs(10),
        || async { (stream.contents().await.len() == 1).then_some(()) },
    )
    .await;
    stop.cancel();
    running.await.unwrap();
    stream.delete().await;
}

/// Waits until a relay of this database listens for wake-ups.
async fn relay_listening(pool: &PgPool) {
    eventually("the relay to listen", Duration::from_secs(10), || async {
        let listening: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND datname = current_database()",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        (listening > 0).then_some(())
    })
    .await;
}

/// Enqueues an `OrderPlaced` of `aggregate` and commits through `wakeup`.
async fn enqueue_and_commit(pool: &PgPool, wakeup: &Wakeup, aggregate: &str) {
    let mut tx = pool.begin().await.unwrap();
    let event = NewEvent::new("order", aggregate, "OrderPlaced", &json!({})).unwrap();
    jetstream_outbox::enqueue(&mut tx, &event).await.unwrap();
    jetstream_outbox::commit(tx, wakeup).await.unwrap();
}

/// Four relays over 200 aggregates x 5 events with 10% of publishes failing at random (before
/// or after the broker): all 1000 reach the stream once, each aggregate's in commit order, and
/// no two relays ever publish the same row at once. Two relays call `run_once`; two `run`,
/// which records one full pass while it claims and publishes the next.
#[sqlx::test(migrations = false)]
async fn four_relays_with_random_failures_keep_per_aggregate_order(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    for round in 0..5 {
        for aggregate in 0..200 {
            enqueue(
                &pool,
                &format!("a{aggregate}"),
                &format!("E{round}"),
                json!({}),
            )
            .await;
        }
    }
    let in_flight = Arc::new(Mutex::new(InFlight::default()));
    let mut config = stream.relay_config();
    // Batches of 50, so that the thousand events take many passes of four relays; refusals
    // never make an event dead, which would park its aggregate (tested on its own), so that
    // every event is published and the order of all of them is checked.
    config.batch_size = 50;
    config.max_attempts = 1000;
    config.backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(20));
    let relay = || {
        let publisher = FaultyPublisher::new(stream.publisher())
            .with_random_faults(0.1)
            .with_in_flight(in_flight.clone());
        Relay::new(pool.clone(), publisher, config.clone())
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let mut pipelined_asked = Vec::new();
    let running: Vec<_> = (0..2)
        .map(|_| {
            let publisher = FaultyPublisher::new(stream.publisher())
                .with_random_faults(0.1)
                .with_in_flight(in_flight.clone());
            pipelined_asked.push(publisher.asked());
            let relay = Relay::new(pool.clone(), publisher, config.clone());
            tokio::spawn(relay.run(stop.clone()))
        })
        .collect();
    let drains: Vec<_> = (0..2)
        .map(|_| {
            let (relay, pool) = (relay(), pool.clone());
            tokio::spawn(async move {
                let mut failed = 0;
                while pending(&pool).await > 0 {
                    failed += relay.run_once().await.unwrap().failed;
                }
                failed
            })
        })
        .collect();
    let mut failed = 0;
    for drain in drains {
        failed += drain.await.unwrap();
    }
    stop.cancel();
    for relay in running {
        relay.await.unwrap();
    }
    assert!(failed > 0, "faults were injected");
    assert!(
        pipelined_asked
            .iter()
            .all(|asked| !asked.lock().unwrap().is_empty()),
        "the relays calling run took part"
    );
    assert_eq!(
        in_flight.lock().unwrap().overlaps,
        0,
        "two relays published one row at once"
    );

    let contents = stream.contents().await;
    assert_eq!(contents.len(), 1000);
    let mut per_aggregate: HashMap<String, Vec<String>> = HashMap::new();
    for (aggregate, event_type, _) in contents {
        per_aggregate.entry(aggregate).or_default().push(event_type);
    }
    assert_eq!(per_aggregate.len(), 200);
    for (aggregate, events) in per_aggregate {
        assert_eq!(
            events,
            ["E0", "E1", "E2", "E3", "E4"],
            "order of {aggregate}"
        );
    }
    stream.delete().await;
}

/// One aggregate failing forever, with more queued events than a batch holds, does not stop
/// 500 other aggregates.
#[sqlx::test(migrations = false)]
async fn one_failing_aggregate_does_not_stop_the_others(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    for i in 0..600 {
        enqueue(&pool, "stuck", "OrderPaid", json!({"i": i})).await;
    }
    for i in 0..500 {
        enqueue(&pool, &format!("o{i}"), "OrderPlaced", json!({})).await;
    }
    let mut config = stream.relay_config();
    // A batch smaller than the stuck aggregate's backlog; its head never dead (which would
    // park it and end the contest this test is about).
    config.batch_size = 500;
    config.max_attempts = 1000;
    let publisher = FaultyPublisher::new(stream.publisher()).failing_forever("stuck");
    let relay = Relay::new(pool.clone(), publisher, config);
    // Every pass retries the stuck head when it is due and still makes progress.
    for _ in 0..3 {
        relay.run_once().await.unwrap();
    }
    let contents = stream.contents().await;
    assert_eq!(contents.len(), 500);
    assert!(
        contents
            .iter()
            .all(|(aggregate, _, _)| aggregate != "stuck")
    );
    assert_eq!(pending(&pool).await, 600);
    stream.delete().await;
}

/// The relay listens again after its listening connection is killed, so other processes' commits
/// keep waking it with polling set to minutes.
#[sqlx::test(migrations = false)]
async fn relay_listens_again_after_losing_its_connection(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let mut config = stream.relay_config();
    config.poll_interval = Duration::from_secs(600);
    let stop = tokio_util::sync::CancellationToken::new();
    let relay = Relay::new(pool.clone(), stream.publisher(), config);
    let running = tokio::spawn(relay.run(stop.clone()));
    let listener_pid = || async {
        sqlx::query_scalar::<_, i32>(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND datname = current_database()",
        )
        .fetch_optional(&pool)
        .await
        .unwrap()
    };

    let first = eventually("the relay to listen", Duration::from_secs(10), listener_pid).await;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(first)
        .execute(&pool)
        .await
        .unwrap();
    eventually(
        "a new listening connection",
        Duration::from_secs(20),
        || async { listener_pid().await.filter(|pid| *pid != first) },
    )
    .await;
    // Committed by another process, which notifies after the commit.
    enqueue_and_commit(&pool, &Wakeup::across_processes(pool.clone()), "o1").await;
    eventually(
        "the event on the stream",
        Duration::from_secs(10),
        || async { (stream.contents().await.len() == 1).then_some(()) },
    )
    .await;
    stop.cancel();
    running.await.unwrap();
    stream.delete().await;
}

/// A backlog of one aggregate, four batches long, with polling set to minutes: each pass's
/// successor is held back until the pass is recorded, and the relay claims it again then
/// instead of waiting for the poll. The stream gets all 20 events in commit order.
#[sqlx::test(migrations = false)]
async fn backlog_of_one_aggregate_drains_without_waiting_for_the_poll(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let expected: Vec<String> = (0..20).map(|i| format!("o1:Event{i}")).collect();
    for i in 0..20 {
        enqueue(&pool, "o1", &format!("Event{i}"), json!({})).await;
    }
    let mut config = stream.relay_config();
    config.batch_size = 5;
    config.poll_interval = Duration::from_secs(600);
    let relay = Relay::new(pool.clone(), stream.publisher(), config);
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(relay.run(stop.clone()));

    eventually(
        "the backlog on the stream",
        Duration::from_secs(30),
        || async { (stream.published().await.len() == 20).then_some(()) },
    )
    .await;
    assert_eq!(stream.published().await, expected);
    stop.cancel();
    running.await.unwrap();
    assert_eq!(pending(&pool).await, 0);
    stream.delete().await;
}

/// With `delete_published`, what the relay publishes leaves the table in the same pass; an event
/// whose publish failed stays pending until its retry succeeds.
#[sqlx::test(migrations = false)]
async fn deleting_relay_keeps_only_unpublished_rows(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    enqueue(&pool, "o1", "OrderPlaced", json!({})).await;
    enqueue(&pool, "o2", "OrderPlaced", json!({})).await;
    let mut config = stream.relay_config();
    config.delete_published = true;
    let publisher =
        FaultyPublisher::new(stream.publisher()).with_aggregate_faults("o2", [Fault::Before]);
    let relay = Relay::new(pool.clone(), publisher, config);
    let rows = || async {
        sqlx::query_scalar::<_, String>("SELECT aggregate_id || ':' || status FROM outbox")
            .fetch_all(&pool)
            .await
            .unwrap()
    };

    let first = relay.run_once().await.unwrap();
    assert_eq!((first.published, first.failed), (1, 1), "{first:?}");
    assert_eq!(rows().await, ["o2:pending"]);
    eventually("the retry", Duration::from_secs(10), || async {
        relay.run_once().await.unwrap();
        rows().await.is_empty().then_some(())
    })
    .await;
    assert_eq!(
        count(&pool, "outbox_published").await,
        0,
        "deleted, not moved"
    );
    assert_eq!(
        stream.published().await,
        ["o1:OrderPlaced", "o2:OrderPlaced"]
    );
    stream.delete().await;
}
