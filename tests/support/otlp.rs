//! An OTLP/HTTP traces receiver in the test: the services export their spans to it as
//! they would to a collector, and it decodes them with OpenTelemetry's own protobuf types.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use prost::Message;

/// A span as the receiver got it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The exporting process's `service.name`.
    pub service: String,
    pub name: String,
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    /// Empty for a span that starts its trace.
    pub parent: Vec<u8>,
    /// The span ids it links to.
    pub links: Vec<Vec<u8>>,
    pub attributes: Vec<(String, String)>,
}

impl Received {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

type Spans = Arc<Mutex<Vec<Received>>>;

/// The receiver: `endpoint` is the URL to give a service as
/// `telemetry.otlp_endpoint`. Serves until the test ends.
pub struct Receiver {
    pub endpoint: String,
    spans: Spans,
}

impl Receiver {
    pub async fn start() -> Self {
        let spans = Spans::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route("/v1/traces", post(receive))
            .with_state(spans.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { endpoint, spans }
    }

    /// Polls what has arrived until `find` finds something in it; panics with every span
    /// received when `deadline` passes first.
    pub async fn until<T>(
        &self,
        deadline: Duration,
        what: &str,
        find: impl Fn(&[Received]) -> Option<T>,
    ) -> T {
        let end = tokio::time::Instant::now() + deadline;
        loop {
            if let Some(found) = find(&self.spans.lock().unwrap()) {
                return found;
            }
            assert!(
                tokio::time::Instant::now() < end,
                "{what}: not received in {deadline:?}; received: {:#?}",
                self.spans.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn text(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// `POST /v1/traces`: OTLP/HTTP in protobuf, as a collector takes it.
async fn receive(State(spans): State<Spans>, body: Bytes) -> &'static str {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
    let mut spans = spans.lock().unwrap();
    for rs in request.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(text)
            .unwrap_or_default();
        for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
            spans.push(Received {
                service: service.clone(),
                name: span.name,
                trace_id: span.trace_id,
                span_id: span.span_id,
                parent: span.parent_span_id,
                links: span.links.into_iter().map(|l| l.span_id).collect(),
                attributes: span
                    .attributes
                    .iter()
                    .map(|kv| (kv.key.clone(), text(kv)))
                    .collect(),
            });
        }
    }
    ""
}
