//! Published events in `outbox_published`'s partitions of two hours, against the real
//! PostgreSQL and nats-server: where the relay puts them, what ages out whole, what row by row,
//! and what is kept.

mod common;

use std::time::Duration;

use common::{TestStream, count, enqueue, filenode, migrate};
use jetstream_outbox::{Relay, outbox};
use serde_json::json;
use sqlx::PgPool;

const DAY: Duration = Duration::from_secs(86_400);

/// The middle of the current two hours, as SQL text: events placed relative to it fall in the
/// same partitions wherever in its two hours the test runs, and a test that reads it once
/// names the partitions it wrote to even if a boundary passes meanwhile.
async fn mid_window(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT (date_bin('2 hours', now(), 'epoch') + interval '1 hour')::text")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The database server's clock.
async fn clock(pool: &PgPool) -> chrono::DateTime<chrono::Utc> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Inserts a published event for each of `hours_before` `mid`, published then, into the
/// partition of its two hours; the statistics the cleanup counts with are written before this
/// returns.
async fn published(pool: &PgPool, mid: &str, hours_before: &[i32]) {
    let hours = hours_before
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT pg_stat_force_next_flush();
         INSERT INTO outbox_published (seq, id, aggregate_type, aggregate_id, event_type,
                                       payload, attempts, created_at, published_at, slot)
         SELECT n, gen_random_uuid(), 'order', 'o' || n, 'OrderPlaced', '{{}}', 0, at, at,
                outbox_published_slot(at)
         FROM (SELECT n, '{mid}'::timestamptz - make_interval(hours => h) AS at
               FROM unnest(ARRAY[{hours}]) WITH ORDINALITY AS u(h, n)) AS e"
    )))
    .execute(pool)
    .await
    .unwrap();
}

/// The partition that events published `hours` hours before `mid` are in.
async fn partition(pool: &PgPool, mid: &str, hours: i32) -> String {
    sqlx::query_scalar(
        "SELECT format('outbox_published_s%s',
                       lpad(outbox_published_slot($1::timestamptz
                                                  - make_interval(hours => $2))::text,
                            2, '0'))",
    )
    .bind(mid)
    .bind(hours)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The relay moves an event it publishes out of the outbox, whole, into the partition of the
/// two hours it was published in; `outbox_events` shows it published.
#[sqlx::test(migrations = false)]
async fn a_published_event_moves_to_the_partition_of_its_two_hours(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    enqueue(&pool, "o1", "OrderPlaced", json!({"total": 5})).await;
    let before: (uuid::Uuid, i64) = sqlx::query_as("SELECT id, seq FROM outbox")
        .fetch_one(&pool)
        .await
        .unwrap();

    let started = clock(&pool).await;
    let report = Relay::new(pool.clone(), stream.publisher(), stream.relay_config())
        .run_once()
        .await
        .unwrap();
    let ended = clock(&pool).await;

    assert_eq!(report.published, 1);
    assert_eq!(count(&pool, "outbox").await, 0);
    let (id, seq, payload, table, published_at): (
        uuid::Uuid,
        i64,
        serde_json::Value,
        String,
        chrono::DateTime<chrono::Utc>,
    ) = sqlx::query_as(
        "SELECT id, seq, payload, tableoid::regclass::text, published_at FROM outbox_published",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((id, seq), before);
    assert_eq!(payload, json!({"total": 5}));
    assert!(
        started <= published_at && published_at <= ended,
        "published at {published_at}, during the pass from {started} to {ended}"
    );
    let its_two_hours: String = sqlx::query_scalar(
        "SELECT format('outbox_published_s%s', lpad(outbox_published_slot($1)::text, 2, '0'))",
    )
    .bind(published_at)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(table, its_two_hours);
    let status: String = sqlx::query_scalar("SELECT status FROM outbox_events WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "published");
    stream.delete().await;
}

/// With a retention of a day, the partition of events published 30 hours ago (its two hours
/// ended 28 hours before the current two hours began) is emptied whole, its file replaced; the
/// one of 20 hours ago (its two hours ended 18 hours before) and the current one are kept.
#[sqlx::test(migrations = false)]
async fn a_partition_is_emptied_whole_once_its_two_hours_are_past_the_retention(pool: PgPool) {
    migrate(&pool).await;
    let mid = mid_window(&pool).await;
    published(&pool, &mid, &[30, 30, 20, 0]).await;
    let (old, kept, current) = (
        partition(&pool, &mid, 30).await,
        partition(&pool, &mid, 20).await,
        partition(&pool, &mid, 0).await,
    );
    let file = filenode(&pool, &old).await;

    assert_eq!(outbox::cleanup(&pool, DAY, 100).await.unwrap(), 2);
    assert_ne!(filenode(&pool, &old).await, file, "emptied whole");
    assert_eq!(count(&pool, &old).await, 0);
    assert_eq!(count(&pool, &kept).await, 1);
    assert_eq!(count(&pool, &current).await, 1);
    // Nothing else is ready: the next round empties nothing.
    assert_eq!(outbox::cleanup(&pool, DAY, 100).await.unwrap(), 0);
    assert_eq!(count(&pool, "outbox_published").await, 2);
}

/// A partition the ring came round to while the cleanup was stopped holds events of two rounds:
/// those published 196 hours ago, past a retention of five hours, and those of 4 hours ago, not
/// yet past it. It is kept whole, the old events longer than the retention rather than the new
/// ones shorter; once the new ones are past too, it is emptied.
#[sqlx::test(migrations = false)]
async fn a_partition_of_two_rounds_is_kept_until_its_newest_events_are_past(pool: PgPool) {
    migrate(&pool).await;
    let mid = mid_window(&pool).await;
    published(&pool, &mid, &[196, 4]).await;
    assert_eq!(
        partition(&pool, &mid, 196).await,
        partition(&pool, &mid, 4).await
    );

    assert_eq!(
        outbox::cleanup(&pool, Duration::from_secs(5 * 3600), 100)
            .await
            .unwrap(),
        0
    );
    assert_eq!(count(&pool, "outbox_published").await, 2);
    assert_eq!(
        outbox::cleanup(&pool, Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        2
    );
    assert_eq!(count(&pool, "outbox_published").await, 0);
}

/// `outbox_age_out` called by hand with a negative retention (one mixing signs included) is
/// refused, and with none (NULL) empties nothing, rather than taking either for "everything".
#[sqlx::test(migrations = false)]
async fn a_negative_or_missing_retention_empties_nothing(pool: PgPool) {
    migrate(&pool).await;
    let mid = mid_window(&pool).await;
    published(&pool, &mid, &[30]).await;

    for negative in ["-1 hour", "1 day -25 hours"] {
        let error = sqlx::query("SELECT * FROM outbox_age_out($1::interval)")
            .bind(negative)
            .execute(&pool)
            .await
            .unwrap_err();
        assert_eq!(
            error
                .as_database_error()
                .and_then(sqlx::error::DatabaseError::code)
                .as_deref(),
            Some("22023"),
            "{negative}: {error}"
        );
    }
    let emptied = sqlx::query("SELECT * FROM outbox_age_out(NULL)")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(emptied.is_empty());
    assert_eq!(count(&pool, "outbox_published").await, 1);
}

/// Age-outs run one at a time: a second, called while the first's transaction is open, returns
/// at once and empties nothing, not even a partition the first left (its shorter retention
/// would take the one of 20 hours ago); once the first has committed, it runs.
#[sqlx::test(migrations = false)]
async fn a_second_age_out_beside_a_running_one_empties_nothing(pool: PgPool) {
    migrate(&pool).await;
    let mid = mid_window(&pool).await;
    published(&pool, &mid, &[30, 20]).await;
    let mut first = pool.begin().await.unwrap();
    let emptied: Vec<i16> =
        sqlx::query_scalar("SELECT emptied_slot FROM outbox_age_out(interval '1 day')")
            .fetch_all(&mut *first)
            .await
            .unwrap();
    assert_eq!(emptied.len(), 1);

    let second: Vec<i16> =
        sqlx::query_scalar("SELECT emptied_slot FROM outbox_age_out(interval '1 hour')")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(second.is_empty(), "{second:?}");
    first.commit().await.unwrap();
    assert_eq!(count(&pool, &partition(&pool, &mid, 20).await).await, 1);

    assert_eq!(
        outbox::cleanup(&pool, Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        1
    );
    assert_eq!(count(&pool, "outbox_published").await, 0);
}

/// Events a relay of the previous version marked published in the outbox itself (during a
/// rolling deploy, or before the migration) and skipped events are deleted row by row past the
/// retention; dead and pending events and newer finished ones are kept.
#[sqlx::test(migrations = false)]
async fn finished_events_left_in_the_outbox_are_deleted_row_by_row(pool: PgPool) {
    migrate(&pool).await;
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, status,
                             created_at, published_at)
         SELECT gen_random_uuid(), 'order', 'o' || n, 'OrderPlaced', '{}', status,
                now() - make_interval(hours => hours), now() - make_interval(hours => hours)
         FROM unnest(ARRAY['published', 'skipped', 'dead', 'pending', 'published'],
                     ARRAY[30, 30, 30, 30, 1]) WITH ORDINALITY AS u(status, hours, n)",
    )
    .execute(&pool)
    .await
    .unwrap();

    assert_eq!(outbox::cleanup(&pool, DAY, 1).await.unwrap(), 2);
    let left: Vec<String> = sqlx::query_scalar("SELECT status FROM outbox ORDER BY seq")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, ["dead", "pending", "published"]);
}

/// A retention the ring cannot keep is refused, naming the limit, rather than kept short; the
/// longest it keeps is accepted.
#[sqlx::test(migrations = false)]
async fn a_retention_longer_than_the_ring_is_refused(pool: PgPool) {
    migrate(&pool).await;
    let longer = outbox::MAX_RETENTION + Duration::from_secs(1);
    // The longest retention empties one partition only, the one the ring comes round to next:
    // if a two-hour boundary passes meanwhile, it is the current one, rightly kept, and the
    // test starts again in the new two hours.
    for _ in 0..2 {
        let mid = mid_window(&pool).await;
        published(&pool, &mid, &[190]).await;

        let error = outbox::cleanup(&pool, longer, 100).await.unwrap_err();
        assert!(error.to_string().contains("188 hours"), "{error}");
        assert_eq!(count(&pool, "outbox_published").await, 1);
        let emptied = outbox::cleanup(&pool, outbox::MAX_RETENTION, 100)
            .await
            .unwrap();

        if mid_window(&pool).await == mid {
            assert_eq!(emptied, 1);
            return;
        }
        sqlx::query("TRUNCATE outbox_published")
            .execute(&pool)
            .await
            .unwrap();
    }
    panic!("two two-hour boundaries passed during the test");
}

/// The database server's clock stepped back across a two-hour boundary (NTP correcting it)
/// after the relay published into the partition of the two hours it had begun: that partition
/// is, by the ring's arithmetic, eight days old, but it holds events published after the
/// retention's cutoff, and is kept; the partition of 30 hours ago is emptied as usual.
#[sqlx::test(migrations = false)]
async fn a_partition_written_before_the_clock_stepped_back_is_kept(pool: PgPool) {
    migrate(&pool).await;
    let mid = mid_window(&pool).await;
    published(&pool, &mid, &[-2, 30]).await;
    let ahead = partition(&pool, &mid, -2).await;

    assert_eq!(
        outbox::cleanup(&pool, Duration::ZERO, 100).await.unwrap(),
        1
    );
    assert_eq!(count(&pool, &ahead).await, 1);
    assert_eq!(count(&pool, "outbox_published").await, 1);
}

/// `outbox_age_out` runs as the tables' owner: functions someone created in the tables' schema,
/// matching its calls' argument types better than pg_catalog's, are not called in their place
/// (these would make every partition look eight days old).
#[sqlx::test(migrations = false)]
async fn functions_created_in_the_schema_do_not_run_in_the_age_out(pool: PgPool) {
    migrate(&pool).await;
    let mid = mid_window(&pool).await;
    published(&pool, &mid, &[30, 20]).await;
    sqlx::raw_sql(
        "CREATE FUNCTION to_timestamp(bigint) RETURNS timestamptz
             LANGUAGE sql AS $$ SELECT '-infinity'::timestamptz $$;
         CREATE FUNCTION to_timestamp(numeric) RETURNS timestamptz
             LANGUAGE sql AS $$ SELECT '-infinity'::timestamptz $$;",
    )
    .execute(&pool)
    .await
    .unwrap();

    assert_eq!(outbox::cleanup(&pool, DAY, 100).await.unwrap(), 1);
    assert_eq!(count(&pool, &partition(&pool, &mid, 20).await).await, 1);
}

/// An index an operator adds to `outbox_published` for lookups (a B-tree beside the BRIN the
/// age-out summarises) does not stop the age-out.
#[sqlx::test(migrations = false)]
async fn an_operators_btree_index_does_not_stop_the_age_out(pool: PgPool) {
    migrate(&pool).await;
    let mid = mid_window(&pool).await;
    published(&pool, &mid, &[30]).await;
    sqlx::query("CREATE INDEX ON outbox_published (aggregate_id)")
        .execute(&pool)
        .await
        .unwrap();

    outbox::cleanup(&pool, DAY, 100).await.unwrap();

    assert_eq!(count(&pool, "outbox_published").await, 0);
}

/// A partition another transaction holds (for longer than the age-out's 100 ms lock timeout),
/// be it an operator reading it or an administrator locking it whole, is left for a later round
/// instead of failing or stalling the cleanup.
#[sqlx::test(migrations = false)]
async fn a_partition_in_use_is_left_for_a_later_round(pool: PgPool) {
    migrate(&pool).await;
    let mid = mid_window(&pool).await;
    // A partition each: the count of an emptied one reaches the statistics some time later.
    for (mode, hours) in [("ACCESS SHARE", 30), ("ACCESS EXCLUSIVE", 40)] {
        published(&pool, &mid, &[hours]).await;
        let mut holder = pool.begin().await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "LOCK TABLE {} IN {mode} MODE",
            partition(&pool, &mid, hours).await
        )))
        .execute(&mut *holder)
        .await
        .unwrap();

        assert_eq!(outbox::cleanup(&pool, DAY, 100).await.unwrap(), 0, "{mode}");
        holder.rollback().await.unwrap();
        assert_eq!(outbox::cleanup(&pool, DAY, 100).await.unwrap(), 1, "{mode}");
        assert_eq!(count(&pool, "outbox_published").await, 0, "{mode}");
    }
}

/// A role granted rights on the outbox before the migration (a service that may not change
/// the schema) may then read the published events, move them there as its relay publishes,
/// move those the broker lost back (delete them: it may delete pending events from the outbox
/// already), record its checks of the stream, and age them out through `outbox_age_out`, but
/// not truncate them itself.
#[sqlx::test(migrations = false)]
async fn the_migration_grants_what_the_outbox_grants_implied(pool: PgPool) {
    let mut before = jetstream_outbox::migrate::outbox_migrations();
    before.migrations = before
        .migrations
        .iter()
        .filter(|m| m.version < 20_261_205_000_012)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    jetstream_outbox::migrate::run(before, &pool).await.unwrap();
    let role = format!("outbox_app_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} NOLOGIN; GRANT SELECT, INSERT, UPDATE, DELETE ON outbox TO {role}"
    )))
    .execute(&pool)
    .await
    .unwrap();
    jetstream_outbox::migrate::outbox(&pool).await.unwrap();

    let held: Vec<String> = sqlx::query_scalar(
        "SELECT c.check_ FROM (VALUES
             ('outbox_published SELECT', has_table_privilege($1, 'outbox_published', 'SELECT')),
             ('outbox_published INSERT', has_table_privilege($1, 'outbox_published', 'INSERT')),
             ('outbox_published UPDATE', has_table_privilege($1, 'outbox_published', 'UPDATE')),
             ('outbox_published DELETE', has_table_privilege($1, 'outbox_published', 'DELETE')),
             ('outbox_published TRUNCATE',
              has_table_privilege($1, 'outbox_published', 'TRUNCATE')),
             ('outbox_events SELECT', has_table_privilege($1, 'outbox_events', 'SELECT')),
             ('outbox_age_out EXECUTE',
              has_function_privilege($1, 'outbox_age_out(interval)', 'EXECUTE')),
             ('outbox_stream_checks SELECT, INSERT, UPDATE, DELETE',
              has_table_privilege($1, 'outbox_stream_checks', 'SELECT')
              AND has_table_privilege($1, 'outbox_stream_checks', 'INSERT')
              AND has_table_privilege($1, 'outbox_stream_checks', 'UPDATE')
              AND has_table_privilege($1, 'outbox_stream_checks', 'DELETE'))
         ) AS c(check_, holds)
         WHERE holds",
    )
    .bind(&role)
    .fetch_all(&pool)
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP OWNED BY {role}; DROP ROLE {role}"
    )))
    .execute(&pool)
    .await
    .unwrap();

    assert_eq!(
        held,
        [
            "outbox_published SELECT",
            "outbox_published INSERT",
            // The repair moves events the broker lost back into the outbox.
            "outbox_published DELETE",
            "outbox_events SELECT",
            "outbox_age_out EXECUTE",
            "outbox_stream_checks SELECT, INSERT, UPDATE, DELETE"
        ]
    );
}

/// An event is found by its id (the relay's, UUIDv7) through the partitions' BRIN index, reading
/// a few blocks of 100,000 events published over 100 seconds, not all of them. The 100 seconds
/// are in the middle of the last two-hour slot: ending at the test's `now()`, they were split
/// between two partitions when the test ran just after a slot began, and it failed.
#[sqlx::test(migrations = false)]
async fn an_event_is_found_by_its_id_without_reading_its_partition_whole(pool: PgPool) {
    migrate(&pool).await;
    // Ids made a millisecond apart, as the relay publishes them.
    sqlx::query(
        "INSERT INTO outbox_published (seq, id, aggregate_type, aggregate_id, event_type,
                                       payload, attempts, created_at, published_at, slot)
         SELECT n, encode(overlay(uuid_send(gen_random_uuid()) placing
                    substring(int8send((extract(epoch FROM at) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6), 'hex')::uuid,
                'order', 'o' || n, 'OrderPlaced', '{}', 0, at, at, outbox_published_slot(at)
         FROM (SELECT n, (date_bin('2 hours', now(), timestamptz 'epoch') - interval '1 hour')
                         - (100000 - n) * interval '1 ms' AS at
               FROM generate_series(1, 100000) AS n) AS e",
    )
    .execute(&pool)
    .await
    .unwrap();
    // As autovacuum does for a table written to: the BRIN summarises the blocks filled.
    sqlx::query("VACUUM ANALYZE outbox_published")
        .execute(&pool)
        .await
        .unwrap();
    let id: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM outbox_published ORDER BY seq OFFSET 50000 LIMIT 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    let pages: i64 = sqlx::query_scalar(
        "SELECT sum(relpages)::bigint FROM pg_class
         WHERE oid IN (SELECT relid FROM pg_partition_tree('outbox_published'))",
    )
    .fetch_one(&pool)
    .await
    .unwrap();

    let plan: serde_json::Value = sqlx::query_scalar(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM outbox_events WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    let found = plan[0]["Plan"]["Actual Rows"].as_i64().unwrap();
    let blocks = plan[0]["Plan"]["Shared Hit Blocks"].as_i64().unwrap()
        + plan[0]["Plan"]["Shared Read Blocks"].as_i64().unwrap();

    assert_eq!(found, 1);
    assert!(pages > 500, "the partition is {pages} pages");
    assert!(
        blocks < pages / 10,
        "{blocks} blocks read of {pages}: {plan}"
    );
}
