//! Logging, traces and metrics set-up shared by the services.

use std::sync::OnceLock;

use anyhow::Context as _;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
pub use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use serde::Deserialize;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Where a service's spans go (`[telemetry]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// An OTLP/HTTP traces URL (`http://collector:4318/v1/traces`), used as given:
    /// spans are exported there in protobuf, batched (`OTEL_BSP_*` tune the batches).
    /// Unset: no span leaves the process.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
}

/// The span exporter [`init_tracing`] started, if any: shut it down at the end of the
/// process, or the spans of its last moments are lost (a tracer keeps its provider alive,
/// so dropping this does not flush).
#[must_use = "shut it down when the service stops"]
pub struct Tracing(Option<SdkTracerProvider>);

impl Tracing {
    /// No exporter: logs only.
    pub fn none() -> Self {
        Self(None)
    }

    /// Exports what is still batched and stops the exporter. Blocks: call it from
    /// `spawn_blocking` or after the runtime's work is done.
    pub fn shutdown(self) {
        if let Some(provider) = self.0 {
            if let Err(err) = provider.shutdown() {
                eprintln!("shutting down the span exporter: {err}");
            }
        }
    }
}

/// Links `span` to `to` (an OpenTelemetry span link): a group-commit batch's span to
/// each request it answers. Without an exporter it does nothing.
pub fn link(span: &tracing::Span, to: &tracing::Span) {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let cx = to.context();
    let linked = cx.span().span_context().clone();
    if linked.is_valid() {
        span.add_link(linked);
    }
}

/// The record header, and the outbox column, that carries a trace from one service to
/// the next: a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`).
pub const TRACEPARENT: &str = "traceparent";

/// `span`'s trace context as a W3C `traceparent`, for the next service to continue
/// ([`continue_trace`]). `None` without an exporter: nothing is carried then.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = std::collections::HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Makes `span` a child of the span a `traceparent` from another service names. A value
/// that is not a valid `traceparent` leaves `span` where it is (a trace of its own).
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let carrier =
        std::collections::HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        // Fails only for a span already started elsewhere; ours are new.
        let _ = span.set_parent(cx);
    }
}

fn env_filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

/// Logs to stderr; `RUST_LOG` filters (default `info`), `LOG_FORMAT=json` for machines.
pub fn init_logging() {
    let _ = init_tracing("", &TelemetrySettings::default());
}

/// Logs as [`init_logging`] does and, with `settings.otlp_endpoint`, exports the spans
/// `RUST_LOG` lets through as OpenTelemetry spans of `service` (`service.name`) over
/// OTLP/HTTP, batched on the SDK's own thread. A second call in one process (tests start
/// many services in one) keeps the first subscriber and exports nothing.
pub fn init_tracing(service: &str, settings: &TelemetrySettings) -> anyhow::Result<Tracing> {
    let provider = match &settings.otlp_endpoint {
        None => None,
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(endpoint)
                .build()
                .with_context(|| format!("the OTLP span exporter for {endpoint}"))?;
            Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(
                        Resource::builder()
                            .with_service_name(service.to_owned())
                            .build(),
                    )
                    .build(),
            )
        }
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = if std::env::var("LOG_FORMAT").as_deref() == Ok("json") {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    let spans = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("chatpipe"))
            .with_filter(env_filter())
    });
    let installed = tracing_subscriber::registry()
        .with(fmt.with_filter(env_filter()))
        .with(spans)
        .try_init();
    if installed.is_err() {
        // Another subscriber was first: spans would go nowhere, so stop the exporter.
        Tracing(provider).shutdown();
        return Ok(Tracing(None));
    }
    Ok(Tracing(provider))
}

/// Buckets for latency histograms (names ending in `_seconds`): 0.5 ms to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Buckets for every other histogram, which counts things (messages per batch, keys per
/// flush, rows per write): 1 to 10,000.
const SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

/// A Prometheus recorder with chatpipe's buckets, not installed anywhere: the
/// process-wide one of [`metrics_handle`], or a test's own.
pub fn recorder() -> PrometheusRecorder {
    PrometheusBuilder::new()
        .set_buckets(SIZE_BUCKETS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS))
        .expect("static buckets are valid")
        .build_recorder()
}

/// Installs the process-wide Prometheus recorder once and returns its handle.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = recorder();
            let handle = recorder.handle();
            // Fails only if another recorder was installed first; then ours just renders nothing new.
            let _ = metrics::set_global_recorder(recorder);
            crate::catalogue::describe_all();
            handle
        })
        .clone()
}

/// The git revision the binary was built from: `CHATPIPE_REVISION` at build time
/// (`scripts/demo` and the Dockerfile set it), else "unknown" (debug builds: a revision
/// baked in would rebuild every crate after each commit).
pub const REVISION: &str = match option_env!("CHATPIPE_REVISION") {
    Some(revision) => revision,
    None => "unknown",
};

/// Registers counters at 0 when the process starts. A counter that first appears at its
/// first increment starts its series at 1, and an alert's `increase()` or `rate()` reads
/// no change there: the first seq gap after an auditor starts would never fire
/// `ChatpipeSeqGap`, and an alert adding two rates would stay empty while one of the two
/// series was missing. Every counter an alert reads is registered so
/// (`tests/drill/` scrapes each running service for them).
pub fn count_from_zero(counters: &[&'static str]) {
    for name in counters {
        metrics::counter!(*name).increment(0);
    }
}

/// Sets `chatpipe_build_info{service, version, revision}` to 1: which build answers.
pub fn build_info(service: &str) {
    let _ = metrics_handle();
    metrics::gauge!(
        "chatpipe_build_info",
        "service" => service.to_owned(),
        "version" => env!("CARGO_PKG_VERSION"),
        "revision" => REVISION,
    )
    .set(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    /// `traceparent` and `continue_trace` against OpenTelemetry's own propagator and
    /// span contexts (a provider with no exporter: the spans are only made).
    #[test]
    fn a_trace_goes_on_in_the_span_its_traceparent_names_and_only_there() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let writer = tracing::info_span!("send");
            let carried = traceparent(&writer).expect("an exported span has a context");
            let sent = writer.context().span().span_context().clone();
            assert_eq!(
                carried,
                format!("00-{}-{}-01", sent.trace_id(), sent.span_id())
            );

            let reader = tracing::info_span!(parent: None, "fanout");
            continue_trace(&reader, &carried);
            let read = reader.context().span().span_context().clone();
            assert_eq!(read.trace_id(), sent.trace_id(), "the same trace");
            assert_ne!(read.span_id(), sent.span_id(), "a span of its own");

            let stray = tracing::info_span!(parent: None, "fanout");
            continue_trace(&stray, "00-not-a-trace-01");
            let own = stray.context().span().span_context().clone();
            assert!(own.is_valid());
            assert_ne!(own.trace_id(), sent.trace_id(), "a trace of its own");
        });
        assert_eq!(
            traceparent(&tracing::Span::none()),
            None,
            "no exporter, nothing carried"
        );
    }
}
