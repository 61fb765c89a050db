//! Finding dead events and dead letters: grouped by cause (type and error class, or error text
//! without a class, the largest group first), and filtered by class, aggregate and time.

mod common;

use common::migrate;
use jetstream_outbox::inbox::{DeadLetterFilter, NewDeadLetter};
use jetstream_outbox::outbox::DeadFilter;
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

#[sqlx::test(migrations = false)]
async fn dead_events_are_found_by_aggregate_and_time(pool: PgPool) {
    migrate(&pool).await;
    for (aggregate, hours_ago) in [("o1", 3), ("o2", 2), ("o1", 1)] {
        sqlx::query(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, status,
                                 last_error, created_at)
             VALUES (gen_random_uuid(), 'order', $1, 'OrderPlaced', '{}', 'dead', 'refused',
                     now() - make_interval(hours => $2))",
        )
        .bind(aggregate)
        .bind(hours_ago)
        .execute(&pool)
        .await
        .unwrap();
    }
    let now = chrono::Utc::now();
    let ago = |minutes| Some(now - chrono::Duration::minutes(minutes));
    let found = |filter: DeadFilter| {
        let pool = pool.clone();
        async move {
            outbox::dead(&pool, &filter, 0, 10)
                .await
                .unwrap()
                .into_iter()
                .map(|e| e.aggregate_id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        found(DeadFilter::all().aggregate_id("o1")).await,
        ["o1", "o1"]
    );
    assert_eq!(
        found(DeadFilter::all().enqueued(ago(150), ago(90))).await,
        ["o2"]
    );
    assert_eq!(
        found(
            DeadFilter::all()
                .aggregate_id("o1")
                .enqueued(ago(150), None)
        )
        .await,
        ["o1"]
    );
    // A bulk action takes what the filter finds, and nothing else.
    let skipped = outbox::skip_dead_matching(&pool, &DeadFilter::all().aggregate_id("o2"))
        .await
        .unwrap();
    assert_eq!(skipped, 1);
    assert_eq!(found(DeadFilter::all()).await, ["o1", "o1"]);
}

#[sqlx::test(migrations = false)]
async fn dead_letters_are_found_by_time(pool: PgPool) {
    migrate(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    for subject in ["old", "new"] {
        inbox
            .dead_letter(NewDeadLetter::new(subject, b"{", "invalid"))
            .await
            .unwrap();
    }
    sqlx::query(
        "UPDATE inbox_dead SET created_at = now() - interval '2 hours' WHERE subject = 'old'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let hour_ago = chrono::Utc::now() - chrono::Duration::hours(1);
    let subjects = |filter: DeadLetterFilter| {
        let inbox = inbox.clone();
        async move {
            inbox
                .dead(&filter, 0, 10)
                .await
                .unwrap()
                .into_iter()
                .map(|l| l.subject)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        subjects(DeadLetterFilter::all().dead_lettered(Some(hour_ago), None)).await,
        ["new"]
    );
    assert_eq!(
        subjects(DeadLetterFilter::all().dead_lettered(None, Some(hour_ago))).await,
        ["old"]
    );
    let skipped = inbox
        .skip_dead_letters(&DeadLetterFilter::all().dead_lettered(None, Some(hour_ago)))
        .await
        .unwrap();
    assert_eq!(skipped, 1);
    assert_eq!(subjects(DeadLetterFilter::all()).await, ["new"]);
}

/// Errors of one kind name different values (a size, a name): the class groups them, and a
/// filter on it takes exactly that group, where text the errors share would take more.
#[sqlx::test(migrations = false)]
async fn dead_events_are_grouped_and_found_by_error_class(pool: PgPool) {
    migrate(&pool).await;
    for (i, (class, error)) in [
        (
            Some("not-accepted"),
            "message not accepted by the broker: 2000000 bytes",
        ),
        (
            Some("not-accepted"),
            "message not accepted by the broker: 3000000 bytes",
        ),
        (
            Some("unpublishable"),
            "aggregate_id \"a b\" is not a token: not accepted",
        ),
        (
            None,
            "message not accepted by the broker: written before classes",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        sqlx::query(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, status,
                                 last_error, error_class)
             VALUES (gen_random_uuid(), 'order', $1, 'OrderPlaced', '{}', 'dead', $2, $3)",
        )
        .bind(format!("o{i}"))
        .bind(error)
        .bind(class)
        .execute(&pool)
        .await
        .unwrap();
    }
    let groups = outbox::dead_groups(&pool, 10).await.unwrap();
    let seen: Vec<_> = groups
        .iter()
        .map(|g| (g.error_class.as_deref(), g.count))
        .collect();
    assert_eq!(
        seen,
        [
            (Some("not-accepted"), 2),
            (Some("unpublishable"), 1),
            (None, 1)
        ]
    );
    assert!(
        groups[0]
            .error
            .starts_with("message not accepted by the broker: ")
    );
    assert_eq!(
        groups[2].error,
        "message not accepted by the broker: written before classes"
    );

    let found = |filter: DeadFilter| {
        let pool = pool.clone();
        async move {
            outbox::dead(&pool, &filter, 0, 10)
                .await
                .unwrap()
                .into_iter()
                .map(|e| (e.aggregate_id, e.error_class))
                .collect::<Vec<_>>()
        }
    };
    let not_accepted = || Some("not-accepted".to_owned());
    assert_eq!(
        found(DeadFilter::all().error_class("not-accepted")).await,
        [
            ("o0".to_owned(), not_accepted()),
            ("o1".to_owned(), not_accepted())
        ]
    );
    // The text the group's errors share would also take the unclassed one, and more.
    assert_eq!(
        found(DeadFilter::all().error_contains("not accepted"))
            .await
            .len(),
        4
    );
    let skipped = outbox::skip_dead_matching(&pool, &DeadFilter::all().error_class("not-accepted"))
        .await
        .unwrap();
    assert_eq!(skipped, 2);
    assert_eq!(found(DeadFilter::all()).await.len(), 2);
}

#[sqlx::test(migrations = false)]
async fn dead_letters_are_grouped_and_found_by_error_class(pool: PgPool) {
    migrate(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    for (i, (class, error)) in [
        (
            Some("body-too-large"),
            "body of 2000000 bytes is over 1 MiB",
        ),
        (
            Some("body-too-large"),
            "body of 3000000 bytes is over 1 MiB",
        ),
        (None, "body of 4000000 bytes is over 1 MiB"),
    ]
    .into_iter()
    .enumerate()
    {
        let subject = format!("orders.x.o{i}");
        let mut letter = NewDeadLetter::new(&subject, b"{", error);
        if let Some(class) = class {
            letter = letter.with_error_class(class);
        }
        inbox.dead_letter(letter).await.unwrap();
    }
    let groups = inbox.dead_groups(10).await.unwrap();
    let seen: Vec<_> = groups
        .iter()
        .map(|g| (g.error_class.as_deref(), g.count))
        .collect();
    assert_eq!(seen, [(Some("body-too-large"), 2), (None, 1)]);
    let classes = |filter: DeadLetterFilter| {
        let inbox = inbox.clone();
        async move {
            inbox
                .dead(&filter, 0, 10)
                .await
                .unwrap()
                .into_iter()
                .map(|l| (l.subject, l.error_class))
                .collect::<Vec<_>>()
        }
    };
    let too_large = || Some("body-too-large".to_owned());
    assert_eq!(
        classes(DeadLetterFilter::all().error_class("body-too-large")).await,
        [
            ("orders.x.o0".to_owned(), too_large()),
            ("orders.x.o1".to_owned(), too_large())
        ]
    );
    let skipped = inbox
        .skip_dead_letters(&DeadLetterFilter::all().error_class("body-too-large"))
        .await
        .unwrap();
    assert_eq!(skipped, 2);
    assert_eq!(classes(DeadLetterFilter::all()).await.len(), 1);
}
