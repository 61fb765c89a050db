//! The inbox against the real PostgreSQL.

mod common;

use common::{add_one, count, count_up, counter, create_counter, migrate, v7_id};
use jetstream_outbox::inbox::{self, Digest, NewDeadLetter};
use jetstream_outbox::{Inbox, InboxError, Outcome, headers};
use sqlx::PgPool;

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
        .process_batch(batch, |conn, _| add_one(conn))
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
        Err(jetstream_outbox::BatchError::Effect { index: 1, .. })
    ));
    assert_eq!(counter(&pool).await, 3, "nothing of the failed batch");
    let outcomes = count_up_batch(&inbox, &[("m4", a), ("m6", a)]).await;
    assert_eq!(outcomes, [Outcome::Processed(()), Outcome::Processed(())]);
    assert_eq!(counter(&pool).await, 5);
}

/// A batch applied together hands its effect every new message at once, in batch order: copies
/// (in the batch or from before) and reused ids are left out; an effect's failure at a message
/// records nothing of the batch, and the error names that message.
#[sqlx::test(migrations = false)]
async fn a_batch_applied_together_gets_its_new_messages_in_one_call(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    let (a, b) = (Digest::of(&[b"a"]), Digest::of(&[b"b"]));
    count_up(&inbox, "m0", &a).await;
    let mut calls: Vec<Vec<usize>> = Vec::new();
    let batch = [
        ("m1", a),
        ("m0", a),
        ("m2", a),
        ("m1", a),
        ("m0", b),
        ("m3", a),
    ];
    let outcomes = inbox
        .process_batch_together(&batch, |conn, new| {
            calls.push(new.to_vec());
            let n = i32::try_from(new.len()).unwrap();
            Box::pin(async move {
                sqlx::query("UPDATE counter SET n = n + $1")
                    .bind(n)
                    .execute(conn)
                    .await
                    .map_err(|error| (0, error))?;
                Ok(new.iter().map(|&i| i * 10).collect())
            })
        })
        .await
        .unwrap();
    assert_eq!(calls, [vec![0, 2, 5]]);
    assert_eq!(
        outcomes,
        [
            Outcome::Processed(0),
            Outcome::Duplicate,
            Outcome::Processed(20),
            Outcome::Duplicate,
            Outcome::IdReused,
            Outcome::Processed(50),
        ]
    );
    assert_eq!(counter(&pool).await, 4);
    let copies = inbox
        .process_batch_together(&[("m1", a), ("m0", a)], |_, new| {
            calls.push(new.to_vec());
            Box::pin(std::future::ready(Ok::<Vec<()>, (usize, sqlx::Error)>(
                Vec::new(),
            )))
        })
        .await
        .unwrap();
    assert_eq!(copies, [Outcome::Duplicate, Outcome::Duplicate]);
    assert_eq!(calls, [vec![0, 2, 5]], "no call when nothing is new");

    let failed = inbox
        .process_batch_together(&[("m4", a), ("m5", a), ("m3", a)], |conn, new| {
            Box::pin(async move {
                sqlx::query("UPDATE counter SET n = n + 100")
                    .execute(conn)
                    .await
                    .map_err(|error| (new[0], error))?;
                Err::<Vec<()>, _>((new[1], sqlx::Error::RowNotFound))
            })
        })
        .await;
    assert!(matches!(
        failed,
        Err(jetstream_outbox::BatchError::Effect { index: 1, .. })
    ));
    assert_eq!(counter(&pool).await, 4, "nothing of the failed batch");
    let outcomes = count_up_batch(&inbox, &[("m4", a), ("m5", a)]).await;
    assert_eq!(outcomes, [Outcome::Processed(()), Outcome::Processed(())]);
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

/// The key `inbox_entries` holds for `id`.
async fn key_of(pool: &PgPool, id: &str) -> uuid::Uuid {
    sqlx::query_scalar("SELECT inbox_key($1)")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The key `inbox_key` makes of an id that is not a UUID: the first 16 bytes of its SHA-256,
/// marked as a version-8 UUID.
fn hashed_key(id: &str) -> uuid::Uuid {
    let sha = <sha2::Sha256 as sha2::Digest>::digest(id.as_bytes());
    let mut bytes: [u8; 16] = sha[..16].try_into().unwrap();
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    uuid::Uuid::from_bytes(bytes)
}

/// An id in a UUID's canonical text is its own 16-byte key, keeping its order; any other id is
/// keyed by its SHA-256, so ids differing only in case are other messages, and an id written
/// as another id's hashed key is no copy of it.
#[sqlx::test(migrations = false)]
async fn ids_are_keyed_in_sixteen_bytes(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    let uuid = "0193a0c4-7d1e-7c3b-9f1a-000000000001";
    let upper = uuid.to_uppercase();
    let crafted = hashed_key("m1").hyphenated().to_string();
    let ids = [uuid, &upper, "m1", "order:42@shop_1-x", &crafted];
    for id in ids {
        let outcome = count_up(&inbox, id, &Digest::of(&[b"same body"])).await;
        assert_eq!(outcome, Outcome::Processed(()), "{id}");
    }
    assert_eq!(counter(&pool).await, 5);
    assert_eq!(
        key_of(&pool, uuid).await,
        uuid.parse::<uuid::Uuid>().unwrap()
    );
    for id in [&upper, "m1", "order:42@shop_1-x", &crafted] {
        assert_eq!(key_of(&pool, id).await, hashed_key(id), "{id}");
    }
    let keys: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT key FROM inbox_entries ORDER BY key")
        .fetch_all(&pool)
        .await
        .unwrap();
    let mut expected = Vec::new();
    for id in ids {
        expected.push(key_of(&pool, id).await);
    }
    expected.sort();
    assert_eq!(keys, expected);
}

/// `inbox_key` is inlined into the statements that call it: as a function call of its own it
/// cost more than the rest of recording a message. The plan shows its expression, not a call.
#[sqlx::test(migrations = false)]
async fn the_key_function_is_inlined(pool: PgPool) {
    migrate(&pool).await;
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN (VERBOSE) SELECT inbox_key(m) FROM unnest(ARRAY['m1', 'm2']) AS m",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let plan = plan.join("\n");
    assert!(
        plan.contains("sha256") && !plan.contains("inbox_key("),
        "not inlined:\n{plan}"
    );
}

/// Two ids of one batch sharing a key (as ids may, if only by SHA-256's 122 bits) take one
/// record: one is applied and the other is judged against it, never applied beside it.
#[sqlx::test(migrations = false)]
async fn ids_of_a_batch_sharing_a_key_are_applied_once(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    // A key shared on purpose: the function as the migration made it, then one mapping two
    // ids to one key.
    sqlx::raw_sql(
        "ALTER FUNCTION inbox_key(text) RENAME TO inbox_key_made;
         CREATE FUNCTION inbox_key(message_id text) RETURNS uuid LANGUAGE sql STABLE
         AS $$ SELECT inbox_key_made(CASE WHEN message_id = 'twin' THEN 'm1' ELSE message_id END) $$",
    )
    .execute(&pool)
    .await
    .unwrap();
    let inbox = Inbox::new(pool.clone(), "billing");
    let same = Digest::of(&[b"same"]);
    let other = Digest::of(&[b"other"]);
    let outcomes = count_up_batch(&inbox, &[("twin", same), ("m1", same)]).await;
    assert_eq!(outcomes, [Outcome::Duplicate, Outcome::Processed(())]);
    let outcomes = count_up_batch(&inbox, &[("twin", other), ("m2", other)]).await;
    assert_eq!(outcomes, [Outcome::IdReused, Outcome::Processed(())]);
    assert_eq!(counter(&pool).await, 2);
}

/// A version of the inbox before this one, still running beside it while instances are
/// replaced: the one that recorded messages in `inbox` by their ids, or the one that recorded
/// them in `inbox_records` by their keys.
#[derive(Debug, Clone, Copy)]
enum Previous {
    ByIds,
    ByKeys,
}

impl Previous {
    /// Its table, and the trigger through which each of its records takes its key in the next.
    fn table_and_trigger(self) -> (&'static str, &'static str) {
        match self {
            Self::ByIds => ("inbox", "inbox_record_key"),
            Self::ByKeys => ("inbox_records", "inbox_entry_of_record"),
        }
    }

    /// What it did to record message `id`: a row in its table, and its count.
    async fn record(
        self,
        conn: &mut sqlx::PgConnection,
        id: &str,
        digest: &Digest,
    ) -> sqlx::Result<i64> {
        let insert = match self {
            Self::ByIds => {
                "INSERT INTO inbox (consumer, message_id, digest) VALUES ('billing', $1, $2)
                 ON CONFLICT (consumer, message_id) DO NOTHING
                 RETURNING message_id"
            }
            Self::ByKeys => {
                "INSERT INTO inbox_records (consumer, key, digest)
                 VALUES ('billing', inbox_key($1), $2)
                 ON CONFLICT (consumer, key) DO NOTHING
                 RETURNING key"
            }
        };
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "WITH inserted AS ({insert}),
             counted AS (
                 INSERT INTO inbox_counts (consumer, slot, processed)
                 SELECT 'billing', 0, count(*) FROM inserted HAVING count(*) > 0
                 ON CONFLICT (consumer, slot)
                 DO UPDATE SET processed = inbox_counts.processed + EXCLUDED.processed
             )
             SELECT count(*) FROM inserted"
        )))
        .bind(id)
        .bind(digest.as_bytes().as_slice())
        .fetch_one(conn)
        .await
    }
}

/// The move to compact keys needs no downtime: records the previous version made before the
/// migration (in `inbox`, nothing copied) still make their copies duplicates; while it still
/// runs beside this one, a message both record at once is applied once, whichever commits
/// first; the cleanup ages out every table and the counts come back to zero.
#[sqlx::test(migrations = false)]
async fn records_of_the_version_by_ids_keep_their_copies_out(pool: PgPool) {
    previous_version_beside_this_one(pool, Previous::ByIds, &HASHED).await;
}

/// The same for the move to daily partitions: records the previous version made in
/// `inbox_records` before the migration are read beside `inbox_entries`, and while it runs
/// beside this one, both versions' records of a message meet on one primary key.
#[sqlx::test(migrations = false)]
async fn records_of_the_version_by_keys_keep_their_copies_out(pool: PgPool) {
    previous_version_beside_this_one(pool, Previous::ByKeys, &HASHED).await;
}

/// The same with the relay's ids, UUIDv7: the records both versions made of a message are
/// emptied with their day's partition, and every count comes off once.
#[sqlx::test(migrations = false)]
async fn records_of_the_version_by_keys_of_the_relays_ids_keep_their_copies_out(pool: PgPool) {
    let ids = [v7_id(0, 1), v7_id(0, 2), v7_id(0, 3), v7_id(0, 4)];
    let ids = ids.each_ref().map(String::as_str);
    previous_version_beside_this_one(pool, Previous::ByKeys, &ids).await;
}

/// Ids keyed by their SHA-256: the one partition of records of other ids.
const HASHED: [&str; 4] = ["before", "old-first", "new-first", "together"];

/// The previous version beside this one, with messages `ids`: recorded by the previous version
/// before the migration, by it first, by this one first, by both at once.
async fn previous_version_beside_this_one(pool: PgPool, previous: Previous, ids: &[&str; 4]) {
    let [before, old_first, new_first, together] = *ids;
    migrate(&pool).await;
    create_counter(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    let digest = Digest::of(&[b"body"]);
    let mut conn = pool.acquire().await.unwrap();
    let (table, trigger) = previous.table_and_trigger();

    // Made before the migration: no trigger then.
    let trigger_is = |state: &str| format!("ALTER TABLE {table} {state} TRIGGER {trigger}");
    sqlx::query(sqlx::AssertSqlSafe(trigger_is("DISABLE")))
        .execute(&mut *conn)
        .await
        .unwrap();
    previous.record(&mut conn, before, &digest).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(trigger_is("ENABLE")))
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_eq!(count_up(&inbox, before, &digest).await, Outcome::Duplicate);
    let other = Digest::of(&[b"other body"]);
    assert_eq!(count_up(&inbox, before, &other).await, Outcome::IdReused);

    // The previous version beside this one, committing first: its record is seen.
    assert_eq!(
        previous
            .record(&mut conn, old_first, &digest)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        count_up(&inbox, old_first, &digest).await,
        Outcome::Duplicate
    );
    // This one committing first: the previous version's record of it fails (and is retried
    // there) instead of applying the message again.
    assert_eq!(
        count_up(&inbox, new_first, &digest).await,
        Outcome::Processed(())
    );
    let refused = previous
        .record(&mut conn, new_first, &digest)
        .await
        .unwrap_err();
    assert_eq!(
        refused
            .as_database_error()
            .and_then(sqlx::error::DatabaseError::code)
            .as_deref(),
        Some("23505")
    );
    // Both at once: this one's record waits on the previous version's open transaction and,
    // once that commits, finds the message recorded.
    let mut open = pool.begin().await.unwrap();
    previous.record(&mut open, together, &digest).await.unwrap();
    let racing = {
        let inbox = inbox.clone();
        let together = together.to_owned();
        tokio::spawn(async move { count_up(&inbox, &together, &digest).await })
    };
    jetstream_outbox::testing::eventually(
        "the inbox waiting on the open record",
        std::time::Duration::from_secs(10),
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (waiting > 0).then_some(())
        },
    )
    .await;
    open.commit().await.unwrap();
    assert_eq!(racing.await.unwrap(), Outcome::Duplicate);
    assert_eq!(counter(&pool).await, 1, "only new-first was applied here");
    let stats = inbox.stats().await.unwrap();
    assert_eq!(
        (stats.processed, stats.duplicate),
        (4, 3),
        "each message counted once, whichever version recorded it"
    );

    // Everything ages out of both tables; every count taken on comes off again.
    inbox.cleanup(std::time::Duration::ZERO, 2).await.unwrap();
    for table in ["inbox", "inbox_records", "inbox_entries"] {
        assert_eq!(count(&pool, table).await, 0, "{table}");
    }
    let stats = inbox.stats().await.unwrap();
    assert_eq!((stats.processed, stats.duplicate), (0, 0));
}

/// Migrates `pool` up to (not including) `version`, grants a new role what `grants` says
/// (`{role}` standing for it), migrates the rest, and returns which of `checks` hold for the
/// role, each a check function (e.g. `has_table_privilege($1, 'inbox', $2)`) and a privilege.
async fn privileges_after_migrating(
    pool: &PgPool,
    version: i64,
    grants: &str,
    checks: &[(&str, &str)],
) -> Vec<String> {
    jetstream_outbox::migrate::outbox(pool).await.unwrap();
    let mut before = jetstream_outbox::migrate::inbox_migrations();
    before.migrations = before
        .migrations
        .iter()
        .filter(|m| m.version < version)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    jetstream_outbox::migrate::run(before, pool).await.unwrap();
    let role = format!("inbox_app_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} NOLOGIN; {}",
        grants.replace("{role}", &role)
    )))
    .execute(pool)
    .await
    .unwrap();
    jetstream_outbox::migrate::inbox(pool).await.unwrap();
    let mut held = Vec::new();
    for (check, privilege) in checks {
        let holds: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {check}")))
            .bind(&role)
            .bind(privilege)
            .fetch_one(pool)
            .await
            .unwrap();
        if holds {
            held.push(format!("{check} {privilege}"));
        }
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP OWNED BY {role}; DROP ROLE {role}"
    )))
    .execute(pool)
    .await
    .unwrap();
    held
}

/// Checks of every table privilege on `table`.
fn on_table(table: &str) -> Vec<(String, &'static str)> {
    ["SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE"]
        .into_iter()
        .map(|p| (format!("has_table_privilege($1, '{table}', $2)"), p))
        .collect()
}

/// A role granted rights on `inbox` before the compact keys (a service that may not change the
/// schema) holds the same on `inbox_records` once the migration ran.
#[sqlx::test(migrations = false)]
async fn the_migration_grants_inbox_records_as_inbox_was(pool: PgPool) {
    let checks = on_table("inbox_records");
    let checks: Vec<(&str, &str)> = checks.iter().map(|(c, p)| (c.as_str(), *p)).collect();
    let held = privileges_after_migrating(
        &pool,
        20_261_203_000_008,
        "GRANT SELECT, INSERT, DELETE ON inbox TO {role}",
        &checks,
    )
    .await;
    let table = "has_table_privilege($1, 'inbox_records', $2)";
    assert_eq!(
        held,
        [
            format!("{table} SELECT"),
            format!("{table} INSERT"),
            format!("{table} DELETE")
        ]
    );
}

/// A role granted rights on `inbox_records` and `inbox_counts` holds the same on the tables
/// that take their place once the migration to daily partitions ran, and one that may delete
/// records may age out partitions (never TRUNCATE them itself).
#[sqlx::test(migrations = false)]
async fn the_migration_grants_the_partitioned_tables_as_before(pool: PgPool) {
    let mut checks = on_table("inbox_entries");
    checks.extend(on_table("inbox_day_counts"));
    let age_out = "has_function_privilege($1, 'inbox_age_out(text, interval)', $2)";
    checks.push((age_out.to_owned(), "EXECUTE"));
    let checks: Vec<(&str, &str)> = checks.iter().map(|(c, p)| (c.as_str(), *p)).collect();
    let (entries, counts) = (
        "has_table_privilege($1, 'inbox_entries', $2)",
        "has_table_privilege($1, 'inbox_day_counts', $2)",
    );
    assert_eq!(
        privileges_after_migrating(
            &pool,
            20_261_204_000_011,
            "GRANT SELECT, INSERT, UPDATE, DELETE ON inbox_records TO {role};
             GRANT SELECT, INSERT, UPDATE ON inbox_counts TO {role}",
            &checks,
        )
        .await,
        [
            format!("{entries} SELECT"),
            format!("{entries} INSERT"),
            format!("{entries} UPDATE"),
            format!("{entries} DELETE"),
            format!("{counts} SELECT"),
            format!("{counts} INSERT"),
            format!("{counts} UPDATE"),
            format!("{age_out} EXECUTE"),
        ]
    );
}

/// A redelivery of a message kept as an open dead letter (its termination was lost, or came
/// after the ack wait) is that letter, not a second one; a first delivery of the same bytes, a
/// message that differs, or a redelivery after the letter was closed keeps a letter of its own.
#[sqlx::test(migrations = false)]
async fn a_redelivered_dead_message_keeps_one_letter(pool: PgPool) {
    migrate(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    let letter = |payload: &'static [u8], deliveries: i64| {
        let mut letter = NewDeadLetter::new("orders.OrderPlaced.o-1", payload, "cannot parse");
        letter.message_id = Some("m-1");
        letter.headers = serde_json::json!({ headers::ID: ["m-1"] });
        letter.deliveries = deliveries;
        letter
    };
    let first = inbox.dead_letter(letter(b"{", 1)).await.unwrap();
    assert_eq!(inbox.dead_letter(letter(b"{", 2)).await.unwrap(), first);
    assert_eq!(inbox.dead_letter(letter(b"{", 7)).await.unwrap(), first);
    assert_eq!(count(&pool, "inbox_dead").await, 1);

    let copy = inbox.dead_letter(letter(b"{", 1)).await.unwrap();
    let other = inbox.dead_letter(letter(b"[", 2)).await.unwrap();
    assert!(copy != first && other != first && other != copy);
    assert_eq!(count(&pool, "inbox_dead").await, 3);

    let mut without_id = letter(b"{", 2);
    without_id.message_id = None;
    let no_id = inbox.dead_letter(without_id.clone()).await.unwrap();
    assert_eq!(inbox.dead_letter(without_id).await.unwrap(), no_id);
    assert_eq!(count(&pool, "inbox_dead").await, 4);

    for id in [first, copy, other, no_id] {
        assert!(inbox.skip_dead_letter(id).await.unwrap());
    }
    let after_closing = inbox.dead_letter(letter(b"{", 3)).await.unwrap();
    assert!(![first, copy, other, no_id].contains(&after_closing));
    assert_eq!(count(&pool, "inbox_dead").await, 5);
}

/// Only what no delivery can change is refused for good: PostgreSQL refusing the data itself
/// (a NUL byte in text, a key too large for its index), not a table an operator has yet to
/// create, nor a pool that gave no connection.
#[sqlx::test(migrations = false)]
async fn only_data_the_database_refuses_is_refused_for_good(pool: PgPool) {
    sqlx::raw_sql("CREATE TABLE keyed (k text PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let nul = sqlx::query("INSERT INTO keyed VALUES ($1)").bind("a\0b");
    let nul = nul.execute(&pool).await.unwrap_err();
    // 12,800 random hex digits cannot compress below half: still far over the 2,704 bytes of a
    // B-tree row.
    let huge = "INSERT INTO keyed SELECT string_agg(md5(random()::text), '') \
        FROM generate_series(1, 400)";
    let huge = sqlx::query(huge).execute(&pool).await.unwrap_err();
    let missing = sqlx::query("INSERT INTO missing VALUES (1)");
    let missing = missing.execute(&pool).await.unwrap_err();

    assert_eq!(inbox::refused_for_good(&nul).as_deref(), Some("22021"));
    assert_eq!(inbox::refused_for_good(&huge).as_deref(), Some("54000"));
    assert_eq!(inbox::refused_for_good(&missing), None, "{missing}");
    assert_eq!(inbox::refused_for_good(&sqlx::Error::PoolTimedOut), None);
}

/// A replay holds its letter: a skip sent while the replay's effect runs waits for it, then
/// finds the letter applied, so no letter is applied and recorded as skipped.
#[sqlx::test(migrations = false)]
async fn a_skip_waits_for_a_replay_and_finds_its_letter_applied(pool: PgPool) {
    migrate(&pool).await;
    let inbox = Inbox::new(pool.clone(), "billing");
    let id = inbox
        .dead_letter(NewDeadLetter::new(
            "orders.OrderPaid.o-1",
            b"{}",
            "no invoice yet",
        ))
        .await
        .unwrap();
    let held = inbox.hold_dead_letter(id).await.unwrap().expect("open");
    assert_eq!(held.letter().id, id);

    let skip = tokio::spawn({
        let inbox = inbox.clone();
        async move { inbox.skip_dead_letter(id).await.unwrap() }
    });
    // The skip is waiting on the held row's lock.
    let mut waiting = false;
    for _ in 0..200 {
        let locked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if locked > 0 {
            waiting = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(waiting, "the skip did not wait for the held letter");
    assert!(!skip.is_finished());

    held.close().await.unwrap();
    assert!(!skip.await.unwrap(), "the skip closed an applied letter");
    let resolution: Option<String> =
        sqlx::query_scalar("SELECT resolution FROM inbox_dead WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(resolution.as_deref(), Some("applied"));
    assert!(inbox.hold_dead_letter(id).await.unwrap().is_none());

    // A hold dropped without closing leaves its letter open.
    let other = inbox
        .dead_letter(NewDeadLetter::new(
            "orders.OrderPaid.o-2",
            b"{}",
            "no invoice yet",
        ))
        .await
        .unwrap();
    drop(inbox.hold_dead_letter(other).await.unwrap().expect("open"));
    assert!(inbox.skip_dead_letter(other).await.unwrap());
}
