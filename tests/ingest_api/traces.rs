//! Traces (`telemetry.otlp_endpoint`): the ingest-api binary, started as a deployment
//! starts it, exports its spans over OTLP/HTTP to a receiver in this test, which
//! decodes them with OpenTelemetry's own protobuf types: a send is a request span with
//! the HTTP attributes and the request id the answer carried, its `send` child in the
//! same trace, and the group-commit batch's span linked to it.

use std::time::Duration;

use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use chatpipe_tests::binaries::spawn_ingest_api;
use chatpipe_tests::otlp::Receiver;
use chatpipe_tests::{fresh_database, migrate_as_owner, JWT_SECRET};
use secrecy::SecretString;

#[tokio::test]
async fn a_send_is_one_trace_of_its_request_and_its_send_linked_from_its_batch() {
    let receiver = Receiver::start().await;
    let url = fresh_database().await;
    migrate_as_owner(&url).await;
    let api = spawn_ingest_api(
        &url,
        "chat.events-value",
        &[
            ("CHATPIPE_TELEMETRY__OTLP_ENDPOINT", &receiver.endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    let base = &api.base;
    let http = reqwest::Client::new();

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
    let (request, send, batch) = receiver
        .until(
            Duration::from_secs(30),
            "the request's span, its send child and the batch linked to it",
            |spans| {
                let request = spans
                    .iter()
                    .find(|s| s.name == route && s.attribute("request_id") == Some(&request_id))?;
                let send = spans
                    .iter()
                    .find(|s| s.name == "send" && s.parent == request.span_id)?;
                let batch = spans
                    .iter()
                    .find(|b| b.name == "send.batch" && b.links.contains(&send.span_id))?;
                Some((request.clone(), send.clone(), batch.clone()))
            },
        )
        .await;
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
}
