//! The inbox against the real PostgreSQL.

mod common;

use common::migrate;
use outbox_core::inbox::Digest;
use outbox_core::{Inbox, InboxError, Outcome};
use sqlx::PgPool;

async fn count(pool: &PgPool, table: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {table}");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A counter with no constraint behind it: the effect of the inbox tests that is not idempotent.
async fn create_counter(pool: &PgPool) {
    sqlx::raw_sql("CREATE TABLE counter (n int NOT NULL); INSERT INTO counter VALUES (0)")
        .execute(pool)
        .await
        .unwrap();
}

/// Delivers message `id` with `digest` to `inbox`, whose effect adds one to the counter.
async fn count_up(inbox: &Inbox, id: &str, digest: &Digest) -> Outcome<()> {
    inbox
        .process(id, digest, |conn| {
            Box::pin(async move {
                sqlx::query("UPDATE counter SET n = n + 1")
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .await
        .unwrap()
}

async fn counter(pool: &PgPool) -> i32 {
    sqlx::query_scalar("SELECT n FROM counter")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn second_delivery_is_a_duplicate_and_runs_nothing(pool: PgPool) {
    migrate(&pool).await;
    sqlx::query("CREATE TABLE effects (n int)")
        .execute(&pool)
        .await
        .unwrap();
    let inbox = Inbox::new(pool.clone(), "billing");
    for expected in [
        Outcome::Processed(()),
        Outcome::Duplicate,
        Outcome::Duplicate,
    ] {
        let outcome = inbox
            .process("m1", &Digest::of(&[b"body"]), |conn| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO effects VALUES (1)")
                        .execute(conn)
                        .await
                        .map(drop)
                })
            })
            .await
            .unwrap();
        assert_eq!(outcome, expected);
    }
    assert_eq!(count(&pool, "effects").await, 1);
    let stats = inbox.stats().await.unwrap();
    assert_eq!((stats.processed, stats.duplicate), (1, 2));
    // Another consumer has its own inbox.
    let other = Inbox::new(pool.clone(), "audit");
    let outcome = other
        .process("m1", &Digest::of(&[b"body"]), |_| {
            Box::pin(async { Ok::<_, std::convert::Infallible>(()) })
        })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Processed(()));
}

#[sqlx::test(migrations = false)]
async fn failed_effect_records_nothing_and_can_run_again(pool: PgPool) {
    migrate(&pool).await;
    sqlx::query("CREATE TABLE effects (n int)")
        .execute(&pool)
        .await
        .unwrap();
    let inbox = Inbox::new(pool.clone(), "billing");
    let failed = inbox
        .process("m1", &Digest::of(&[b"body"]), |conn| {
            Box::pin(async move {
                sqlx::query("INSERT INTO effects VALUES (1)")
                    .execute(conn)
                    .await
                    .unwrap();
                Err::<(), _>("cannot apply yet")
            })
        })
        .await;
    assert!(matches!(
        failed,
        Err(InboxError::Effect("cannot apply yet"))
    ));
    assert_eq!(
        (count(&pool, "effects").await, count(&pool, "inbox").await),
        (0, 0)
    );

    let retried = inbox
        .process("m1", &Digest::of(&[b"body"]), |conn| {
            Box::pin(async move {
                sqlx::query("INSERT INTO effects VALUES (1)")
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .await
        .unwrap();
    assert_eq!(retried, Outcome::Processed(()));
    assert_eq!(count(&pool, "effects").await, 1);
}

/// The inbox proven on its own, with an effect that is not idempotent (a counter, no
/// constraint behind it): eight deliveries of each message at once (competing consumers, a
/// redelivery racing the first) add one; then every message again, as a consumer recreated
/// from the stream's start or a crash after commit and before the ack would deliver it, adds
/// nothing.
#[sqlx::test(migrations = false)]
async fn concurrent_and_replayed_deliveries_count_once(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    let deliver = |id: String| {
        let inbox = inbox.clone();
        tokio::spawn(async move { count_up(&inbox, &id, &Digest::of(&[id.as_bytes()])).await })
    };

    for message in 0..20 {
        let copies = (0..8).map(|_| deliver(format!("m{message}")));
        let outcomes = futures::future::join_all(copies).await;
        let applied = outcomes
            .into_iter()
            .filter(|outcome| outcome.as_ref().unwrap() == &Outcome::Processed(()))
            .count();
        assert_eq!(applied, 1, "message m{message}");
    }
    assert_eq!(counter(&pool).await, 20);

    for message in 0..20 {
        let outcome = deliver(format!("m{message}")).await.unwrap();
        assert_eq!(outcome, Outcome::Duplicate);
    }
    assert_eq!(counter(&pool).await, 20);
    let stats = inbox.stats().await.unwrap();
    assert_eq!((stats.processed, stats.duplicate), (20, 20 * 7 + 20));
}

/// An id seen before is a copy only with the same content: another message under a reused id
/// runs nothing, is not counted as a duplicate, and leaves the first message's record as it was.
#[sqlx::test(migrations = false)]
async fn an_id_reused_for_other_content_is_no_duplicate(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    let deliver = |parts: &'static [&'static [u8]]| {
        let inbox = inbox.clone();
        async move { count_up(&inbox, "m1", &Digest::of(parts)).await }
    };
    assert_eq!(
        deliver(&[b"OrderPlaced", b"{\"a\":1}"]).await,
        Outcome::Processed(())
    );
    assert_eq!(
        deliver(&[b"OrderPlaced", b"{\"a\":2}"]).await,
        Outcome::IdReused
    );
    assert_eq!(
        deliver(&[b"OrderPaid", b"{\"a\":1}"]).await,
        Outcome::IdReused
    );
    // Part boundaries count: the same bytes split differently are other content.
    assert_eq!(
        deliver(&[b"OrderPlaced{", b"\"a\":1}"]).await,
        Outcome::IdReused
    );
    assert_eq!(
        deliver(&[b"OrderPlaced", b"{\"a\":1}"]).await,
        Outcome::Duplicate
    );
    assert_eq!(counter(&pool).await, 1);
    let stats = inbox.stats().await.unwrap();
    assert_eq!((stats.processed, stats.duplicate), (1, 1));
}
