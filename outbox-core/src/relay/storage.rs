//! Every SQL statement of the relay: the claim and its transaction, the lease, and the record
//! of a pass's outcome.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Postgres, Transaction};
use uuid::Uuid;

/// A claimed row, ready to publish.
#[derive(Debug)]
pub(crate) struct Claimed {
    pub(crate) seq: i64,
    pub(crate) id: Uuid,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    pub(crate) payload: String,
    pub(crate) traceparent: Option<String>,
    pub(crate) attempts: i32,
    pub(crate) created_at: DateTime<Utc>,
    /// When a copy was first stored by the broker: now for an event never published, the
    /// original time for one moved back into the outbox because the broker lost it.
    pub(crate) first_published_at: DateTime<Utc>,
    /// An earlier event of its aggregate is not in the same claim: it must wait.
    pub(crate) held_back: bool,
    /// An earlier publish may have been stored unacknowledged: look for it first.
    pub(crate) maybe_published: bool,
}

/// Has PostgreSQL end this session should it stay idle in the current transaction longer
/// than `lease`, which rolls the transaction back and lets its row locks go; as any statement
/// does, it also starts the idle time again.
pub(crate) async fn lease(conn: &mut PgConnection, lease: Duration) -> sqlx::Result<()> {
    let timeout = format!("{}ms", lease.as_millis());
    sqlx::query_scalar!(
        "SELECT set_config('idle_in_transaction_session_timeout', $1, true)",
        timeout,
    )
    .fetch_one(conn)
    .await?;
    Ok(())
}

/// Begins a claim's transaction, in one round trip with its settings: the [`lease`], and plans
/// that read the rows they need through an index whatever the statistics say.
/// - Statistics taken while the outbox was empty (a new database; autovacuum busy elsewhere)
///   make the planner expect a handful of pending rows and pick a bitmap scan of all of them,
///   sorted, which costs O(backlog) per claim: a relay that falls behind then falls further
///   behind. Sorting is priced out, so the ordered index scan is the only cheap way to
///   [`claim`]'s limit; the price would pull the claim over `jit_above_cost`, so JIT is off too.
/// - A prepared statement keeps the generic plan it settled on, and a plan made while the table
///   was a page or two is a sequential scan: [`move_published`] would then read the whole
///   table for every pass as the table grows, until an `ANALYZE` invalidates the plan.
///   Sequential scans are priced out too.
/// - The commit that records a pass is not waited for (`synchronous_commit = off`): a record
///   lost in a crash only publishes its rows again, which the broker and the inbox drop.
/// - Each statement keeps its generic plan (`plan_cache_mode = force_generic_plan`). Left to
///   choose, PostgreSQL planned [`move_published`] afresh for every pass (its array of seqs
///   differs each time), which cost more than running it; with the settings above the generic
///   plans read through the indexes.
///
/// The settings hold for the whole transaction: only the relay's statements run in it.
pub(crate) async fn begin_claim(
    pool: &PgPool,
    lease: Duration,
) -> sqlx::Result<Transaction<'static, Postgres>> {
    // In the range PostgreSQL takes: a failed SET would leave the pooled connection in an
    // aborted transaction, and 0 would switch the lease off.
    let lease_ms = lease.as_millis().clamp(1, i32::MAX.unsigned_abs().into());
    pool.begin_with(AssertSqlSafe(format!(
        "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '{lease_ms}ms'; \
         SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off; \
         SET LOCAL enable_seqscan = off; SET LOCAL jit = off; SET LOCAL synchronous_commit = off; \
         SET LOCAL plan_cache_mode = force_generic_plan"
    )))
    .await
}

/// Locks up to `limit` due pending rows (skipping rows other relays hold) and returns them in
/// seq order, each marked `held_back` unless it heads its aggregate: every earlier unpublished
/// event of the aggregate is in the same claim. A row due more than `longest_delay` from now
/// counts as due: no delay the relay sets is that long, so the time was written by a clock that
/// ran ahead (the database's, since corrected) or by hand. Runs in a [`begin_claim`]
/// transaction.
pub(crate) async fn claim(
    conn: &mut PgConnection,
    limit: i64,
    longest_delay: Duration,
) -> sqlx::Result<Vec<Claimed>> {
    sqlx::query_as!(
        Claimed,
        r#"
        WITH claimed AS (
            SELECT seq, id, aggregate_type, aggregate_id, event_type, payload, traceparent,
                   attempts, created_at, published_at, maybe_published
            FROM outbox o
            WHERE status = 'pending'
              AND (next_attempt_at <= now()
                   OR next_attempt_at > now() + make_interval(secs => $2))
              -- Behind a dead or failing head only the head is claimed (when due), so one
              -- failing aggregate cannot fill the batch and starve the others.
              AND NOT EXISTS (
                  SELECT 1 FROM outbox p
                  WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id
                    AND p.seq < o.seq
                    AND (p.status = 'dead' OR (p.status = 'pending' AND p.attempts > 0))
              )
            ORDER BY seq
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ),
        -- Only a claim that passed over pending rows (locked by others, not yet due, or
        -- behind a failing event) can hold a row whose earlier event is outside it (rows
        -- behind a dead one are excluded above), so only then is each row's aggregate read.
        passed_over AS (
            SELECT count(*) > (SELECT count(*) FROM claimed) AS any_row
            FROM outbox
            WHERE status = 'pending' AND seq <= (SELECT max(seq) FROM claimed)
        )
        SELECT o.seq AS "seq!", o.id AS "id!", o.aggregate_type AS "aggregate_type!",
               o.aggregate_id AS "aggregate_id!", o.event_type AS "event_type!",
               o.payload::text AS "payload!", o.traceparent, o.attempts AS "attempts!",
               o.created_at AS "created_at!",
               COALESCE(o.published_at, now()) AS "first_published_at!",
               o.maybe_published AS "maybe_published!",
               -- An earlier event locked by another pass or relay, or dead, holds it back.
               (SELECT any_row FROM passed_over) AND EXISTS (
                   SELECT 1 FROM outbox p
                   WHERE p.aggregate_type = o.aggregate_type
                     AND p.aggregate_id = o.aggregate_id
                     AND p.seq < o.seq AND p.status IN ('pending', 'dead')
                     -- NOT IN hashes the claim once; a correlated NOT EXISTS was planned as
                     -- a scan of the whole claim per earlier event.
                     AND p.seq NOT IN (SELECT seq FROM claimed)
               ) AS "held_back!"
        FROM claimed o
        ORDER BY o.seq
        "#,
        limit,
        longest_delay.as_secs_f64(),
    )
    .fetch_all(conn)
    .await
}

/// Failed rows, as the column arrays [`mark_failed`] takes.
#[derive(Debug, Default)]
pub(crate) struct Failures {
    pub(crate) seqs: Vec<i64>,
    pub(crate) errors: Vec<String>,
    /// Their kinds ([`crate::outbox::error_classes`]).
    pub(crate) classes: Vec<&'static str>,
    /// Seconds until the next attempt.
    pub(crate) delays: Vec<f64>,
    /// Whether the failure counts toward `max_attempts` (the broker refused the message).
    pub(crate) counted: Vec<bool>,
    /// Whether the row can never become a message: dead at once.
    pub(crate) fatal: Vec<bool>,
    /// Whether the broker may have stored the message all the same.
    pub(crate) maybe_stored: Vec<bool>,
}

impl Failures {
    pub(crate) fn push(
        &mut self,
        seq: i64,
        (class, error): (&'static str, String),
        delay: Duration,
        counted: bool,
    ) {
        self.seqs.push(seq);
        self.errors.push(error);
        self.classes.push(class);
        self.delays.push(delay.as_secs_f64());
        self.counted.push(counted);
        self.fatal.push(false);
        self.maybe_stored.push(false);
    }

    /// Notes that the last row pushed may have been stored by the broker all the same.
    pub(crate) fn maybe_stored(&mut self) {
        if let Some(maybe) = self.maybe_stored.last_mut() {
            *maybe = true;
        }
    }

    /// A row that can never become a message, for `reason`.
    pub(crate) fn push_fatal(&mut self, seq: i64, reason: String) {
        let class = crate::outbox::error_classes::UNPUBLISHABLE;
        self.push(seq, (class, reason), Duration::ZERO, true);
        if let Some(fatal) = self.fatal.last_mut() {
            *fatal = true;
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.seqs.len()
    }
}

/// Deletes rows once published, for relays that keep no published rows.
pub(crate) async fn delete_published(conn: &mut PgConnection, seqs: &[i64]) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM outbox WHERE seq = ANY($1)", seqs)
        .execute(conn)
        .await?;
    Ok(())
}

/// Moves rows, published now, from the outbox to `outbox_published` with the stream sequence
/// each was acknowledged at (`stream_seqs[i]` for `seqs[i]`), in the partition of the time they
/// were first published. That time, which the retention counts from, is when the pass began
/// (`now()`), as the benchmark's latency split takes it; for an event the broker lost and the
/// relay published again, the first time it was.
pub(crate) async fn move_published(
    conn: &mut PgConnection,
    seqs: &[i64],
    stream_seqs: &[i64],
) -> sqlx::Result<()> {
    sqlx::query!(
        r#"
        WITH published AS (
            DELETE FROM outbox WHERE seq = ANY($1)
            RETURNING seq, id, aggregate_type, aggregate_id, event_type, payload, traceparent,
                      attempts, created_at, COALESCE(published_at, now()) AS published_at
        )
        INSERT INTO outbox_published (seq, id, aggregate_type, aggregate_id, event_type, payload,
                                      traceparent, attempts, created_at, published_at, slot,
                                      stream_seq)
        SELECT p.seq, p.id, p.aggregate_type, p.aggregate_id, p.event_type, p.payload,
               p.traceparent, p.attempts, p.created_at, p.published_at,
               outbox_published_slot(p.published_at), a.stream_seq
        FROM published p JOIN unnest($1::bigint[], $2::bigint[]) AS a(seq, stream_seq)
            ON a.seq = p.seq
        "#,
        seqs,
        stream_seqs,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Records failed attempts: error, next attempt the given delay after now (the failure, not
/// the claim), and for counted ones an attempt more, dead at `max_attempts` or at once when
/// `fatal` (a row that can never become a message). Returns the seqs that became dead.
pub(crate) async fn mark_failed(
    conn: &mut PgConnection,
    failures: &Failures,
    max_attempts: i32,
) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar!(
        r#"
        UPDATE outbox o
        SET attempts = o.attempts + f.counted::int,
            last_error = f.error,
            error_class = f.class,
            next_attempt_at = clock_timestamp() + make_interval(secs => f.delay),
            status = CASE WHEN f.fatal OR (f.counted AND o.attempts + 1 >= $6) THEN 'dead'
                          ELSE 'pending' END,
            -- Until it is published, any earlier attempt may be the one the broker kept.
            maybe_published = o.maybe_published OR f.maybe_stored
        FROM unnest($1::bigint[], $2::text[], $3::float8[], $4::bool[], $5::bool[],
                    $7::bool[], $8::text[])
            AS f(seq, error, delay, counted, fatal, maybe_stored, class)
        WHERE o.seq = f.seq
        RETURNING CASE WHEN o.status = 'dead' THEN o.seq END AS "seq"
        "#,
        &failures.seqs,
        &failures.errors,
        &failures.delays,
        &failures.counted,
        &failures.fatal,
        max_attempts,
        &failures.maybe_stored,
        &failures.classes as &[&str],
    )
    .fetch_all(conn)
    .await
    .map(|rows| rows.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new database's outbox is analysed while empty; then an outage leaves a backlog. The
    /// claim must still read about its limit of rows, not the backlog: the rows it fetched are
    /// PostgreSQL's own count for the claim's transaction, so no clock is involved.
    #[sqlx::test(migrations = false)]
    async fn a_claim_reads_its_limit_not_the_backlog_after_an_empty_table_was_analysed(
        pool: PgPool,
    ) {
        crate::migrate::outbox(&pool).await.unwrap();
        // Kept stale: autovacuum analysing the loaded table would make any plan cheap.
        sqlx::query("ALTER TABLE outbox SET (autovacuum_enabled = off)")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("ANALYZE outbox").execute(&pool).await.unwrap();
        let backlog = 100_000;
        sqlx::query(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
             SELECT gen_random_uuid(), 'order', 'o' || (i / 3), 'OrderPlaced', '{}'
             FROM generate_series(1, $1) i",
        )
        .bind(backlog)
        .execute(&pool)
        .await
        .unwrap();

        let limit = 100;
        let mut tx = begin_claim(&pool, Duration::from_secs(30)).await.unwrap();
        let claimed = claim(&mut tx, limit, Duration::from_secs(60))
            .await
            .unwrap();
        let fetched = read_rows(&mut tx).await;

        assert_eq!(claimed.len(), 100);
        assert!(
            fetched <= 5 * limit,
            "the claim of {limit} fetched {fetched} of the {backlog} pending rows"
        );
    }

    /// A relay starts on a new, small outbox and its connection settles on generic plans; then
    /// the table grows without being analysed. Moving a pass's rows out as published must still read only
    /// the pass's rows, not the table.
    #[sqlx::test(migrations = false)]
    async fn marking_a_pass_reads_its_rows_after_the_table_grew_under_cached_plans(
        options: sqlx::postgres::PgPoolOptions,
        connect: sqlx::postgres::PgConnectOptions,
    ) {
        recording_reads_its_rows_after_the_table_grew(options, connect, Record::Published).await;
    }

    /// As above for recording refused publishes: with the claim's plan settings, the generic
    /// plan is made on the first pass over a tiny outbox.
    #[sqlx::test(migrations = false)]
    async fn marking_failures_reads_their_rows_after_the_table_grew_under_cached_plans(
        options: sqlx::postgres::PgPoolOptions,
        connect: sqlx::postgres::PgConnectOptions,
    ) {
        recording_reads_its_rows_after_the_table_grew(options, connect, Record::Refused).await;
    }

    /// How a test's pass records its rows.
    #[derive(Debug, Clone, Copy)]
    enum Record {
        Published,
        Refused,
    }

    /// Runs passes recorded as `record` on a small outbox, grows it without analysing it, and
    /// checks that recording a pass of one row reads at most a few rows. One connection, so
    /// the prepared statements are reused.
    async fn recording_reads_its_rows_after_the_table_grew(
        options: sqlx::postgres::PgPoolOptions,
        connect: sqlx::postgres::PgConnectOptions,
        record: Record,
    ) {
        let pool = one_connection(options, connect).await;
        sqlx::query("ALTER TABLE outbox SET (autovacuum_enabled = off)")
            .execute(&pool)
            .await
            .unwrap();
        let pass = async |pool: &PgPool| {
            let (mut tx, seqs) = claim_seqs(pool).await;
            let before = read_rows(&mut tx).await;
            match record {
                Record::Published => move_published(&mut tx, &seqs, &seqs).await.unwrap(),
                Record::Refused => refuse(&mut tx, &seqs).await,
            }
            let read = read_rows(&mut tx).await - before;
            tx.commit().await.unwrap();
            (seqs.len(), read)
        };
        // More passes than PostgreSQL's five custom plans before it may keep a generic one, of
        // a few rows each (a custom plan for one row is cheap enough to be kept instead).
        for _ in 0..8 {
            insert(&pool, 3, "pending").await;
            pass(&pool).await;
        }
        let grown = 100_000;
        insert(&pool, grown, "published").await;
        insert(&pool, 1, "pending").await;

        let (recorded, read) = pass(&pool).await;

        assert_eq!(recorded, 1);
        assert!(
            read <= 10,
            "recording 1 row {record:?} read {read} of {grown} rows"
        );
    }

    /// The relay's statements are planned once per connection, not once per pass: a custom plan
    /// for each pass's array of seqs cost more than running the statement. PostgreSQL's own
    /// count of a prepared statement's plans tells, so no clock is involved.
    #[sqlx::test(migrations = false)]
    async fn passes_reuse_their_statements_plans(
        options: sqlx::postgres::PgPoolOptions,
        connect: sqlx::postgres::PgConnectOptions,
    ) {
        let pool = one_connection(options, connect).await;
        for rows in 1..=8 {
            insert(&pool, rows, "pending").await;
            let (mut tx, seqs) = claim_seqs(&pool).await;
            move_published(&mut tx, &seqs, &seqs).await.unwrap();
            tx.commit().await.unwrap();
        }
        let plans: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements
             WHERE statement LIKE '%outbox%'",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let plans_of = |start: &str| {
            plans
                .iter()
                .find(|(s, ..)| s.trim_start().starts_with(start))
                .map(|(_, generic, custom)| (*generic, *custom))
        };
        // (generic, custom): one plan made, then reused.
        assert_eq!(plans_of("WITH claimed AS"), Some((8, 0)), "{plans:?}");
        assert_eq!(plans_of("WITH published AS"), Some((8, 0)), "{plans:?}");
    }

    /// A migrated outbox behind a pool of one connection.
    async fn one_connection(
        options: sqlx::postgres::PgPoolOptions,
        connect: sqlx::postgres::PgConnectOptions,
    ) -> PgPool {
        let pool = options
            .max_connections(1)
            .connect_with(connect)
            .await
            .unwrap();
        crate::migrate::outbox(&pool).await.unwrap();
        pool
    }

    /// Inserts `rows` events of `status`, each of an aggregate of its own.
    async fn insert(pool: &PgPool, rows: i64, status: &str) {
        sqlx::query(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, status)
             SELECT gen_random_uuid(), 'order', gen_random_uuid()::text, 'OrderPlaced', '{}', $2
             FROM generate_series(1, $1)",
        )
        .bind(rows)
        .bind(status)
        .execute(pool)
        .await
        .unwrap();
    }

    /// Records a refused publish of each of `seqs`, retried in a minute.
    async fn refuse(conn: &mut PgConnection, seqs: &[i64]) {
        let mut failures = Failures::default();
        for seq in seqs {
            failures.push(
                *seq,
                ("not-accepted", "refused".into()),
                Duration::from_secs(60),
                true,
            );
        }
        mark_failed(conn, &failures, 5).await.unwrap();
    }

    /// Begins a claim's transaction and claims up to 10 rows; returns it with their seqs.
    async fn claim_seqs(pool: &PgPool) -> (Transaction<'static, Postgres>, Vec<i64>) {
        let mut tx = begin_claim(pool, Duration::from_secs(30)).await.unwrap();
        let claimed = claim(&mut tx, 10, Duration::from_secs(60)).await.unwrap();
        (tx, claimed.iter().map(|c| c.seq).collect())
    }

    /// Rows the current transaction has read from the outbox, by scans or index fetches.
    async fn read_rows(conn: &mut PgConnection) -> i64 {
        sqlx::query_scalar(
            "SELECT idx_tup_fetch + seq_tup_read FROM pg_stat_xact_user_tables
             WHERE relname = 'outbox'",
        )
        .fetch_one(conn)
        .await
        .unwrap()
    }
}
