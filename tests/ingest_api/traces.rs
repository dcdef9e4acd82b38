//! Traces (`telemetry.otlp_endpoint`): the ingest-api binary, started as a deployment
//! starts it, exports its spans over OTLP/HTTP to a receiver in this test, which
//! decodes them with OpenTelemetry's own protobuf types: a send is a request span with
//! the HTTP attributes and the request id the answer carried, its `send` child in the
//! same trace, and the group-commit batch's span linked to it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use chatpipe_tests::{as_service, fresh_database, migrate_as_owner, registry_url, JWT_SECRET};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use prost::Message;
use secrecy::SecretString;

/// A span as the receiver got it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent: Vec<u8>,
    links: Vec<Vec<u8>>,
    attributes: Vec<(String, String)>,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
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
async fn receive(State(spans): State<Arc<Mutex<Vec<Received>>>>, body: Bytes) -> &'static str {
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

#[tokio::test]
async fn a_send_is_one_trace_of_its_request_and_its_send_linked_from_its_batch() {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let receiver = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/v1/traces", receiver.local_addr().unwrap());
    let app = axum::Router::new()
        .route("/v1/traces", post(receive))
        .with_state(spans.clone());
    tokio::spawn(async move { axum::serve(receiver, app).await });

    let url = fresh_database().await;
    migrate_as_owner(&url).await;
    let bin = std::env::var("CHATPIPE_INGEST_API_BIN").unwrap_or_else(|_| {
        panic!("CHATPIPE_INGEST_API_BIN is not set: run the suite with scripts/test")
    });
    let (port, admin) = (free_port(), free_port());
    let mut child = tokio::process::Command::new(bin)
        .env("DATABASE_URL", as_service(&url))
        .env("CHATPIPE_DATABASE__MIGRATE_ON_START", "false")
        .env("JWT_SECRET", JWT_SECRET)
        .env("SCHEMA_REGISTRY_URL", registry_url())
        .env("KAFKA_BROKERS", chatpipe_tests::stream::brokers())
        .env("INGEST_ADDR", format!("127.0.0.1:{port}"))
        .env("INGEST_ADMIN_ADDR", format!("127.0.0.1:{admin}"))
        .env("CHATPIPE_TELEMETRY__OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("RUST_LOG", "info")
        .kill_on_drop(true)
        .spawn()
        .expect("ingest-api starts");
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "ingest-api not ready on {base}"
        );
        assert!(child.try_wait().unwrap().is_none(), "ingest-api exited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let keys = TokenKeys::new(&SecretString::from(JWT_SECRET), Duration::ZERO).unwrap();
    let token = keys.issue(UserId::new(1).unwrap(), Duration::from_secs(600));
    let created: serde_json::Value = http
        .post(format!("{base}/v1/conversations"))
        .bearer_auth(&token)
        .json(&serde_json::json!({"type": "GROUP", "memberIds": [2]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let conversation = created["conversationId"].as_i64().unwrap();
    let request_id = format!("trace-{}", uuid::Uuid::new_v4());
    let answer = http
        .post(format!("{base}/v1/conversations/{conversation}/messages"))
        .bearer_auth(&token)
        .header("x-request-id", &request_id)
        .json(&serde_json::json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "traced"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);
    assert_eq!(answer.headers()["x-request-id"], request_id.as_str());

    // The request's span, its `send` and the batch that wrote it, once exported.
    let route = "POST /v1/conversations/{id}/messages";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (request, send, batch) = loop {
        let found = {
            let spans = spans.lock().unwrap();
            let request = spans
                .iter()
                .find(|s| s.name == route && s.attribute("request_id") == Some(&request_id))
                .cloned();
            let send = request.as_ref().and_then(|r| {
                spans
                    .iter()
                    .find(|s| s.name == "send" && s.parent == r.span_id)
                    .cloned()
            });
            let batch = send.as_ref().and_then(|s| {
                spans
                    .iter()
                    .find(|b| b.name == "send.batch" && b.links.contains(&s.span_id))
                    .cloned()
            });
            request.zip(send).zip(batch).map(|((r, s), b)| (r, s, b))
        };
        if let Some(found) = found {
            break found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request span, send child and linked batch after 30 s: {:#?}",
            spans.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(request.service, "ingest-api");
    assert!(request.parent.is_empty(), "the request starts its trace");
    assert_eq!(request.attribute("http.request.method"), Some("POST"));
    assert_eq!(
        request.attribute("http.route"),
        Some("/v1/conversations/{id}/messages")
    );
    assert_eq!(request.attribute("http.response.status_code"), Some("201"));
    assert_eq!(
        send.trace_id, request.trace_id,
        "the send is in the request's trace"
    );
    assert_eq!(
        send.attribute("conversation_id"),
        Some(conversation.to_string().as_str())
    );
    assert!(
        batch.parent.is_empty(),
        "a batch answers many requests: a trace of its own"
    );
    assert_eq!(batch.attribute("messages"), Some("1"));
    child.kill().await.unwrap();
}
