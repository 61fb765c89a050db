//! The durable consumer's lag: how many messages wait for billing (not yet delivered, or
//! delivered and not yet acknowledged) and how long ago the oldest of them was stored. Read
//! from the broker (the consumer's info, then the first message after its acknowledgement
//! floor), at most once a second whoever asks.

use std::sync::Arc;

use async_nats::jetstream;
use serde::Serialize;
use service_kit::metrics::Cached;
use utoipa::ToSchema;

/// The consumer's lag, as `/inbox/stats` and `/metrics` show it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Lag {
    /// Messages waiting for billing: not yet delivered, or delivered and not yet acknowledged
    /// (`null`: the broker did not answer).
    pub waiting: Option<u64>,
    /// How long ago the oldest waiting message was stored, in seconds (0 when none waits).
    pub oldest_waiting_seconds: Option<f64>,
}

/// Reads the lag of one durable consumer.
#[derive(Debug, Clone)]
pub struct ConsumerLag {
    jetstream: jetstream::Context,
    stream: String,
    consumer: String,
    /// The consumer's filter, for the first waiting message.
    subjects: String,
    cached: Arc<Cached<Lag>>,
}

impl ConsumerLag {
    /// The lag of `consumer` on `stream`, whose filter is `subjects`.
    pub fn new(
        jetstream: jetstream::Context,
        stream: &str,
        consumer: &str,
        subjects: String,
    ) -> Self {
        Self {
            jetstream,
            stream: stream.to_owned(),
            consumer: consumer.to_owned(),
            subjects,
            cached: Arc::new(Cached::new(service_kit::metrics::GAUGE_INTERVAL)),
        }
    }

    /// The lag now (read at most once per [`service_kit::metrics::GAUGE_INTERVAL`]); unknown
    /// fields when the broker does not answer, which the next call asks again.
    pub async fn read(&self) -> Lag {
        self.cached
            .get(self.ask())
            .await
            .unwrap_or_else(|_: async_nats::Error| Lag::default())
    }

    async fn ask(&self) -> Result<Lag, async_nats::Error> {
        let stream = self.jetstream.get_stream_no_info(&self.stream).await?;
        let info = stream.consumer_info(&self.consumer).await?;
        let waiting = info.num_pending + info.num_ack_pending as u64;
        if waiting == 0 {
            return Ok(Lag {
                waiting: Some(0),
                oldest_waiting_seconds: Some(0.0),
            });
        }
        let oldest = stream
            .get_first_raw_message_by_subject(&self.subjects, info.ack_floor.stream_sequence + 1)
            .await
            .ok()
            .map(|message| {
                let stored = message.time.unix_timestamp_nanos();
                let now = i128::from(chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0));
                ((now - stored) as f64 / 1e9).max(0.0)
            });
        Ok(Lag {
            waiting: Some(waiting),
            oldest_waiting_seconds: oldest,
        })
    }
}
