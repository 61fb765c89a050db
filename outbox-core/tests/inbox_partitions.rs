//! The inbox's daily partitions against the real PostgreSQL: what ages out whole, what row by
//! row, and what is kept.

mod common;

use std::time::Duration;

use common::{DAY_MS, count, count_up, create_counter, filenode, migrate, ms_ago, v7_id};
use jetstream_outbox::inbox::Digest;
use jetstream_outbox::{Inbox, Outcome};
use sqlx::PgPool;

const WEEK: Duration = Duration::from_secs(7 * 86_400);

/// The partition holding the records of messages made `days` days ago.
fn partition(days: i64) -> String {
    format!("inbox_entries_d{:02}", ms_ago(days) / DAY_MS % 32)
}

/// Sets when the records of `ids` were received to `days` days ago.
async fn received(pool: &PgPool, ids: &[&str], days: i64) {
    sqlx::query(
        "UPDATE inbox_entries SET received_at = now() - make_interval(days => $2)
         WHERE key IN (SELECT inbox_key(id) FROM unnest($1::text[]) AS id)",
    )
    .bind(ids)
    .bind(i32::try_from(days).unwrap())
    .execute(pool)
    .await
    .unwrap();
}

/// A day's partition is emptied whole (its file replaced, no row deleted) once every record in
/// it is past the retention, and its counts go with it; a partition holding one record inside
/// the retention keeps all of its records, and their copies stay duplicates.
#[sqlx::test(migrations = false)]
async fn a_days_partition_is_emptied_whole_once_all_its_records_are_past_the_retention(
    pool: PgPool,
) {
    migrate(&pool).await;
    create_counter(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    let digest = Digest::of(&[b"body"]);
    let (ten, nine) = ([v7_id(10, 1), v7_id(10, 2)], [v7_id(9, 1), v7_id(9, 2)]);
    for id in ten.iter().chain(&nine) {
        assert_eq!(count_up(&inbox, id, &digest).await, Outcome::Processed(()));
    }
    // Received when they were made, but for one received late: just now.
    received(&pool, &[&ten[0], &ten[1], &nine[0]], 10).await;
    let file = filenode(&pool, &partition(10)).await;

    assert_eq!(inbox.cleanup(WEEK, 100).await.unwrap(), 2);
    assert_ne!(filenode(&pool, &partition(10)).await, file, "emptied whole");
    assert_eq!(count(&pool, &partition(10)).await, 0);
    assert_eq!(count(&pool, &partition(9)).await, 2);
    assert_eq!(inbox.stats().await.unwrap().processed, 2);
    for id in &nine {
        assert_eq!(
            count_up(&inbox, id, &digest).await,
            Outcome::Duplicate,
            "{id}"
        );
    }
    // Nothing else is ready: the next round empties nothing.
    assert_eq!(inbox.cleanup(WEEK, 100).await.unwrap(), 0);
    assert_eq!(count(&pool, &partition(9)).await, 2);
}

/// A record the ring has come round to again (its message made 31 or more days ago, received
/// long after) is deleted row by row once past the retention, so it never holds a partition for
/// ever; the records of the partition's current day stay, and so does one made as long ago
/// but received inside the retention.
#[sqlx::test(migrations = false)]
async fn records_of_an_earlier_round_of_the_ring_are_deleted_row_by_row(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    let digest = Digest::of(&[b"body"]);
    let (stale, late, current) = (v7_id(40, 1), v7_id(40, 2), v7_id(8, 1));
    assert_eq!(partition(40), partition(8), "one partition, 32 days apart");
    for id in [&stale, &late, &current] {
        assert_eq!(count_up(&inbox, id, &digest).await, Outcome::Processed(()));
    }
    received(&pool, &[&stale], 20).await;
    let file = filenode(&pool, &partition(8)).await;

    assert_eq!(inbox.cleanup(WEEK, 100).await.unwrap(), 1);
    assert_eq!(filenode(&pool, &partition(8)).await, file, "not emptied");
    assert_eq!(count(&pool, &partition(8)).await, 2);
    assert_eq!(inbox.stats().await.unwrap().processed, 2);
    assert_eq!(count_up(&inbox, &late, &digest).await, Outcome::Duplicate);
    assert_eq!(
        count_up(&inbox, &current, &digest).await,
        Outcome::Duplicate
    );
}

/// Records of ids that are no UUIDv7 share one partition, which is never emptied whole: its
/// records are deleted row by row as before.
#[sqlx::test(migrations = false)]
async fn records_of_other_ids_age_out_row_by_row(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    let digest = Digest::of(&[b"body"]);
    let v4 = "0193a0c4-7d1e-4c3b-9f1a-000000000001";
    for id in ["order-1", "order-2", v4] {
        assert_eq!(count_up(&inbox, id, &digest).await, Outcome::Processed(()));
    }
    received(&pool, &["order-1", v4], 10).await;
    let file = filenode(&pool, "inbox_entries_other").await;

    assert_eq!(inbox.cleanup(WEEK, 1).await.unwrap(), 2);
    assert_eq!(filenode(&pool, "inbox_entries_other").await, file);
    assert_eq!(count(&pool, "inbox_entries_other").await, 1);
    assert_eq!(inbox.stats().await.unwrap().processed, 1);
}

/// Partitions are shared by every consumer of the database: one is emptied only when the
/// longest retention any consumer's cleanup declared has passed, and never while it holds a
/// record of a consumer that declared none, so no consumer loses records its own retention
/// (or its having no cleanup) keeps.
#[sqlx::test(migrations = false)]
async fn a_partition_waits_for_the_longest_retention_declared(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    let billing = Inbox::new(pool.clone(), "billing");
    let audit = Inbox::new(pool.clone(), "audit");
    let digest = Digest::of(&[b"body"]);
    let id = v7_id(10, 1);
    for inbox in [&billing, &audit] {
        assert_eq!(count_up(inbox, &id, &digest).await, Outcome::Processed(()));
    }
    let (ledger, other) = (Inbox::new(pool.clone(), "ledger"), v7_id(10, 2));
    assert_eq!(
        count_up(&ledger, &other, &digest).await,
        Outcome::Processed(())
    );
    received(&pool, &[&id, &other], 10).await;

    // ledger runs no cleanup (yet): its record holds the partition.
    assert_eq!(billing.cleanup(WEEK, 100).await.unwrap(), 0);
    assert_eq!(count_up(&ledger, &other, &digest).await, Outcome::Duplicate);
    // audit keeps records four weeks: nobody's cleanup empties the partition.
    assert_eq!(audit.cleanup(4 * WEEK, 100).await.unwrap(), 0);
    for inbox in [&ledger, &billing] {
        assert_eq!(inbox.cleanup(WEEK, 100).await.unwrap(), 0);
    }
    assert_eq!(count_up(&audit, &id, &digest).await, Outcome::Duplicate);
    // Once audit keeps records a week too, the partition goes, with every consumer's records.
    assert_eq!(audit.cleanup(WEEK, 100).await.unwrap(), 3);
    assert_eq!(count(&pool, &partition(10)).await, 0);
    for inbox in [&billing, &audit, &ledger] {
        assert_eq!(inbox.stats().await.unwrap().processed, 0);
    }
}

/// A partition another transaction holds (for longer than the age-out's 100 ms lock timeout)
/// is left for a later round: the cleanup goes on (and deletes what it deletes row by row)
/// instead of failing or stalling.
#[sqlx::test(migrations = false)]
async fn a_partition_in_use_is_left_for_a_later_round(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    let digest = Digest::of(&[b"body"]);
    let id = v7_id(10, 1);
    for id in [id.as_str(), "order-1"] {
        assert_eq!(count_up(&inbox, id, &digest).await, Outcome::Processed(()));
    }
    received(&pool, &[&id, "order-1"], 10).await;
    let mut reader = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {} IN ACCESS SHARE MODE",
        partition(10)
    )))
    .execute(&mut *reader)
    .await
    .unwrap();

    assert_eq!(inbox.cleanup(WEEK, 100).await.unwrap(), 1, "order-1 only");
    reader.rollback().await.unwrap();
    assert_eq!(inbox.cleanup(WEEK, 100).await.unwrap(), 1);
    assert_eq!(count(&pool, "inbox_entries").await, 0);
}

/// Instances of one consumer whose cleanups run at once (their timers lined up) both finish
/// their round, one emptying the partition; and a database whose transactions default to
/// REPEATABLE READ ages out as well (the age-out runs at READ COMMITTED, as it must).
#[sqlx::test(migrations = false)]
async fn cleanups_at_once_and_under_another_isolation_level_succeed(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    sqlx::raw_sql(
        "DO $$ BEGIN EXECUTE format(
             'ALTER DATABASE %I SET default_transaction_isolation = ''repeatable read''',
             current_database()); END $$",
    )
    .execute(&pool)
    .await
    .unwrap();
    // New connections, which take the database's default.
    let pool = PgPool::connect_with(pool.connect_options().as_ref().clone())
        .await
        .unwrap();
    let isolation: String = sqlx::query_scalar("SHOW transaction_isolation")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(isolation, "repeatable read");
    let (one, two) = (
        Inbox::new(pool.clone(), "billing"),
        Inbox::new(pool.clone(), "billing"),
    );
    let digest = Digest::of(&[b"body"]);
    let id = v7_id(10, 1);
    assert_eq!(count_up(&one, &id, &digest).await, Outcome::Processed(()));
    received(&pool, &[&id], 10).await;

    let (a, b) = tokio::join!(one.cleanup(WEEK, 100), two.cleanup(WEEK, 100));
    assert_eq!(a.unwrap() + b.unwrap(), 1);
    assert_eq!(count(&pool, &partition(10)).await, 0);
}
