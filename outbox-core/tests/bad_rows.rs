//! Every row the relay can meet is published or visible as dead with its reason, however it was
//! written: the table refuses what `NewEvent` refuses, and a row written before it did (or by
//! hand, around it) never stops the relay. Against the real PostgreSQL and nats-server.

mod common;

use std::time::Duration;

use common::{TestStream, enqueue, migrate};
use jetstream_outbox::outbox::{self, DeadFilter};
use jetstream_outbox::testing::eventually;
use jetstream_outbox::{Relay, event_id};
use serde_json::json;
use sqlx::PgPool;

/// The SQLSTATE and message `sql` fails with.
async fn refusal(pool: &PgPool, sql: &str) -> (String, String) {
    let error = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .expect_err(sql);
    let database = error.as_database_error().expect("a database error");
    (
        database.code().unwrap_or_default().into_owned(),
        database.message().to_owned(),
    )
}

/// `outbox_enqueue`, the one-statement path the crate documents, refuses a space or a dot in a
/// name (subject syntax) and an event type of 300 characters, naming what it refused, and
/// writes nothing; it leaves out a traceparent with a line break (which would have become a
/// header line of its own), as `NewEvent::with_traceparent` does.
#[sqlx::test(migrations = false)]
async fn outbox_enqueue_refuses_what_new_event_refuses(pool: PgPool) {
    migrate(&pool).await;
    let call = |aggregate_id: &str, event_type: &str, traceparent: &str| {
        format!(
            "SELECT outbox_enqueue('{}', 'order', {aggregate_id}, {event_type}, '{{}}', {traceparent})",
            event_id()
        )
    };
    let long = format!("'{}'", "E".repeat(300));
    for (sql, refused) in [
        (
            call("'o 1'", "'OrderPlaced'", "NULL"),
            "outbox_aggregate_id_is_a_token",
        ),
        (
            call("'o1'", "'Order.Placed'", "NULL"),
            "outbox_event_type_is_a_token",
        ),
        (call("'o1'", &long, "NULL"), "outbox_event_type_is_a_token"),
    ] {
        let (code, message) = refusal(&pool, &sql).await;
        assert_eq!(code, "23514", "{sql}: {message}");
        assert!(message.contains(refused), "{sql}: {message}");
    }
    assert_eq!(common::count(&pool, "outbox").await, 0);
    let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for (aggregate_id, traceparent) in [
        ("o1", format!("'{good}'")),
        ("o2", r"E'00-a\r\nx: y'".into()),
    ] {
        let sql = call(&format!("'{aggregate_id}'"), "'OrderPlaced'", &traceparent);
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap();
    }
    let kept: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT aggregate_id, traceparent FROM outbox ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        kept,
        [("o1".into(), Some(good.into())), ("o2".into(), None)]
    );
}

/// A hand-written INSERT is held to the same rules.
#[sqlx::test(migrations = false)]
async fn a_direct_insert_is_refused_the_same(pool: PgPool) {
    migrate(&pool).await;
    let insert = |aggregate_type: &str| {
        format!(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
             VALUES (gen_random_uuid(), '{aggregate_type}', 'o1', 'OrderPlaced', '{{}}')"
        )
    };
    let (code, message) = refusal(&pool, &insert("or>der")).await;
    assert_eq!(code, "23514", "{message}");
    assert!(
        message.contains("outbox_aggregate_type_is_a_token"),
        "{message}"
    );
    assert_eq!(common::count(&pool, "outbox").await, 0);
}

/// Rows an earlier version let through (written here around the table's rules, as such rows
/// were; a traceparent the table does not check): a space in an aggregate id, a dot in an
/// event type, a traceparent with a line break.
/// The relay makes the two it cannot publish dead with their reason, publishes the third
/// without its traceparent, and keeps publishing every other event; it never stops.
#[sqlx::test(migrations = false)]
async fn a_row_the_relay_cannot_publish_is_dead_with_its_reason(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    sqlx::raw_sql(
        "ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_aggregate_id_is_a_token,
                            DROP CONSTRAINT IF EXISTS outbox_event_type_is_a_token",
    )
    .execute(&pool)
    .await
    .unwrap();
    for (aggregate_id, event_type, traceparent) in [
        ("o 1", "OrderPlaced", None),
        ("o2", "Order.Placed", None),
        ("o3", "OrderPlaced", Some("00-a\r\nx: y")),
    ] {
        sqlx::query(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, traceparent)
             VALUES ($1, 'order', $2, $3, '{}', $4)",
        )
        .bind(event_id())
        .bind(aggregate_id)
        .bind(event_type)
        .bind(traceparent)
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::raw_sql(
        "ALTER TABLE outbox
             ADD CONSTRAINT outbox_aggregate_id_is_a_token
                 CHECK (status <> 'pending' OR aggregate_id ~ '^[A-Za-z0-9_:@-]{1,128}$') NOT VALID,
             ADD CONSTRAINT outbox_event_type_is_a_token
                 CHECK (status <> 'pending' OR event_type ~ '^[A-Za-z0-9_:@-]{1,128}$') NOT VALID",
    )
    .execute(&pool)
    .await
    .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let relay = Relay::new(pool.clone(), stream.publisher(), stream.relay_config());
    let running = tokio::spawn(relay.run(stop.clone()));
    for i in 4..=23 {
        enqueue(&pool, &format!("o{i}"), "OrderPlaced", json!({})).await;
    }

    let published = eventually("21 events published", Duration::from_secs(20), || async {
        let published = stream.published().await;
        (published.len() == 21).then_some(published)
    })
    .await;
    assert!(
        published.contains(&"o3:OrderPlaced".to_owned()),
        "{published:?}"
    );
    let dead = outbox::dead(&pool, &DeadFilter::all(), 0, 10)
        .await
        .unwrap();
    let reasons: Vec<(String, String)> = dead
        .iter()
        .map(|e| {
            (
                e.aggregate_id.clone(),
                e.last_error.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons[0].0 == "o 1" && reasons[0].1.contains("aggregate_id"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].0 == "o2" && reasons[1].1.contains("event_type"),
        "{reasons:?}"
    );
    assert!(
        dead.iter()
            .all(|e| e.error_class.as_deref() == Some(outbox::error_classes::UNPUBLISHABLE)),
        "{dead:?}"
    );
    assert!(!running.is_finished(), "the relay still runs");
    stop.cancel();
    running.await.unwrap();
    stream.delete().await;
}

/// A due time written while the database's clock ran a day ahead (since corrected) is further
/// ahead than any delay the relay sets: the event is published at once, not a day later.
#[sqlx::test(migrations = false)]
async fn a_due_time_beyond_the_longest_backoff_is_not_trusted(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    enqueue(&pool, "o1", "OrderPlaced", json!({})).await;
    sqlx::query("UPDATE outbox SET next_attempt_at = now() + interval '1 day'")
        .execute(&pool)
        .await
        .unwrap();
    let relay = Relay::new(pool.clone(), stream.publisher(), stream.relay_config());

    let report = relay.run_once().await.unwrap();

    assert_eq!(report.published, 1, "{report:?}");
    stream.delete().await;
}

/// A burst whose last full claim holds rows back (their earlier events in the pass before) and
/// publishes the others: the rows held back are claimed again as soon as the passes ahead of
/// them are recorded, not at the next poll. `poll_interval` is set to a minute so that a wait
/// for it would show; no commit is signalled after the burst.
#[sqlx::test(migrations = false)]
async fn rows_held_back_in_a_full_claim_are_claimed_again_at_once(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    // A first claim of sixty orders' first events; a second, full one of thirty of their second
    // events (held back behind the first claim) and thirty new orders (published).
    for order in 0..60 {
        enqueue(&pool, &format!("o{order}"), "OrderPlaced", json!({})).await;
    }
    for order in 0..30 {
        enqueue(&pool, &format!("o{order}"), "OrderPaid", json!({})).await;
        enqueue(&pool, &format!("n{order}"), "OrderPlaced", json!({})).await;
    }
    let mut config = stream.relay_config();
    config.batch_size = 60;
    config.poll_interval = Duration::from_secs(60);
    let stop = tokio_util::sync::CancellationToken::new();
    let relay = Relay::new(pool.clone(), stream.publisher(), config);
    let running = tokio::spawn(relay.run(stop.clone()));

    eventually(
        "the burst published well within the poll interval",
        Duration::from_secs(15),
        || async { (outbox::stats(&pool).await.ok()?.pending == 0).then_some(()) },
    )
    .await;
    stop.cancel();
    running.await.unwrap();
    assert_eq!(stream.published().await.len(), 120);
    stream.delete().await;
}
