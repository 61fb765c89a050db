//! The metrics the crate records, through the [`metrics`](https://docs.rs/metrics) facade (the
//! application picks the exporter). [`describe`] gives each its help text and unit, as
//! Prometheus' `# HELP` lines: call it once the application's recorder is installed.

use metrics::Unit;

/// Gives every metric of the crate its help text and unit.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "outbox_published_total",
        Unit::Count,
        "Events the broker acknowledged and the relay recorded published."
    );
    describe_counter!(
        "outbox_publish_failures_total",
        Unit::Count,
        "Publishes that failed: refused by the broker, or not acknowledged (unreachable, slow, \
         full)."
    );
    describe_counter!(
        "outbox_dead_total",
        Unit::Count,
        "Events that became dead: refused too often, or never publishable; each parks its \
         aggregate."
    );
    describe_counter!(
        "outbox_record_failures_total",
        Unit::Count,
        "Relay passes whose record failed after their publishes; recorded again without \
         publishing again."
    );
    describe_counter!(
        "outbox_found_stored_total",
        Unit::Count,
        "Events whose earlier publish had no clear answer, found in the stream and so not \
         published again."
    );
    describe_counter!(
        "outbox_relay_claims_total",
        Unit::Count,
        "The relay's claims, by outcome: rows found, or empty."
    );
    describe_repair();
    describe_gauge!(
        "outbox_broker_unreachable",
        "1 while the relay cannot reach the broker, else 0."
    );
    describe_gauge!(
        "outbox_broker_storage_full",
        "1 while the broker has no room for the relay's messages (its storage limits), else 0."
    );
    describe_gauge!(
        "outbox_wal_lag_bytes",
        Unit::Bytes,
        "WAL the relay's replication slot has not confirmed (feature `wal`)."
    );
    describe_gauge!(
        "outbox_wal_lag_seconds",
        Unit::Seconds,
        "How long the oldest WAL the relay's replication slot has not confirmed has waited, at least, as this instance's readings saw it (feature `wal`)."
    );
    describe_gauge!(
        "outbox_wal_streaming",
        "1 while this instance streams the relay's replication slot, 0 while it stands by (feature `wal`)."
    );
    describe_counter!(
        "outbox_wal_slot_recreated_total",
        Unit::Count,
        "Replication slots made again after the server removed WAL they needed, or because they were older than their publication (feature `wal`)."
    );
    describe_histogram!(
        "outbox_commit_to_ack_seconds",
        Unit::Seconds,
        "From an event's insert into the outbox to the broker's acknowledgement."
    );
    describe_histogram!(
        "outbox_relay_batch_size",
        Unit::Count,
        "Rows a relay pass claimed and published."
    );
    describe_counter!(
        "inbox_processed_total",
        Unit::Count,
        "Messages whose effect the inbox applied."
    );
    describe_counter!(
        "inbox_duplicates_total",
        Unit::Count,
        "Deliveries of a message already applied: acknowledged, nothing applied."
    );
    describe_counter!(
        "inbox_id_reused_total",
        Unit::Count,
        "Messages with the id of an applied message but another content: not applied."
    );
    describe_counter!(
        "inbox_dead_letters_total",
        Unit::Count,
        "Messages kept as dead letters: they cannot be parsed, applied or deduplicated."
    );
}

/// The metrics of the stream repair.
fn describe_repair() {
    use metrics::describe_counter;
    describe_counter!(
        "outbox_republished_total",
        Unit::Count,
        "Events the broker acknowledged and then lost, moved back into the outbox to be \
         published again."
    );
    describe_counter!(
        "outbox_stream_damaged_total",
        Unit::Count,
        "Streams deleted and made again because they returned none of the messages they \
         counted: their files were gone from under the broker."
    );
    metrics::describe_gauge!(
        "outbox_stream_damaged",
        "1 while the stream returns none of the messages it counts and nothing is published to \
         it (the relay deletes and makes it again, or waits for an operator to), else 0."
    );
    describe_counter!(
        "outbox_stream_checks_total",
        Unit::Count,
        "The relay's checks of its stream for what the broker forgot, by outcome."
    );
}
