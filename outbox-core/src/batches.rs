//! Deleting rows a batch at a time, for the outbox's and the inbox's row-by-row cleanups.

use std::future::Future;

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
