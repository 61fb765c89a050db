//! `tracing` set-up: `LOG_FORMAT=json` for machines, anything else for people; `RUST_LOG`
//! filters the log (default `info`). With an OTLP endpoint configured, the service's spans are
//! also exported over OTLP/HTTP, each continuing the W3C `traceparent` it was given.

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider,
};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::{Resource, trace::SdkTracerProvider};
use tracing::Level;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{
    EnvFilter, Layer, filter::Targets, layer::SubscriberExt, util::SubscriberInitExt,
};

use crate::config::{LogFormat, Otlp};

/// Keeps span export running; dropping it sends what is still buffered.
#[derive(Debug)]
#[must_use = "dropping it stops span export"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(error) = provider.shutdown()
        {
            tracing::warn!(%error, "span export did not flush");
        }
    }
}

/// Installs the global subscriber (a second call, as in tests, keeps the first) and, with
/// `otlp`, the span exporter; `service` names the spans' source unless `OTEL_SERVICE_NAME` does.
pub fn init(format: LogFormat, otlp: Option<&Otlp>, service: &str) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer();
    let fmt = if format == LogFormat::Json {
        fmt.json()
            .flatten_event(true)
            .with_current_span(true)
            .with_filter(filter)
            .boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    let provider = otlp.map(|otlp| exporter(otlp, service)).transpose()?;
    // Spans are exported whatever RUST_LOG says: quieting the log must not cut traces.
    let spans = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("service-kit"))
            .with_filter(
                Targets::new()
                    .with_default(Level::WARN)
                    .with_target("service_kit", Level::INFO)
                    .with_target("jetstream_outbox", Level::INFO)
                    .with_target("orders_service", Level::INFO)
                    .with_target("billing_service", Level::INFO),
            )
    });
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(spans)
        .try_init();
    Ok(Telemetry { provider })
}

/// A batching OTLP/HTTP span exporter for `otlp`.
fn exporter(otlp: &Otlp, service: &str) -> anyhow::Result<SdkTracerProvider> {
    let protocol = if otlp.json {
        Protocol::HttpJson
    } else {
        Protocol::HttpBinary
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(&otlp.endpoint)
        .with_protocol(protocol)
        .build()?;
    let name = otlp.service_name.as_deref().unwrap_or(service).to_owned();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(name).build())
        .build())
}

/// Makes `span` a child of the W3C `traceparent`'s span, for export; without an exporter, or
/// with no valid `traceparent`, nothing changes (log lines carry the trace id themselves).
pub fn continue_trace(span: &tracing::Span, traceparent: Option<&str>) {
    if let Some(parent) = traceparent.and_then(parse_traceparent) {
        let context = opentelemetry::Context::new().with_remote_span_context(parent);
        // Fails only when the span is disabled, and then there is nothing to export.
        let _ = span.set_parent(context);
    }
}

/// The `traceparent` of the current span when spans are exported, so the next hop becomes its
/// child; `None` without an exporter.
pub fn current_traceparent() -> Option<String> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let span = span.span_context();
    span.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            span.trace_id(),
            span.span_id(),
            span.trace_flags().to_u8()
        )
    })
}

/// A version-00 `traceparent` as a remote span context.
fn parse_traceparent(traceparent: &str) -> Option<SpanContext> {
    if !jetstream_outbox::event::is_traceparent(traceparent) {
        return None;
    }
    let mut parts = traceparent.split('-').skip(1);
    let trace = TraceId::from_hex(parts.next()?).ok()?;
    let span = SpanId::from_hex(parts.next()?).ok()?;
    let flags = u8::from_str_radix(parts.next()?, 16).ok()?;
    Some(SpanContext::new(
        trace,
        span,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_through_a_span_context() {
        let given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let context = parse_traceparent(given).unwrap();
        assert_eq!(
            context.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(context.span_id().to_string(), "b7ad6b7169203331");
        assert!(context.is_sampled() && context.is_remote());
        assert!(
            parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033-01").is_none()
        );
        assert!(parse_traceparent("garbage").is_none());
    }

    #[test]
    fn without_an_exporter_there_is_no_span_context() {
        let span = tracing::info_span!("request");
        continue_trace(
            &span,
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        let _entered = span.enter();
        assert_eq!(current_traceparent(), None);
    }
}
