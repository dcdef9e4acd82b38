//! Records the push path cannot decode go to a dead-letter topic with the reason, and
//! pushes keep flowing; a gateway that stops says goodbye.

use std::time::Duration;

use chatpipe_tests::stream::{dlq_records, produce_raw, produce_raw_to, spawn_pipeline};

use crate::{is_message, PRESENCE_DEADLINE, PUSH_DEADLINE};

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn an_undecodable_event_goes_to_the_dlq_and_fanout_keeps_pushing() {
    let p = spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut ws = p.connect(&gw.url, bob).await;
    fanout.wait_online(&[bob], PRESENCE_DEADLINE).await;

    // On the conversation's partition, ahead of its next message.
    let key = conversation.to_string();
    produce_raw(&p.topic, &key, b"not avro at all").await;
    let seq = p
        .app
        .user(alice)
        .send_message(conversation, "after the bad one")
        .await;
    ws.until(PUSH_DEADLINE, is_message(conversation, seq)).await;

    let dlq = dlq_records(&format!("{}.dlq", p.topic), 1).await;
    let (k, value, headers) = &dlq[0];
    assert_eq!(
        (k.as_str(), value.as_slice()),
        (key.as_str(), &b"not avro at all"[..])
    );
    assert!(
        header(headers, "error").is_some_and(|e| !e.is_empty()),
        "{headers:?}"
    );
    assert_eq!(header(headers, "source.topic"), Some(p.topic.as_str()));
    assert!(fanout.is_running());
    gw.stop().await.unwrap();
    p.cleanup().await;
}

#[tokio::test]
async fn an_undecodable_fanout_list_goes_to_the_dlq_and_the_gateway_keeps_pushing() {
    let p = spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut ws = p.connect(&gw.url, bob).await;
    fanout.wait_online(&[bob], PRESENCE_DEADLINE).await;
    // One push first: the gateway is reading its partition.
    let first = p.app.user(alice).send_message(conversation, "one").await;
    ws.until(PUSH_DEADLINE, is_message(conversation, first))
        .await;

    produce_raw_to(
        &p.deliveries_topic(),
        0,
        &conversation.to_string(),
        &[0, 0, 0],
    )
    .await;
    let second = p.app.user(alice).send_message(conversation, "two").await;
    let (_, before) = ws
        .until(PUSH_DEADLINE, is_message(conversation, second))
        .await;
    assert!(
        before.is_empty(),
        "nothing else reached the client: {before:?}"
    );

    let dlq = dlq_records(&format!("{}.dlq", p.deliveries_topic()), 1).await;
    let (_, value, headers) = &dlq[0];
    assert_eq!(value, &[0, 0, 0]);
    assert!(
        header(headers, "error").is_some_and(|e| e.contains("header")),
        "{headers:?}"
    );
    assert_eq!(header(headers, "source.partition"), Some("0"));
    gw.stop().await.unwrap();
    p.cleanup().await;
}

#[tokio::test]
async fn a_stopping_gateway_closes_with_1001_and_takes_its_users_offline_at_once() {
    let p = spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let mut settings = p.gateway_settings("gw", 0);
    // A lease far longer than the deadline below: only the tombstone can be in time.
    settings.presence.lease_ms = 600_000;
    let gw = p.start_gateway(settings).await;
    let bob = 2;
    let mut ws = p.connect(&gw.url, bob).await;
    fanout.wait_online(&[bob], PRESENCE_DEADLINE).await;

    gw.stop().await.unwrap();
    match ws.until_closed(Duration::from_secs(10)).await {
        Some(close) => {
            assert_eq!(u16::from(close.code), 1001);
            assert_eq!(close.reason.as_str(), "gateway shutting down");
        }
        None => panic!("expected a 1001 close, got none"),
    }
    fanout.wait_offline(&[bob], Duration::from_secs(10)).await;
    p.cleanup().await;
}
