//! What `/ops` shows of billing-service: the inbox's counts and the consumer's lag, its dead
//! letters with their actions, and the charts of the last hour; and how the gauges are brought
//! up to date for `/metrics` and for those charts.

use service_kit::ApiError;
use service_kit::history::{Chart, Line, Read, Refresh};
use service_kit::ops::{Action, Column, Filter, OpsPage, Tile};

use crate::AppState;

/// What `/ops` shows: the inbox's counts and its open dead letters.
pub const OPS: OpsPage = OpsPage {
    service: "billing-service",
    stats: "/inbox/stats",
    tiles: &[
        Tile {
            key: "processed",
            label: "Processed messages",
            alert: false,
        },
        Tile {
            key: "duplicate",
            label: "Duplicates recognised",
            alert: false,
        },
        Tile {
            key: "dead",
            label: "Open dead letters",
            alert: true,
        },
        Tile {
            key: "waiting",
            label: "Waiting in the consumer",
            alert: false,
        },
        Tile {
            key: "oldestWaitingSeconds",
            label: "Oldest waiting",
            alert: false,
        },
    ],
    dead: "/inbox/dead",
    columns: &[
        Column {
            key: "id",
            label: "Id",
        },
        Column {
            key: "messageId",
            label: "Message id",
        },
        Column {
            key: "subject",
            label: "Subject",
        },
        Column {
            key: "errorClass",
            label: "Class",
        },
        Column {
            key: "error",
            label: "Error",
        },
        Column {
            key: "deliveries",
            label: "Deliveries",
        },
        Column {
            key: "createdAt",
            label: "Dead since",
        },
    ],
    actions: &[
        Action {
            name: "retry",
            label: "Replay",
        },
        Action {
            name: "skip",
            label: "Skip",
        },
    ],
    filters: &[
        Filter::EVENT_TYPE,
        Filter::ERROR_CLASS,
        Filter::ERROR_CONTAINS,
        Filter::SINCE,
        Filter::UNTIL,
    ],
    charts: CHARTS,
    drain: None,
};

/// The charts of `/ops`.
const CHARTS: &[Chart] = &[
    Chart {
        title: "Messages applied",
        unit: "/s",
        lines: &[
            Line {
                key: "processed",
                label: "invoiced",
                metric: "inbox_processed_total",
                labels: &[],
                read: Read::Rate,
            },
            Line {
                key: "duplicates",
                label: "duplicates",
                metric: "inbox_duplicates_total",
                labels: &[],
                read: Read::Rate,
            },
        ],
    },
    Chart {
        title: "Waiting in the consumer",
        unit: "",
        lines: &[
            Line {
                key: "waiting",
                label: "waiting",
                metric: "billing_consumer_waiting_messages",
                labels: &[],
                read: Read::Gauge,
            },
            Line {
                key: "openDeadLetters",
                label: "open dead letters",
                metric: "inbox_dead_letters_open",
                labels: &[],
                read: Read::Gauge,
            },
        ],
    },
    Chart {
        title: "Publish to invoice",
        unit: "s",
        lines: &[
            Line {
                key: "publishToApplyP50",
                label: "p50",
                metric: "billing_publish_to_apply_seconds",
                labels: &[],
                read: Read::Quantile(0.5),
            },
            Line {
                key: "publishToApplyP99",
                label: "p99",
                metric: "billing_publish_to_apply_seconds",
                labels: &[],
                read: Read::Quantile(0.99),
            },
        ],
    },
    Chart {
        title: "Dead letters made",
        unit: "/s",
        lines: &[Line {
            key: "deadLetters",
            label: "dead letters",
            metric: "inbox_dead_letters_total",
            labels: &[],
            read: Read::Rate,
        }],
    },
];

/// Brings the gauges up to date: the inbox's from the database, the consumer's lag from the
/// broker, each at most once per [`service_kit::metrics::GAUGE_INTERVAL`], whoever asks.
pub async fn update_gauges(state: &AppState) -> Result<(), ApiError> {
    let current = state.gauges.get(state.rules.inbox().stats()).await?;
    metrics::gauge!("inbox_dead_letters_open").set(current.dead as f64);
    let lag = state.lag.read().await;
    if let Some(waiting) = lag.waiting {
        metrics::gauge!("billing_consumer_waiting_messages").set(waiting as f64);
    }
    if let Some(oldest) = lag.oldest_waiting_seconds {
        metrics::gauge!("billing_consumer_oldest_waiting_seconds").set(oldest);
    }
    Ok(())
}

/// [`update_gauges`] for the charts' sampler, which carries on when the database is away.
pub fn refresh(state: AppState) -> Refresh {
    Refresh::new(move || {
        let state = state.clone();
        Box::pin(async move {
            if let Err(error) = update_gauges(&state).await {
                tracing::debug!(error = ?error, "the charts' gauges not updated");
            }
        })
    })
}
