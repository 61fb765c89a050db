//! The growth phase's databases: an orders and a billing database filled once with many
//! finished rows (or none, for the baseline), kept as templates that each measurement copies.

use std::time::Instant;

use service_kit::testing;
use sqlx::PgPool;

use super::growth::Growth;
use super::progress;
use crate::Names;

/// The filled databases, kept as templates that each measurement copies.
#[derive(Debug)]
pub struct Filled {
    /// Finished rows in each table.
    pub rows: i64,
    /// The `now()` the rows' times were counted back from.
    pub(super) anchor: chrono::DateTime<chrono::Utc>,
    orders_template: String,
    billing_template: String,
}

impl Filled {
    /// Makes `names`' two databases as copies of the filled ones, then [`settle`]s.
    pub async fn copy_into(&self, names: &Names) -> anyhow::Result<()> {
        copy_database(&self.orders_template, &names.orders_db).await?;
        copy_database(&self.billing_template, &names.billing_db).await?;
        settle().await;
        Ok(())
    }

    /// Makes the orders database `name` as a copy of the filled one, then [`settle`]s.
    pub async fn copy_orders(&self, name: &str) -> anyhow::Result<()> {
        copy_database(&self.orders_template, name).await?;
        settle().await;
        Ok(())
    }

    /// Drops the templates.
    pub async fn drop(self) {
        testing::drop_database(&self.orders_template).await;
        testing::drop_database(&self.billing_template).await;
    }
}

/// Rows per filling statement: one transaction of a million rows at a time.
const CHUNK: i64 = 1_000_000;

/// Drops the templates an interrupted run left behind (tens of gigabytes each).
pub async fn drop_leftovers() -> anyhow::Result<()> {
    let admin = PgPool::connect(&testing::database_url("postgres")).await?;
    let names: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 'bench_growth_%'")
            .fetch_all(&admin)
            .await?;
    admin.close().await;
    for name in names {
        testing::drop_database(&name).await;
    }
    Ok(())
}

/// Fills a fresh orders database with `rows` published events and a billing database with as
/// many inbox records, spread evenly over the twelve hours before the last hour (outbox) and
/// over the three UTC days (three of the inbox's daily partitions) before the last midnight
/// an hour or more ago (inbox), and measures their size. With `rows` 0, the empty databases the
/// baseline copies, migrated and analysed the same way.
pub async fn fill(rows: i64) -> anyhow::Result<(Filled, Growth)> {
    let start = Instant::now();
    let mut filled = Filled {
        rows,
        anchor: chrono::Utc::now(),
        orders_template: testing::unique("bench_growth_orders"),
        billing_template: testing::unique("bench_growth_billing"),
    };
    let orders =
        service_kit::infra::connect_db(&testing::database_url(&filled.orders_template), 2).await?;
    orders_service::startup::migrate(&orders).await?;
    let billing =
        service_kit::infra::connect_db(&testing::database_url(&filled.billing_template), 2).await?;
    billing_service::startup::migrate(&billing).await?;
    let consumer = billing_service::Config::from_env()?.consumer.name;
    filled.anchor = sqlx::query_scalar("SELECT now()")
        .fetch_one(&orders)
        .await?;

    for first in (0..rows).step_by(CHUNK as usize) {
        let last = (first + CHUNK).min(rows);
        progress(&format!("  rows {first}..{last} of {rows}"));
        // Time-ordered ids, as UUIDv7 are: the millisecond timestamp in the first six bytes
        // (random ones would make the id indexes bigger and slower than a deployment's). The
        // event of row i, published at its creation time: one of three per order, with a
        // payload the size of the services' and a traceparent, as a traced deployment has.
        sqlx::query(
            "INSERT INTO outbox_published (seq, id, aggregate_type, aggregate_id, event_type,
                                           payload, traceparent, attempts, created_at,
                                           published_at, slot)
             SELECT i + 1, encode(overlay(uuid_send(gen_random_uuid()) placing
                        substring(int8send((extract(epoch FROM at) * 1000)::bigint) FROM 3)
                        FROM 1 FOR 6), 'hex')::uuid,
                    'order', order_id,
                    (ARRAY['OrderPlaced', 'OrderPaid', 'OrderCancelled'])[i % 3 + 1],
                    jsonb_build_object('orderId', order_id, 'customer', 'bench',
                                       'totalMinor', 1999, 'status', 'placed'),
                    '00-' || md5(i::text) || '-' || left(md5(order_id), 16) || '-01',
                    0, at, at, outbox_published_slot(at)
             FROM (SELECT i, '0193a0c4-7d1e-7c3b-9f1a-' || lpad((i / 3)::text, 12, '0')
                             AS order_id,
                          $4 - interval '13 hours' + interval '12 hours' * (i::float8 / $3)
                              AS at
                   FROM generate_series($1, $2 - 1) AS i) AS r",
        )
        .bind(first)
        .bind(last)
        .bind(rows)
        .bind(filled.anchor)
        .execute(&orders)
        .await?;
        fill_inbox(&billing, first..last, rows, &consumer, filled.anchor).await?;
    }
    // The outbox's seqs go on after the filled events', as they would have.
    sqlx::query("SELECT setval(pg_get_serial_sequence('outbox', 'seq'), greatest($1, 1), $1 > 0)")
        .bind(rows)
        .execute(&orders)
        .await?;
    // What the inbox's own statements would have counted.
    sqlx::query(
        "INSERT INTO inbox_day_counts (consumer, day, slot, processed)
         SELECT $1, day, 0, count(*) FROM inbox_entries GROUP BY day",
    )
    .bind(&consumer)
    .execute(&billing)
    .await?;
    // As autovacuum would have by the time the tables are that big.
    for (pool, table) in [(&orders, "outbox_published"), (&billing, "inbox_entries")] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {table}")))
            .execute(pool)
            .await?;
    }
    let size = |pool: &PgPool, table: &'static str| {
        let pool = pool.clone();
        async move {
            // A partitioned table's size is its partitions' (the tree of a table that is not
            // partitioned is empty).
            let bytes: i64 = sqlx::query_scalar(
                "SELECT COALESCE(sum(pg_total_relation_size(relid)),
                                 pg_total_relation_size($1::regclass))::bigint
                 FROM pg_partition_tree($1::regclass)",
            )
            .bind(table)
            .fetch_one(&pool)
            .await?;
            anyhow::Ok(bytes as f64 / rows.max(1) as f64)
        }
    };
    let growth = Growth {
        rows,
        fill_secs: start.elapsed().as_secs_f64(),
        outbox_bytes_per_event: size(&orders, "outbox_published").await?,
        inbox_bytes_per_record: size(&billing, "inbox_entries").await?,
        ..Growth::default()
    };
    orders.close().await;
    billing.close().await;
    Ok((filled, growth))
}

/// Inserts the inbox records `chunk` of `rows`, for `consumer`, received over the three UTC
/// days before the last midnight an hour or more before `anchor`.
async fn fill_inbox(
    billing: &PgPool,
    chunk: std::ops::Range<i64>,
    rows: i64,
    consumer: &str,
    anchor: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<()> {
    // The ids the relay publishes, hence billing's keys, are UUIDv7 too (version 7: the
    // inbox's partition of a record follows from it).
    sqlx::query(
        "INSERT INTO inbox_entries (consumer, key, received_at, day, digest)
         SELECT $4, id, at, inbox_day(id), sha256(id::text::bytea)
         FROM (SELECT encode(set_byte(overlay(uuid_send(gen_random_uuid()) placing
                          substring(int8send((extract(epoch FROM at) * 1000)::bigint) FROM 3)
                          FROM 1 FOR 6), 6, 112 + get_byte(uuid_send(gen_random_uuid()), 6) % 16),
                          'hex')::uuid AS id, at
               FROM (SELECT date_trunc('day', $5 - interval '1 hour', 'UTC')
                                - interval '72 hours'
                                + interval '72 hours' * (i::float8 / $3) AS at
                     FROM generate_series($1, $2 - 1) AS i) AS t) AS r",
    )
    .bind(chunk.start)
    .bind(chunk.end)
    .bind(rows)
    .bind(consumer)
    .bind(anchor)
    .execute(billing)
    .await?;
    Ok(())
}

/// `name`'s database made as a copy of `template` (file by file: no WAL for the copied data).
async fn copy_database(template: &str, name: &str) -> anyhow::Result<()> {
    let admin = PgPool::connect(&testing::database_url("postgres")).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        r#"CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY"#
    )))
    .execute(&admin)
    .await?;
    admin.close().await;
    Ok(())
}

/// Waits until what the last copy wrote and the last drop freed is on disk (a checkpoint, then
/// `sync`), so that a measurement does not pay for the I/O of the one before it; best effort.
pub async fn settle() {
    if let Ok(admin) = PgPool::connect(&testing::database_url("postgres")).await {
        // Needs a superuser or pg_checkpoint; without, the sync still does most of it.
        let _ = sqlx::query("CHECKPOINT").execute(&admin).await;
        admin.close().await;
    }
    let _ = tokio::process::Command::new("sync").status().await;
}
