//! Relay drain: a backlog of pending events, published by 1 or more relays.

use std::time::{Duration, Instant};

use jetstream_outbox::testing::{SlotGuard, slot_streamed_by};
use jetstream_outbox::wal::WalWakeup;
use jetstream_outbox::{JetStreamPublisher, Relay, RelayConfig, Wakeup};
use service_kit::testing;
use tokio_util::sync::CancellationToken;

use super::filled::Filled;
use super::wal::Wake;

/// Fills a fresh outbox with `events` pending rows (five events per order), starts `relays`
/// relays with the service's default settings, deleting rows as they publish them when
/// `delete_published` (`OUTBOX_RETENTION_MS=0`), and returns events per second until none is
/// pending. Fails unless the stream then holds exactly `events` messages. With `filled`, the
/// database is a copy of its filled one, holding its published events in `outbox_published`.
pub async fn drain(
    events: i64,
    relays: usize,
    delete_published: bool,
    filled: Option<&Filled>,
) -> anyhow::Result<f64> {
    drain_at(
        events,
        relays,
        delete_published,
        filled,
        &testing::nats_url(),
        Wake::Poll,
    )
    .await
}

/// [`drain`] with one relay keeping rows, woken as `wake` says.
pub async fn drain_woken(events: i64, wake: Wake) -> anyhow::Result<f64> {
    drain_at(events, 1, false, None, &testing::nats_url(), wake).await
}

/// [`drain`] to the nats-server at `url`, the relays woken as `wake` says.
pub async fn drain_at(
    events: i64,
    relays: usize,
    delete_published: bool,
    filled: Option<&Filled>,
    url: &str,
    wake: Wake,
) -> anyhow::Result<f64> {
    let database = testing::unique("bench_drain");
    if let Some(filled) = filled {
        filled.copy_orders(&database).await?;
    }
    let stream = testing::unique("BENCH_DRAIN");
    let prefix = stream.to_lowercase();
    let pool =
        service_kit::infra::connect_db(&testing::database_url(&database), 3 * relays as u32 + 4)
            .await?;
    orders_service::startup::migrate(&pool).await?;
    let js = async_nats::jetstream::new(async_nats::connect(url).await?);
    super::refs::create_stream(&js, &stream, &prefix).await?;

    // Time-ordered ids (UUIDv7), as `enqueue` makes them: random ones would scatter the
    // writes to the id index and slow down every relay pass for a reason no deployment has.
    let ids: Vec<uuid::Uuid> = (0..events).map(|_| uuid::Uuid::now_v7()).collect();
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
         SELECT id, 'order', 'o' || (i % $2), 'OrderPlaced',
                jsonb_build_object('orderId', 'o' || (i % $2), 'customer', 'bench',
                                   'totalMinor', i, 'status', 'placed')
         FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, i)",
    )
    .bind(ids)
    .bind((events / 5).max(1))
    .execute(&pool)
    .await?;
    sqlx::query("ANALYZE outbox").execute(&pool).await?;

    let shutdown = CancellationToken::new();
    let wakeup = Wakeup::in_process();
    // Started after the backlog's insert: the slot is made past it, and its walsender decodes
    // only what the relays write.
    let (streaming, slot) = match wake {
        Wake::Poll => (None, None),
        Wake::Wal => {
            let slot = testing::unique("bench_wal");
            let guard = SlotGuard::new(&super::wal::database_options(&database), &slot);
            let stream = WalWakeup::new(&testing::database_url(&database), &slot, &wakeup)?
                .run(pool.clone(), shutdown.clone());
            let streaming = tokio::spawn(stream);
            slot_streamed_by(&pool, &slot).await;
            (Some(streaming), Some(guard))
        }
    };
    // Dropped before the slot's guard, on an error too: nothing streams the slot then.
    let _stop = shutdown.clone().drop_guard();
    let start = Instant::now();
    let tasks: Vec<_> = (0..relays)
        .map(|_| {
            let mut config = RelayConfig::new(prefix.clone(), "/bench");
            config.delete_published = delete_published;
            let relay = Relay::new(
                pool.clone(),
                JetStreamPublisher::new(js.clone()).with_timeout(Duration::from_secs(5)),
                config,
            )
            .with_wakeup(&wakeup);
            tokio::spawn(relay.run(shutdown.clone()))
        })
        .collect();
    none_pending(&pool, Duration::from_secs(600)).await?;
    let rate = events as f64 / start.elapsed().as_secs_f64();
    shutdown.cancel();
    for task in tasks {
        task.await?;
    }
    if let Some(streaming) = streaming {
        streaming.await??;
    }
    drop(slot);

    let stored = js.get_stream(&stream).await?.info().await?.state.messages;
    pool.close().await;
    testing::drop_database(&database).await;
    js.delete_stream(&stream).await?;
    anyhow::ensure!(
        stored == events as u64,
        "the stream holds {stored} of {events} events"
    );
    Ok(rate)
}

/// Waits (polling, up to `limit`) until the outbox in `pool` holds no pending event.
pub(super) async fn none_pending(pool: &sqlx::PgPool, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        // EXISTS stops at the first pending row: counting them all every few milliseconds
        // would load the server the relays are measured on.
        let pending: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox WHERE status = 'pending')")
                .fetch_one(pool)
                .await?;
        if !pending {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "events still pending after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
