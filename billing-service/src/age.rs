//! When a message is too old for the inbox to deduplicate: a copy of it may have been applied
//! longer ago than the inbox keeps records, so applying it could apply it twice. Such a message
//! is dead-lettered (an operator's replay applies it all the same).
//!
//! A message can meet an earlier application of itself three ways, each judged from the earliest
//! that application could have been:
//! - **redelivered** (`delivered` > 1): its first delivery came after it was stored, so it is
//!   too old once stored longer ago than the retention;
//! - **published again** (the relay's copy after a lost acknowledgement, or of an event the
//!   broker lost): an earlier copy came after the event was first published
//!   (`ce-firstpublishedtime`, the same on every copy), so it is too old once that is longer
//!   ago than the retention. A copy is stored at least the stream's duplicate window after the
//!   first one (the broker drops one inside it);
//! - **replayed by a consumer made again** after it was stored (every message the new consumer
//!   delivers once): as a redelivery.
//!
//! A first delivery of an original is never too old, however long it waited (in the outbox
//! through an outage, behind a parked order, in the stream while billing was down). A message of
//! a producer that sends no `ce-firstpublishedtime` is judged as before it existed: too old once
//! stored, or stamped `ce-time`, longer ago than the retention.

use chrono::{DateTime, Utc};
use std::time::Duration;

/// What is known of one delivery.
#[derive(Debug, Clone, Copy)]
pub struct Delivery {
    /// When the stream stored this message.
    pub stored: DateTime<Utc>,
    /// How many times the consumer delivered it (1: the first).
    pub delivered: i64,
    /// `ce-firstpublishedtime`, when the producer sends it.
    pub first_published: Option<DateTime<Utc>>,
    /// `ce-time`: when the event was made.
    pub made: Option<DateTime<Utc>>,
    /// When the durable consumer delivering it was created.
    pub consumer_created: DateTime<Utc>,
}

/// Why `delivery` is too old to apply at `now`, if it is, for an inbox keeping records
/// `retention` on a stream whose duplicate window is `window`.
pub fn too_old(
    delivery: &Delivery,
    now: DateTime<Utc>,
    retention: Duration,
    window: Duration,
) -> Option<String> {
    let retention = chrono::Duration::from_std(retention).ok()?;
    let window = chrono::Duration::from_std(window).ok()?;
    let older = |at: DateTime<Utc>| now - at > retention;
    let reason = |what: &str, at: DateTime<Utc>| {
        format!(
            "too old to deduplicate: {what} {at}, longer ago than the inbox retention \
             (INBOX_RETENTION_MS), so a copy of it may have been applied before its record \
             was aged out"
        )
    };
    let Some(first_published) = delivery.first_published else {
        // A producer without the attribute: as before it existed.
        return [
            ("stored in the stream", Some(delivery.stored)),
            ("ce-time", delivery.made),
        ]
        .into_iter()
        .find_map(|(what, at)| at.filter(|at| older(*at)).map(|at| reason(what, at)));
    };
    let again = delivery.delivered > 1 || delivery.consumer_created > delivery.stored;
    if again && older(delivery.stored) {
        return Some(reason(
            "delivered before, stored in the stream",
            delivery.stored,
        ));
    }
    let copy = delivery.stored - first_published >= window;
    if copy && older(first_published) {
        return Some(reason("published again, first published", first_published));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
    const WINDOW: Duration = Duration::from_secs(120);

    fn days_ago(days: i64) -> DateTime<Utc> {
        Utc::now() - chrono::Duration::days(days)
    }

    fn delivery(stored: i64, first_published: i64, delivered: i64) -> Delivery {
        Delivery {
            stored: days_ago(stored),
            delivered,
            first_published: Some(days_ago(first_published)),
            made: Some(days_ago(30)),
            consumer_created: days_ago(100),
        }
    }

    fn judged(delivery: &Delivery) -> Option<String> {
        too_old(delivery, Utc::now(), RETENTION, WINDOW)
    }

    #[test]
    fn a_first_delivery_of_an_original_is_never_too_old() {
        // Made a month ago (it waited in the outbox), stored and delivered ten days later.
        assert_eq!(judged(&delivery(10, 10, 1)), None);
    }

    #[test]
    fn a_redelivery_is_too_old_once_stored_longer_ago_than_the_retention() {
        assert!(judged(&delivery(8, 8, 2)).is_some());
        assert_eq!(judged(&delivery(6, 6, 2)), None);
    }

    #[test]
    fn a_copy_published_again_is_judged_by_its_first_publish() {
        assert!(judged(&delivery(1, 9, 1)).is_some());
        assert_eq!(judged(&delivery(1, 6, 1)), None);
    }

    #[test]
    fn a_consumer_made_again_replays_as_redeliveries() {
        let mut replayed = delivery(8, 8, 1);
        replayed.consumer_created = days_ago(1);
        assert!(judged(&replayed).is_some());
    }

    #[test]
    fn without_the_attribute_the_stored_and_made_times_judge() {
        let mut old_producer = delivery(1, 1, 1);
        old_producer.first_published = None;
        assert!(judged(&old_producer).is_some(), "made a month ago");
        old_producer.made = None;
        assert_eq!(judged(&old_producer), None);
    }
}
