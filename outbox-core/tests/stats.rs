//! The outbox's stats past the count's limit: a backlog of any size reads as itself, within
//! 10%, and with a margin that holds the truth; below the limit it is exact.

mod common;

use common::migrate;
use jetstream_outbox::outbox;
use sqlx::PgPool;

/// Inserts `rows` pending events straight into the outbox, as a long outage leaves them.
async fn fill(pool: &PgPool, rows: i64) {
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
         SELECT gen_random_uuid(), 'order', 'o' || i, 'OrderPlaced', '{}'
         FROM generate_series(1, $1) AS i",
    )
    .bind(rows)
    .execute(pool)
    .await
    .unwrap();
}

/// Checks the stats against a full count of the pending rows. The draws are PostgreSQL's
/// `random()`, seeded here on the one connection the stats use, so that a run is repeatable:
/// the margin is an interval, and an unseeded truth outside it once in a thousand runs would
/// make the test flaky.
async fn assert_estimated(pool: &PgPool, case: &str) {
    let truth: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = 'pending'")
        .fetch_one(pool)
        .await
        .unwrap();
    let one = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    sqlx::query("SELECT setseed(0.25)")
        .execute(&one)
        .await
        .unwrap();
    let stats = outbox::stats(&one).await.unwrap();
    one.close().await;
    let error = (stats.pending - truth).abs();
    assert!(
        error * 10 <= truth,
        "{case}: {} pending read for {truth}: {stats:?}",
        stats.pending
    );
    assert!(
        error <= stats.pending_margin,
        "{case}: the margin must hold the truth ({truth}): {stats:?}"
    );
    assert!(!stats.exact, "{case}: {stats:?}");
}

#[sqlx::test(migrations = false)]
async fn below_the_limit_the_backlog_is_counted_exactly(pool: PgPool) {
    migrate(&pool).await;
    fill(&pool, outbox::COUNT_LIMIT - 1).await;
    let stats = outbox::stats(&pool).await.unwrap();
    assert_eq!(
        (stats.pending, stats.pending_margin, stats.exact),
        (outbox::COUNT_LIMIT - 1, 0, true)
    );
}

/// An outage's backlog in one run of sequence numbers.
#[sqlx::test(migrations = false)]
async fn a_backlog_of_one_run_is_estimated_within_ten_percent(pool: PgPool) {
    migrate(&pool).await;
    fill(&pool, 300_000).await;
    assert_estimated(&pool, "one run").await;
}

/// Gaps everywhere: rolled-back transactions took a tenth of the sequence numbers.
#[sqlx::test(migrations = false)]
async fn a_backlog_with_gaps_is_estimated_within_ten_percent(pool: PgPool) {
    migrate(&pool).await;
    fill(&pool, 200_000).await;
    // Every tenth sequence number, so that each run has the same gaps.
    sqlx::query("DELETE FROM outbox WHERE seq % 10 = 7")
        .execute(&pool)
        .await
        .unwrap();
    assert_estimated(&pool, "gaps").await;
}

/// Parked events far back stretch the span the backlog occupies: twentyfold, and (a day of
/// traffic published since the first was parked) two-thousandfold, where the backlog falls in
/// about one of the probes' parts.
#[sqlx::test(migrations = false)]
async fn a_backlog_behind_old_parked_events_is_estimated_within_ten_percent(pool: PgPool) {
    migrate(&pool).await;
    fill(&pool, 3).await;
    for (restart, rows, case) in [
        (2_000_000, 100_000, "a span twentyfold"),
        (300_000_000, 50_000, "a span two-thousandfold"),
    ] {
        sqlx::query("SELECT setval(pg_get_serial_sequence('outbox', 'seq'), $1, false)")
            .bind(restart)
            .execute(&pool)
            .await
            .unwrap();
        fill(&pool, rows).await;
        assert_estimated(&pool, case).await;
        sqlx::query("DELETE FROM outbox WHERE seq >= 2000000")
            .execute(&pool)
            .await
            .unwrap();
    }
}
