//! Logging and metrics set-up shared by the services.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
pub use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};
use tracing_subscriber::EnvFilter;

/// Logs to stderr; `RUST_LOG` filters (default `info`), `LOG_FORMAT=json` for machines.
pub fn init_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = if std::env::var("LOG_FORMAT").as_deref() == Ok("json") {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    // A second init (tests start many apps in one process) keeps the first subscriber.
    let _ = result;
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
