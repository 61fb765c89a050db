//! The background task that ages out finished outbox rows and old inbox records.

use std::future::Future;
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

/// Runs `delete_batch` with a batch size of `batch` (at least 1: a batch of 0 would never end)
/// until a batch deletes fewer rows than asked; returns how many rows were deleted.
pub(crate) async fn in_batches<F, Fut>(batch: i64, mut delete_batch: F) -> sqlx::Result<u64>
where
    F: FnMut(i64) -> Fut,
    Fut: Future<Output = sqlx::Result<u64>>,
{
    let batch = batch.max(1);
    let mut deleted = 0;
    loop {
        let n = delete_batch(batch).await?;
        deleted += n;
        if n < batch.unsigned_abs() {
            return Ok(deleted);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::in_batches;

    /// Deletes from `rows` as a statement with `LIMIT batch` would, recording each batch asked.
    async fn run(rows: u64, batch: i64) -> (u64, Vec<i64>) {
        let left = RefCell::new(rows);
        let asked = RefCell::new(Vec::new());
        let deleted = in_batches(batch, |batch| {
            asked.borrow_mut().push(batch);
            let n = (*left.borrow()).min(batch.unsigned_abs());
            *left.borrow_mut() -= n;
            async move { Ok(n) }
        })
        .await
        .unwrap();
        (deleted, asked.into_inner())
    }

    #[tokio::test]
    async fn batches_run_until_one_comes_back_short() {
        assert_eq!(run(2500, 1000).await, (2500, vec![1000, 1000, 1000]));
        assert_eq!(run(2000, 1000).await, (2000, vec![1000, 1000, 1000]));
        assert_eq!(run(0, 1000).await, (0, vec![1000]));
    }

    #[tokio::test]
    async fn a_batch_below_one_counts_as_one_and_ends() {
        assert_eq!(run(2, 0).await, (2, vec![1, 1, 1]));
        assert_eq!(run(0, -5).await, (0, vec![1]));
    }
}
