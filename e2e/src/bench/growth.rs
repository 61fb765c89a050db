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

use super::filled::Filled;
use crate::Names;

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
