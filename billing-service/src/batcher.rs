//! Which messages go into the consumer's next transaction.
//!
//! A transaction's cost is mostly its own (its round trips and its commit), not its messages',
//! so the consumer runs as few as keep up: while one runs, the messages that arrive wait, and
//! the next takes all of them (up to `CONSUMER_APPLY_BATCH`). Batches thus grow with the load.
//! Another transaction starts beside the running ones only when a full batch can be taken
//! (messages of an order that is running do not count), which is when one at a time no longer
//! keeps up (a database across a network, a backlog), up to `CONSUMER_CONCURRENCY` at once.
//! One order's messages are never in two transactions at once, and are taken in the order
//! they arrived, so they apply in that order.

use std::collections::{HashSet, VecDeque};

/// What ties messages that must apply one after another: a hash of the order id
/// (`ce-subject`). Two orders with one hash only wait for each other.
pub type Key = u64;

/// The messages waiting for a transaction and the keys of those running.
#[derive(Debug)]
pub struct Batcher<M> {
    waiting: VecDeque<(Key, M)>,
    /// Keys with a message in a running transaction.
    busy: HashSet<Key>,
    running: usize,
    max_batch: usize,
    max_running: usize,
}

/// Messages to apply in one transaction, in their order, and the keys they hold until
/// [`Batcher::finished`].
#[derive(Debug)]
pub struct Batch<M> {
    /// The messages, in the order they arrived.
    pub messages: Vec<M>,
    /// The keys of the messages, released when the batch is finished.
    pub keys: Vec<Key>,
}

impl<M> Batcher<M> {
    /// Batches of at most `max_batch` messages, at most `max_running` at once (both at least 1).
    pub fn new(max_batch: usize, max_running: usize) -> Self {
        assert!(
            max_batch > 0 && max_running > 0,
            "batch and concurrency must be positive"
        );
        Self {
            waiting: VecDeque::new(),
            busy: HashSet::new(),
            running: 0,
            max_batch,
            max_running,
        }
    }

    /// Whether another message may wait: the waiting messages are fewer than a full batch for
    /// every transaction that may run.
    pub fn has_room(&self) -> bool {
        self.waiting.len() < self.max_batch * self.max_running
    }

    /// Whether no message waits and no transaction runs.
    pub fn is_idle(&self) -> bool {
        self.running == 0 && self.waiting.is_empty()
    }

    /// Adds a message behind those waiting.
    pub fn push(&mut self, key: Key, message: M) {
        self.waiting.push_back((key, message));
    }

    /// The batch to start now, if one may start: when nothing runs, or a full batch can be
    /// taken and fewer than `max_running` run. It takes the waiting messages in order, passing
    /// over those whose key is busy (all of that key's: they wait in their order).
    pub fn start(&mut self) -> Option<Batch<M>> {
        let may_start = self.running == 0
            || (self.running < self.max_running
                && self.waiting.len() >= self.max_batch
                && self.takeable().nth(self.max_batch - 1).is_some());
        if !may_start {
            return None;
        }
        let mut batch = Batch {
            messages: Vec::new(),
            keys: Vec::new(),
        };
        let mut kept = VecDeque::with_capacity(self.waiting.len());
        for (key, message) in std::mem::take(&mut self.waiting) {
            if batch.messages.len() < self.max_batch && !self.busy.contains(&key) {
                batch.keys.push(key);
                batch.messages.push(message);
            } else {
                kept.push_back((key, message));
            }
        }
        self.waiting = kept;
        if batch.messages.is_empty() {
            return None;
        }
        batch.keys.sort_unstable();
        batch.keys.dedup();
        self.busy.extend(batch.keys.iter().copied());
        self.running += 1;
        Some(batch)
    }

    /// The waiting messages a batch could take now, in order: those whose key is not busy.
    fn takeable(&self) -> impl Iterator<Item = &M> {
        self.waiting
            .iter()
            .filter(|(key, _)| !self.busy.contains(key))
            .map(|(_, message)| message)
    }

    /// Releases the keys of a batch [`Batcher::start`] gave, whose transaction is over.
    pub fn finished(&mut self, keys: &[Key]) {
        for key in keys {
            self.busy.remove(key);
        }
        self.running -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batcher(max_batch: usize, max_running: usize, keys: &[Key]) -> Batcher<usize> {
        let mut batcher = Batcher::new(max_batch, max_running);
        for (i, &key) in keys.iter().enumerate() {
            batcher.push(key, i);
        }
        batcher
    }

    #[test]
    fn one_transaction_takes_everything_waiting_up_to_a_batch() {
        let mut batcher = batcher(4, 8, &[1, 2, 1, 3, 4, 5]);
        let batch = batcher.start().unwrap();
        assert_eq!(batch.messages, [0, 1, 2, 3]);
        assert_eq!(batch.keys, [1, 2, 3]);
        // Two wait, fewer than a batch: they wait for the running one.
        assert!(batcher.start().is_none());
        batcher.finished(&batch.keys);
        assert_eq!(batcher.start().unwrap().messages, [4, 5]);
    }

    #[test]
    fn another_starts_beside_only_for_a_full_batch() {
        let mut batcher = batcher(2, 2, &[1, 2, 3]);
        let first = batcher.start().unwrap();
        assert_eq!(first.messages, [0, 1]);
        assert!(batcher.start().is_none(), "one waits: less than a batch");
        batcher.push(4, 3);
        assert_eq!(batcher.start().unwrap().messages, [2, 3]);
        batcher.push(5, 4);
        batcher.push(6, 5);
        assert!(batcher.start().is_none(), "two run: the most at once");
        batcher.finished(&first.keys);
        assert_eq!(batcher.start().unwrap().messages, [4, 5]);
    }

    #[test]
    fn an_orders_messages_wait_while_one_of_them_runs_and_keep_their_order() {
        let mut batcher = batcher(2, 4, &[7, 8]);
        let first = batcher.start().unwrap();
        for (key, message) in [(7, 2), (9, 3), (7, 4), (10, 5)] {
            batcher.push(key, message);
        }
        // A full batch waits, so a second starts, without key 7 (running).
        let second = batcher.start().unwrap();
        assert_eq!(second.messages, [3, 5]);
        assert!(
            batcher.start().is_none(),
            "only key 7 waits, and it is busy"
        );
        batcher.finished(&second.keys);
        batcher.finished(&first.keys);
        let third = batcher.start().unwrap();
        assert_eq!(third.messages, [2, 4]);
        batcher.finished(&third.keys);
        assert!(batcher.is_idle());
    }

    #[test]
    fn messages_of_a_running_order_do_not_count_toward_a_full_batch() {
        let mut batcher = batcher(3, 4, &[7]);
        let first = batcher.start().unwrap();
        for (key, message) in [(7, 1), (7, 2), (7, 3), (8, 4)] {
            batcher.push(key, message);
        }
        // Four wait, but three of them are key 7's, which runs: one could be taken.
        assert!(batcher.start().is_none());
        batcher.push(9, 5);
        batcher.push(10, 6);
        assert_eq!(batcher.start().unwrap().messages, [4, 5, 6]);
        batcher.finished(&first.keys);
    }

    #[test]
    fn room_for_a_full_batch_per_transaction() {
        let mut batcher = batcher(3, 2, &[1, 2, 3, 4, 5]);
        assert!(batcher.has_room());
        batcher.push(6, 5);
        assert!(!batcher.has_room());
        let batch = batcher.start().unwrap();
        assert!(batcher.has_room());
        assert!(!batcher.is_idle());
        batcher.finished(&batch.keys);
    }
}
