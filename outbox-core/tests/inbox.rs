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

/// Adds one to the counter for each new message of `batch`, in one transaction.
async fn count_up_batch(inbox: &Inbox, batch: &[(&str, Digest)]) -> Vec<Outcome<()>> {
    inbox
        .process_batch(batch, |conn, _| {
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

/// A batch runs the effect of each message not processed before, once, and commits them
/// together: a copy inside the batch or from before is a duplicate, an id reused for other
/// content runs nothing, and a failed effect records nothing of the batch.
#[sqlx::test(migrations = false)]
async fn a_batch_applies_each_new_message_once(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    let (a, b) = (Digest::of(&[b"a"]), Digest::of(&[b"b"]));
    let outcomes = count_up_batch(&inbox, &[("m1", a), ("m2", a), ("m1", a), ("m2", b)]).await;
    assert_eq!(
        outcomes,
        [
            Outcome::Processed(()),
            Outcome::Processed(()),
            Outcome::Duplicate,
            Outcome::IdReused
        ]
    );
    let outcomes = count_up_batch(&inbox, &[("m2", a), ("m3", a), ("m1", b)]).await;
    assert_eq!(
        outcomes,
        [
            Outcome::Duplicate,
            Outcome::Processed(()),
            Outcome::IdReused
        ]
    );
    assert_eq!(counter(&pool).await, 3);

    let failed = inbox
        .process_batch(&[("m4", a), ("m5", a), ("m6", a)], |conn, i| {
            Box::pin(async move {
                sqlx::query("UPDATE counter SET n = n + 1")
                    .execute(&mut *conn)
                    .await?;
                if i == 1 {
                    return Err(sqlx::Error::RowNotFound);
                }
                Ok(())
            })
        })
        .await;
    assert!(matches!(
        failed,
        Err(outbox_core::BatchError::Effect { index: 1, .. })
    ));
    assert_eq!(counter(&pool).await, 3, "nothing of the failed batch");
    let outcomes = count_up_batch(&inbox, &[("m4", a), ("m6", a)]).await;
    assert_eq!(outcomes, [Outcome::Processed(()), Outcome::Processed(())]);
    assert_eq!(counter(&pool).await, 5);
}

/// Two consumers processing the same 200 messages in batches at once, one in the order of the
/// other reversed: every message applied once, and no deadlock between their batches.
#[sqlx::test(migrations = false)]
async fn overlapping_batches_apply_each_message_once(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    let ids: Vec<String> = (0..200).map(|i| format!("m{i:03}")).collect();
    let digest = Digest::of(&[b"same"]);
    let run = |reversed: bool| {
        let inbox = Inbox::new(pool.clone(), "billing");
        let mut ids = ids.clone();
        if reversed {
            ids.reverse();
        }
        tokio::spawn(async move {
            for chunk in ids.chunks(20) {
                let batch: Vec<(&str, Digest)> =
                    chunk.iter().map(|id| (id.as_str(), digest)).collect();
                count_up_batch(&inbox, &batch).await;
            }
        })
    };
    let (forward, backward) = (run(false), run(true));
    forward.await.unwrap();
    backward.await.unwrap();
    assert_eq!(counter(&pool).await, 200);
    let stats = Inbox::new(pool.clone(), "billing").stats().await.unwrap();
    assert_eq!((stats.processed, stats.duplicate), (200, 200));
}

/// The stats read the counts the inbox keeps as it goes: they follow what was processed and
/// recognised as a copy, and the cleanup takes off what it deletes.
#[sqlx::test(migrations = false)]
async fn stats_follow_the_records_and_the_cleanup(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    let digest = Digest::of(&[b"same"]);
    count_up_batch(&inbox, &[("m1", digest), ("m2", digest), ("m1", digest)]).await;
    count_up(&inbox, "m2", &digest).await;
    count_up(&inbox, "m3", &digest).await;
    let stats = inbox.stats().await.unwrap();
    assert_eq!(
        (stats.processed, stats.duplicate, stats.exact),
        (3, 2, true)
    );
    assert_eq!(
        Inbox::new(pool.clone(), "audit")
            .stats()
            .await
            .unwrap()
            .processed,
        0,
        "per consumer"
    );
    assert_eq!(
        inbox.cleanup(std::time::Duration::ZERO, 2).await.unwrap(),
        3
    );
    let stats = inbox.stats().await.unwrap();
    assert_eq!((stats.processed, stats.duplicate), (0, 0));
}
