//! One trace from the REST call to the socket (`telemetry.otlp_endpoint`): ingest-api,
//! `pipeline fanout` and the gateway run as their binaries, each exporting its spans
//! under its own `service.name` to a receiver in the test. The send's trace context
//! goes into `outbox.traceparent`, the test's own Debezium connector (the repo's
//! connector file) carries it into a `traceparent` header on chat.events, fanout
//! continues it and hands it on in the list's header, and the gateway's `push` closes it.

use std::time::Duration;

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::binaries::{
    fanout_command, free_port, gateway_command, spawn_ingest_api, KillOnDrop,
};
use chatpipe_tests::otlp::Receiver;
use chatpipe_tests::push::reconnect;
use chatpipe_tests::stream::{spawn_pipeline, Record};

use crate::{is_message, PUSH_DEADLINE};

fn is_new(r: &Record, conversation: i64, seq: i64) -> bool {
    matches!(&r.event, ChatEvent::MessageNew(m) if m.seq.get() == seq && m.conversation_id.get() == conversation)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn a_send_is_one_trace_from_its_request_through_cdc_and_fanout_to_its_push() {
    let receiver = Receiver::start().await;
    let otlp = [
        (
            "CHATPIPE_TELEMETRY__OTLP_ENDPOINT",
            receiver.endpoint.as_str(),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let p = spawn_pipeline().await;
    let api = spawn_ingest_api(&p.database_url, &p.events_subject, &otlp).await;
    // Spans follow RUST_LOG: the ones this test follows, and warnings.
    let _fanout = fanout_command(&p)
        .envs(otlp)
        .env("RUST_LOG", "warn,pipeline::fanout::events=info")
        .spawn()
        .expect("pipeline fanout starts");
    let addr = format!("127.0.0.1:{}", free_port());
    let _gateway = KillOnDrop(
        gateway_command(&p.gateway_settings("traced", 0), &addr)
            .envs(otlp)
            .env("RUST_LOG", "warn,gateway::deliveries=info")
            .spawn()
            .expect("the gateway starts"),
    );

    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut ws = reconnect(&format!("ws://{addr}/ws"), &p.app.token(bob)).await;
    // Pushes are live once the gateway says so: the message below is pushed.
    ws.until(PUSH_DEADLINE, |f| f["type"] == "ready").await;

    let request_id = format!("trace-{}", uuid::Uuid::new_v4());
    let answer = reqwest::Client::new()
        .post(format!(
            "{}/v1/conversations/{conversation}/messages",
            api.base
        ))
        .bearer_auth(p.app.token(alice))
        .header("x-request-id", &request_id)
        .json(&serde_json::json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "traced"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);
    let seq = answer.json::<serde_json::Value>().await.unwrap()["seq"]
        .as_i64()
        .unwrap();
    ws.until(PUSH_DEADLINE, is_message(conversation, seq)).await;

    // What crossed the CDC leg: the record Debezium wrote carries a trace context.
    let records = p
        .consume_until(PUSH_DEADLINE, |records| {
            records.iter().any(|r| is_new(r, conversation, seq))
        })
        .await;
    let record = records
        .iter()
        .find(|r| is_new(r, conversation, seq))
        .unwrap();
    let traceparent = record
        .headers
        .get("traceparent")
        .unwrap_or_else(|| panic!("no traceparent header on chat.events: {:?}", record.headers))
        .clone();
    // Events no traced request wrote carry it null (the group's creation came from the
    // test's own app, which exports no spans).
    let created = records
        .iter()
        .find(|r| matches!(r.event, ChatEvent::ConversationCreated(_)))
        .expect("the group's creation is on the topic");
    assert_eq!(
        created.headers.get("traceparent").map(String::as_str),
        Some("")
    );

    let route = "POST /v1/conversations/{id}/messages";
    let (request, send, fanout, push) = receiver
        .until(
            Duration::from_secs(30),
            "request -> send -> fanout -> push, each the child of the one before",
            |spans| {
                let request = spans
                    .iter()
                    .find(|s| s.name == route && s.attribute("request_id") == Some(&request_id))?;
                let child = |service: &str, name: &str, of: &[u8]| {
                    spans
                        .iter()
                        .find(|s| s.service == service && s.name == name && s.parent == of)
                        .cloned()
                };
                let send = child("ingest-api", "send", &request.span_id)?;
                let fanout = child("fanout", "fanout", &send.span_id)?;
                let push = child("gateway", "push", &fanout.span_id)?;
                Some((request.clone(), send, fanout, push))
            },
        )
        .await;
    assert_eq!(request.service, "ingest-api");
    assert!(request.parent.is_empty(), "the request starts the trace");
    for span in [&send, &fanout, &push] {
        assert_eq!(
            span.trace_id, request.trace_id,
            "{} in the request's trace",
            span.name
        );
    }
    assert_eq!(fanout.attribute("event_type"), Some("message.new"));
    assert_eq!(
        push.attribute("conversation_id"),
        Some(conversation.to_string().as_str())
    );

    assert_eq!(
        traceparent,
        format!("00-{}-{}-01", hex(&send.trace_id), hex(&send.span_id)),
        "chat.events carries the send span's context"
    );
    p.cleanup().await;
}
