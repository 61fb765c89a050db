//! Dead events and dead letters grouped by cause: by type and error, the largest group first.

mod common;

use common::migrate;
use jetstream_outbox::inbox::{DeadLetterFilter, NewDeadLetter};
use jetstream_outbox::{Inbox, outbox};
use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn dead_events_are_grouped_by_type_and_error(pool: PgPool) {
    migrate(&pool).await;
    for (i, (event_type, error)) in [
        ("OrderPaid", "too large"),
        ("OrderPlaced", "refused"),
        ("OrderPlaced", "refused"),
        ("OrderPlaced", "too large"),
        ("OrderPlaced", "refused"),
    ]
    .into_iter()
    .enumerate()
    {
        sqlx::query(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, status,
                                 last_error)
             VALUES (gen_random_uuid(), 'order', $1, $2, '{}', 'dead', $3)",
        )
        .bind(format!("o{i}"))
        .bind(event_type)
        .bind(error)
        .execute(&pool)
        .await
        .unwrap();
    }
    let groups = outbox::dead_groups(&pool, 10).await.unwrap();
    let seen: Vec<_> = groups
        .iter()
        .map(|g| (g.event_type.as_deref(), g.error.as_str(), g.count))
        .collect();
    assert_eq!(
        seen,
        [
            (Some("OrderPlaced"), "refused", 3),
            // Two groups of one: the older first.
            (Some("OrderPaid"), "too large", 1),
            (Some("OrderPlaced"), "too large", 1),
        ]
    );
    assert!(groups[0].oldest <= groups[0].newest);
    assert_eq!(outbox::dead_groups(&pool, 1).await.unwrap().len(), 1);
}

#[sqlx::test(migrations = false)]
async fn open_dead_letters_are_grouped_by_type_and_error(pool: PgPool) {
    migrate(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    for (i, (event_type, error)) in [
        (Some("OrderPlaced"), "invalid payload"),
        (None, "no ce-type"),
        (Some("OrderPlaced"), "invalid payload"),
    ]
    .into_iter()
    .enumerate()
    {
        let subject = format!("orders.x.o{i}");
        let mut letter = NewDeadLetter::new(&subject, b"{", error);
        if let Some(event_type) = event_type {
            letter.headers = serde_json::json!({ "ce-type": [event_type] });
        }
        inbox.dead_letter(letter).await.unwrap();
    }
    let closed = inbox
        .dead(&DeadLetterFilter::default(), 0, 1)
        .await
        .unwrap()[0]
        .id;
    assert!(inbox.skip_dead_letter(closed).await.unwrap());
    let groups = inbox.dead_groups(10).await.unwrap();
    let seen: Vec<_> = groups
        .iter()
        .map(|g| (g.event_type.as_deref(), g.error.as_str(), g.count))
        .collect();
    // The skipped letter is closed: not counted.
    assert_eq!(
        seen,
        [
            (None, "no ce-type", 1),
            (Some("OrderPlaced"), "invalid payload", 1)
        ]
    );
    assert!(
        Inbox::new(pool, "audit")
            .dead_groups(10)
            .await
            .unwrap()
            .is_empty(),
        "per consumer"
    );
}
