//! The background task that ages out finished outbox rows and old inbox records.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::{Inbox, outbox};

/// What a [`Cleanup`] deletes.
#[derive(Debug, Clone)]
enum Target {
    Outbox(PgPool),
    Inbox(Inbox),
}

/// Ages out, every `interval`, what is older than `retention`: published events (partitions
/// emptied whole) and skipped ones (see [`crate::outbox::cleanup`]), or inbox records (see
/// [`Inbox::cleanup`]). Dead rows and dead letters are never deleted.
#[derive(Debug, Clone)]
pub struct Cleanup {
    target: Target,
    retention: Duration,
    interval: Duration,
    batch: i64,
}

impl Cleanup {
    /// Cleans the outbox in `pool`. A `retention` over [`outbox::MAX_RETENTION`] fails every
    /// round's ageing-out of published events (logged as a warning), so check it where it is
    /// configured, as orders-service's start-up does.
    pub fn outbox(pool: PgPool, retention: Duration) -> Self {
        Self::new(Target::Outbox(pool), retention)
    }

    /// Cleans `inbox`. Keep `retention` longer than any redelivery or re-publication can
    /// arrive, or a late copy would be applied again.
    pub fn inbox(inbox: Inbox, retention: Duration) -> Self {
        Self::new(Target::Inbox(inbox), retention)
    }

    fn new(target: Target, retention: Duration) -> Self {
        Self {
            target,
            retention,
            interval: Duration::from_secs(60),
            batch: 1000,
        }
    }

    /// Runs every `interval` (default one minute).
    #[must_use]
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// One round; returns the number of rows aged out.
    pub async fn run_once(&self) -> sqlx::Result<u64> {
        match &self.target {
            Target::Outbox(pool) => outbox::cleanup(pool, self.retention, self.batch).await,
            Target::Inbox(inbox) => inbox.cleanup(self.retention, self.batch).await,
        }
    }

    /// Runs rounds until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            match self.run_once().await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "cleanup round"),
                Err(error) => tracing::warn!(error = ?error, "cleanup round failed"),
            }
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}
