//! What `/ops` shows of orders-service: the outbox's counts, its dead events with their
//! actions, and the charts of the last hour; and how the outbox's gauges are brought up to date
//! for `/metrics` and for those charts.

use jetstream_outbox::outbox;
use service_kit::ApiError;
use service_kit::history::{Chart, Line, Read, Refresh};
use service_kit::ops::{Action, Column, Drain, Filter, OpsPage, Tile};

use crate::AppState;

/// What `/ops` shows: the outbox's counts and its dead events.
pub const OPS: OpsPage = OpsPage {
    service: "orders-service",
    stats: "/outbox/stats",
    tiles: &[
        Tile {
            key: "pending",
            label: "Pending events",
            alert: false,
        },
        Tile {
            key: "oldestPendingSeconds",
            label: "Oldest pending",
            alert: false,
        },
        Tile {
            key: "dead",
            label: "Dead events",
            alert: true,
        },
        Tile {
            key: "parked",
            label: "Parked aggregates",
            alert: true,
        },
        // Shown only on an instance that runs a relay.
        Tile {
            key: "broker",
            label: "Broker",
            alert: true,
        },
        // Shown only with RELAY_WAL_SLOT, which the stats hold them for.
        Tile {
            key: "walLagBytes",
            label: "WAL slot lag",
            alert: false,
        },
        Tile {
            key: "walLagSeconds",
            label: "Oldest unconfirmed WAL",
            alert: false,
        },
    ],
    dead: "/outbox/dead",
    columns: &[
        Column {
            key: "id",
            label: "Event id",
        },
        Column {
            key: "aggregateId",
            label: "Aggregate",
        },
        Column {
            key: "eventType",
            label: "Type",
        },
        Column {
            key: "attempts",
            label: "Attempts",
        },
        Column {
            key: "errorClass",
            label: "Class",
        },
        Column {
            key: "lastError",
            label: "Last error",
        },
        Column {
            key: "createdAt",
            label: "Enqueued",
        },
    ],
    actions: &[
        Action {
            name: "retry",
            label: "Retry",
        },
        Action {
            name: "skip",
            label: "Skip",
        },
    ],
    filters: &[
        Filter {
            key: "aggregateType",
            label: "Aggregate type",
            hint: "",
        },
        Filter {
            key: "aggregateId",
            label: "Aggregate id",
            hint: "o-123",
        },
        Filter::EVENT_TYPE,
        Filter::ERROR_CLASS,
        Filter::ERROR_CONTAINS,
        Filter::SINCE,
        Filter::UNTIL,
    ],
    charts: CHARTS,
    drain: Some(Drain {
        backlog: "pending",
        series: "pending",
    }),
};

/// The charts of `/ops`.
const CHARTS: &[Chart] = &[
    Chart {
        title: "Orders accepted, events published",
        unit: "/s",
        lines: &[
            Line {
                key: "accepted",
                label: "accepted",
                metric: "http_server_requests_total",
                labels: &["method=\"POST\"", "route=\"/orders\"", "status=\"201\""],
                read: Read::Rate,
            },
            Line {
                key: "published",
                label: "published",
                metric: "outbox_published_total",
                labels: &[],
                read: Read::Rate,
            },
        ],
    },
    Chart {
        title: "Backlog",
        unit: "",
        lines: &[
            Line {
                key: "pending",
                label: "pending events",
                metric: "outbox_pending_events",
                labels: &[],
                read: Read::Gauge,
            },
            Line {
                key: "dead",
                label: "dead events",
                metric: "outbox_dead_events",
                labels: &[],
                read: Read::Gauge,
            },
        ],
    },
    Chart {
        title: "Commit to PubAck",
        unit: "s",
        lines: &[
            Line {
                key: "commitToAckP50",
                label: "p50",
                metric: "outbox_commit_to_ack_seconds",
                labels: &[],
                read: Read::Quantile(0.5),
            },
            Line {
                key: "commitToAckP99",
                label: "p99",
                metric: "outbox_commit_to_ack_seconds",
                labels: &[],
                read: Read::Quantile(0.99),
            },
        ],
    },
    Chart {
        title: "Publish failures, events made dead",
        unit: "/s",
        lines: &[
            Line {
                key: "failures",
                label: "failures",
                metric: "outbox_publish_failures_total",
                labels: &[],
                read: Read::Rate,
            },
            Line {
                key: "madeDead",
                label: "made dead",
                metric: "outbox_dead_total",
                labels: &[],
                read: Read::Rate,
            },
        ],
    },
];

/// Brings the outbox gauges up to date: read from the database at most once per
/// [`service_kit::metrics::GAUGE_INTERVAL`], whoever asks.
pub async fn update_gauges(state: &AppState) -> Result<(), ApiError> {
    let current = state.gauges.get(outbox::stats(&state.pool)).await?;
    metrics::gauge!("outbox_pending_events").set(current.pending as f64);
    metrics::gauge!("outbox_pending_events_margin").set(current.pending_margin as f64);
    metrics::gauge!("outbox_dead_events").set(current.dead as f64);
    metrics::gauge!("outbox_parked_aggregates").set(current.parked as f64);
    metrics::gauge!("outbox_oldest_pending_seconds").set(current.oldest_pending_seconds);
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
