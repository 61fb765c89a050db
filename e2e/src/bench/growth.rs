//! What the tables' size costs. A user's database is not empty: the outbox holds up to a day of
//! published events and the inbox up to a week of records. This phase fills an orders and a
//! billing database once with many finished rows (over the 12 hours before the last hour, and
//! the three UTC days before the last midnight: inside the default retentions, so the
//! services' cleanup keeps them), and empty ones
//! made the same way; it copies them for each measurement and runs the relay drain,
//! `POST /orders` and the steady phase on empty and on filled copies, the two sides
//! interleaved. It also measures the
//! bytes each event takes on each side, and each side's cleanup deleting aged rows (then a
//! `VACUUM` throttled as autovacuum's is) while `POST /orders` runs at its maximum rate.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use service_kit::testing;
use sqlx::PgPool;

use super::progress;
use crate::Names;

/// The filled databases, kept as templates that each measurement copies.
#[derive(Debug)]
pub struct Filled {
    /// Finished rows in each table.
    pub rows: i64,
    /// The `now()` the rows' times were counted back from.
    anchor: chrono::DateTime<chrono::Utc>,
    orders_template: String,
    billing_template: String,
}

/// The growth phase's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Growth {
    /// Published events in `outbox_published` and records in the inbox before each measurement.
    pub rows: i64,
    /// Seconds the filling took (both tables, their indexes, `VACUUM ANALYZE`).
    pub fill_secs: f64,
    /// `outbox_published` with its index and TOAST, per published event, in bytes.
    pub outbox_bytes_per_event: f64,
    /// The inbox with its indexes, per record, in bytes.
    pub inbox_bytes_per_record: f64,
    /// The phases on empty tables, each run just before its filled counterpart.
    pub empty: Phases,
    /// The phases on copies of the filled tables.
    pub filled: Phases,
    /// The cleanup on aged rows while `POST /orders` runs at its maximum rate.
    pub cleanup: Cleanup,
}

/// The phases the growth compares, each run [`super::Options::growth_runs`] times.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Phases {
    /// Relay drain with one relay (rows kept), events per second: the runs' mean.
    pub drain_1_relay_per_sec: f64,
    /// `POST /orders` at maximum rate, accepted per second: the runs' mean.
    pub http_orders_per_sec: f64,
    /// The steady phase, one orders-service: the runs' orders together.
    pub steady: super::http::Steady,
    /// Each run's drain (absent in runs from before the growth phase ran each side twice).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drain_runs_per_sec: Vec<f64>,
    /// Each run's `POST /orders` rate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http_runs_per_sec: Vec<f64>,
    /// Each run's steady p99, milliseconds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steady_runs_p99_ms: Vec<f64>,
}

/// Whether ageing-out keeps up: each side's cleanup round (the services' code and batch size)
/// and the `VACUUM` that then reclaims the deleted rows, against the rows inserted meanwhile.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Cleanup {
    /// Orders accepted per second meanwhile: each adds an outbox row (billing does not run,
    /// so the inbox's round has no inserts beside it).
    pub inserted_per_sec: f64,
    /// The outbox's round.
    pub outbox: Round,
    /// The inbox's round.
    pub inbox: Round,
}

/// One cleanup round and its `VACUUM`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Round {
    /// Rows aged out: deleted, or in partitions emptied whole.
    pub deleted: u64,
    /// Whether the round emptied partitions (true) or deleted rows (false); absent in runs
    /// from before the outbox's partitions, whose outbox deleted rows and inbox emptied them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<bool>,
    /// Seconds the deleting took.
    pub delete_secs: f64,
    /// Seconds the `VACUUM` of the table took afterwards, throttled as autovacuum's is.
    pub vacuum_secs: f64,
}

impl Round {
    /// Rows aged out per second, the `VACUUM` included: what keeps a table's size bounded.
    pub fn per_sec(&self) -> f64 {
        self.deleted as f64 / (self.delete_secs + self.vacuum_secs)
    }
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

impl Growth {
    /// The figures on empty or on filled tables.
    pub fn phases(&mut self, filled: bool) -> &mut Phases {
        if filled {
            &mut self.filled
        } else {
            &mut self.empty
        }
    }
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

/// The share of the filled outbox rows the cleanup phase finds aged at least (it empties whole
/// partitions): enough to run for a while under load, few enough that the copy keeps most of
/// its size.
const AGED: f64 = 0.05;

/// Runs `POST /orders` at maximum rate against a copy of the filled orders database while one
/// round of the outbox's and of the inbox's cleanup (the services' code and batch size) ages
/// out the outbox's oldest partitions of published events (5 to 22% of its filled rows) and
/// the oldest of the inbox's three days (a third), partitions emptied whole, and a `VACUUM`
/// reclaims what was deleted, and returns the figures.
pub async fn cleanup(filled: &Filled, connections: usize) -> anyhow::Result<Cleanup> {
    let names = Names::unique();
    filled.copy_into(&names).await?;
    let mut orders = crate::process::Service::start(
        crate::process::Kind::Orders,
        super::http::env(&names, &names.orders_db, &testing::nats_url()),
        &super::http::log_dir(),
    )
    .await;
    let orders_db = PgPool::connect(&testing::database_url(&names.orders_db)).await?;
    let billing_db = PgPool::connect(&testing::database_url(&names.billing_db)).await?;
    let inbox = jetstream_outbox::Inbox::new(
        billing_db.clone(),
        billing_service::Config::from_env()?.consumer.name,
    );
    // The outbox's filled rows span 12 hours ending an hour before the anchor, in partitions
    // of two hours; the inbox's the three days before a midnight. These retentions put the
    // partitions of published events that end by the oldest AGED of them (the first two-hour
    // boundary after it: 5 to 22% of the rows) and the oldest day of the inbox's past them,
    // and nothing the load adds.
    let now = chrono::Utc::now();
    let aged = filled.anchor - chrono::TimeDelta::hours(13)
        + chrono::TimeDelta::seconds((12.0 * 3600.0 * AGED) as i64);
    let boundary = (aged.timestamp() + 7199) / 7200 * 7200;
    let outbox_retention = Duration::from_secs((now.timestamp() - boundary).unsigned_abs());
    let midnight = (filled.anchor - chrono::TimeDelta::hours(1))
        .date_naive()
        .and_time(chrono::NaiveTime::MIN)
        .and_utc();
    let inbox_retention = (now - (midnight - chrono::TimeDelta::hours(48))).to_std()?;

    let stop = tokio_util::sync::CancellationToken::new();
    let load =
        super::http::hammer_until(std::slice::from_ref(&orders.url), connections, stop.clone());
    let rounds = async {
        let rounds = tokio::join!(
            round(&orders_db, "outbox_published", || {
                jetstream_outbox::outbox::cleanup(&orders_db, outbox_retention, 1000)
            }),
            round(&billing_db, "inbox_entries", || {
                inbox.cleanup(inbox_retention, 1000)
            }),
        );
        stop.cancel();
        rounds
    };
    let (inserted, (outbox, inbox)) = tokio::join!(load, rounds);
    orders_db.close().await;
    billing_db.close().await;
    orders.terminate().await;
    names.clean_up().await;
    Ok(Cleanup {
        inserted_per_sec: inserted?,
        outbox: outbox?,
        inbox: inbox?,
    })
}

/// Times a round of `cleanup` that ages something out, then a `VACUUM` of `table` throttled as
/// autovacuum's is by default (cost delay 2 ms, cost limit 200): a manual one runs
/// unthrottled, faster than a deployment's. A round that ages out nothing is tried again, up
/// to 50 times 100 ms apart, and only the last is timed: the age-out functions take one caller
/// at a time, and the service started beside the phase runs its own cleanup as it starts
/// (which finds nothing of the filled rows inside its retention, but holds the function
/// meanwhile).
async fn round<F, Fut>(pool: &PgPool, table: &str, mut cleanup: F) -> anyhow::Result<Round>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = sqlx::Result<u64>>,
{
    let mut attempts = 0;
    let (deleted, delete_secs) = loop {
        let start = Instant::now();
        let deleted = cleanup().await?;
        attempts += 1;
        if deleted > 0 || attempts == 50 {
            break (deleted, start.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let start = Instant::now();
    // One statement at a time: VACUUM cannot run in the transaction a multi-statement string
    // makes; its own connection, which is then closed with its settings.
    let mut conn = pool.acquire().await?.detach();
    for statement in [
        "SET vacuum_cost_delay = '2ms'",
        "SET vacuum_cost_limit = 200",
        &format!("VACUUM {table}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned()))
            .execute(&mut conn)
            .await?;
    }
    sqlx::Connection::close(conn).await?;
    Ok(Round {
        deleted,
        // Both sides' cleanups empty partitions.
        partitions: Some(true),
        delete_secs,
        vacuum_secs: start.elapsed().as_secs_f64(),
    })
}
