//! The push path on the real stack: REST -> PostgreSQL -> Debezium -> chat.events ->
//! fanout (members + presence) -> chat.deliveries -> gateway -> a real WebSocket client.

mod bad_records;
mod browser;
mod fanout;
mod flood;
mod gateway_restart;
mod late_start;
mod limits;
mod membership;
mod mentions;
mod notifications;
mod reactions;
mod ready;
mod sdk;
mod slow_client;
mod threads;
mod tokens;
mod traces;
mod typing;

use std::time::Duration;

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::push::Seen;
use chatpipe_tests::stream::{
    end_offsets, messages, spawn_pipeline, spawn_pipeline_with, wait_until_consumed,
};
use serde_json::Value;

/// How long a push may take end to end before a test gives up (CDC included).
pub const PUSH_DEADLINE: Duration = Duration::from_secs(20);
/// How long presence may take to reach the fanout processor.
pub const PRESENCE_DEADLINE: Duration = Duration::from_secs(20);

fn is_message(conversation: i64, seq: i64) -> impl Fn(&Value) -> bool {
    move |f| f["type"] == "message.new" && f["conversationId"] == conversation && f["seq"] == seq
}

/// The frames `ws` got about `conversation` before a marker `sender` sends now into
/// `marker` (a conversation `ws`'s user is in). One deliveries partition is read in
/// order, so whatever was pushed to `ws` about `conversation` before arrives first: an
/// empty answer means nothing was.
async fn frames_before_a_marker(
    p: &chatpipe_tests::stream::Pipeline,
    ws: &mut chatpipe_tests::push::WsClient,
    sender: i64,
    marker: i64,
    conversation: i64,
) -> Vec<Value> {
    let seq = p.app.user(sender).send_message(marker, "marker").await;
    let (_, before) = ws.until(PUSH_DEADLINE, is_message(marker, seq)).await;
    before
        .into_iter()
        .filter(|f| f["conversationId"] == conversation)
        .collect()
}

#[tokio::test]
async fn a_message_reaches_the_other_member_and_a_read_reaches_the_senders_devices() {
    let p = spawn_pipeline().await;
    let _fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut alice_phone = p.connect(&gw.url, alice).await;
    let mut alice_laptop = p.connect(&gw.url, alice).await;
    let mut bob_ws = p.connect(&gw.url, bob).await;
    _fanout.wait_online(&[alice, bob], PRESENCE_DEADLINE).await;

    let client_msg_id = uuid::Uuid::new_v4();
    let seq = p
        .app
        .user(alice)
        .post(
            &format!("/v1/conversations/{conversation}/messages"),
            serde_json::json!({"clientMsgId": client_msg_id, "body": "hello bob"}),
        )
        .await
        .expect(201)["seq"]
        .as_i64()
        .unwrap();
    let (frame, _) = bob_ws
        .until(PUSH_DEADLINE, is_message(conversation, seq))
        .await;
    assert_eq!(frame["body"], "hello bob");
    assert_eq!(frame["senderId"], alice);
    // The sending device matches the push to the copy it shows as pending.
    assert_eq!(frame["clientMsgId"], client_msg_id.to_string());
    assert!(
        frame.get("light").is_none(),
        "a small group gets the body: {frame}"
    );
    // The sender's devices get it too (multi-device sync).
    alice_phone
        .until(PUSH_DEADLINE, is_message(conversation, seq))
        .await;
    alice_laptop
        .until(PUSH_DEADLINE, is_message(conversation, seq))
        .await;

    p.app.user(bob).mark_read(conversation, seq).await;
    for device in [&mut alice_phone, &mut alice_laptop] {
        expect_read(device, conversation, bob, seq).await;
    }
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// The default read path end to end: POST /read answers 202, the receipts processor
/// moves the watermark in a batched flush and writes read.updated, CDC carries it, and
/// fanout pushes it to the sender's devices.
#[tokio::test]
async fn a_read_through_the_receipts_processor_reaches_the_senders_devices() {
    let p = spawn_pipeline_with(ingest_api::configuration::ReadMode::Stream).await;
    let receipts = p.start_receipts(p.receipts_settings());
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut alice_phone = p.connect(&gw.url, alice).await;
    let mut alice_laptop = p.connect(&gw.url, alice).await;
    fanout.wait_online(&[alice], PRESENCE_DEADLINE).await;
    let mut seq = 0;
    for i in 0..3 {
        seq = p
            .app
            .user(alice)
            .send_message(conversation, &format!("m{i}"))
            .await;
    }

    let accepted = p
        .app
        .user(bob)
        .post(
            &format!("/v1/conversations/{conversation}/read"),
            serde_json::json!({"seq": seq}),
        )
        .await
        .expect(202);
    assert_eq!(accepted["acceptedSeq"], seq);
    for device in [&mut alice_phone, &mut alice_laptop] {
        expect_read(device, conversation, bob, seq).await;
    }
    assert_eq!(p.app.watermark(conversation, bob).await, Some(seq));
    assert!(receipts.is_running());
    gw.stop().await.unwrap();
    p.cleanup().await;
}

#[tokio::test]
async fn every_device_of_a_member_gets_the_push_and_a_non_member_gets_nothing() {
    let p = spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (member, other, outsider) = (10, 11, 99);
    let secret = p.app.user(other).create_group(&[member]).await;
    // The outsider shares another conversation with `other`: the marker below.
    let marker = p.app.user(other).create_group(&[outsider]).await;
    let mut phone = p.connect(&gw.url, member).await;
    let mut laptop = p.connect(&gw.url, member).await;
    let mut stranger = p.connect(&gw.url, outsider).await;
    fanout
        .wait_online(&[member, outsider], PRESENCE_DEADLINE)
        .await;

    let seq = p.app.user(other).send_message(secret, "for members").await;
    for device in [&mut phone, &mut laptop] {
        let (frame, _) = device.until(PUSH_DEADLINE, is_message(secret, seq)).await;
        assert_eq!(frame["body"], "for members");
    }
    // The gateway pushed `secret` before it read the marker's list (one partition, read
    // in order; the marker was sent after the members had the push), so whatever the
    // outsider was sent about `secret` would arrive before the marker.
    let seen = frames_before_a_marker(&p, &mut stranger, other, marker, secret).await;
    assert!(seen.is_empty(), "a non-member saw {seen:?}");
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// Edits and deletes are pushed as messages are: to every online member (the sender's
/// devices too), the edit with its new body, the delete with none; a non-member gets
/// neither.
#[tokio::test]
async fn edit_and_delete_pushes_reach_members_only() {
    let p = spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (member, author, outsider) = (10, 11, 99);
    let secret = p.app.user(author).create_group(&[member]).await;
    let marker = p.app.user(author).create_group(&[outsider]).await;
    let mut member_ws = p.connect(&gw.url, member).await;
    let mut author_ws = p.connect(&gw.url, author).await;
    let mut stranger = p.connect(&gw.url, outsider).await;
    fanout
        .wait_online(&[member, author, outsider], PRESENCE_DEADLINE)
        .await;

    let seq = p.app.user(author).send_message(secret, "draft").await;
    let path = format!("/v1/conversations/{secret}/messages/{seq}");
    p.app
        .user(author)
        .patch(&path, serde_json::json!({"body": "final words"}))
        .await
        .expect(200);
    assert_eq!(p.app.user(author).delete(&path).await.status, 204);
    let is = |kind: &'static str| {
        move |f: &Value| f["type"] == kind && f["conversationId"] == secret && f["seq"] == seq
    };
    for ws in [&mut member_ws, &mut author_ws] {
        let (edited, _) = ws.until(PUSH_DEADLINE, is("message.edited")).await;
        assert_eq!(edited["body"], "final words");
        assert_eq!(edited["senderId"], author);
        assert!(edited["editedAt"].is_string(), "{edited}");
        let (deleted, _) = ws.until(PUSH_DEADLINE, is("message.deleted")).await;
        assert!(deleted.get("body").is_none(), "{deleted}");
        assert_eq!(deleted["deletedBy"], author);
        assert!(deleted["deletedAt"].is_string(), "{deleted}");
    }
    // The outsider's marker comes after anything about `secret` would have (one
    // partition, read in order).
    let marker_seq = p.app.user(author).send_message(marker, "marker").await;
    let (_, before) = stranger
        .until(PUSH_DEADLINE, is_message(marker, marker_seq))
        .await;
    assert!(
        before.iter().all(|f| f["conversationId"] != secret),
        "a non-member saw {before:?}"
    );
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// Delivered ticks: a member's ack moves their delivery watermark, and the sender's
/// devices get delivery.updated (then read.updated when they read).
#[tokio::test]
async fn a_delivery_ack_reaches_the_senders_devices_as_delivery_updated() {
    let p = spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut alice_ws = p.connect(&gw.url, alice).await;
    fanout.wait_online(&[alice], PRESENCE_DEADLINE).await;
    let seq = p.app.user(alice).send_message(conversation, "tick?").await;
    p.app
        .user(bob)
        .post(
            &format!("/v1/conversations/{conversation}/delivered"),
            serde_json::json!({"seq": seq}),
        )
        .await
        .expect(200);
    let (frame, _) = alice_ws
        .until(PUSH_DEADLINE, |f| {
            f["type"] == "delivery.updated" && f["conversationId"] == conversation
        })
        .await;
    assert_eq!(frame["userId"], bob);
    assert_eq!(frame["lastDeliveredSeq"], seq);
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// The WebSocket ack: a member's device says what it got; the acks reader moves the
/// delivery watermark and the sender sees the tick. A stranger's ack moves nothing, and
/// frames that are not acks leave the connection open.
#[tokio::test]
async fn an_ack_over_the_websocket_moves_the_delivery_watermark_and_a_strangers_does_not() {
    let p = spawn_pipeline().await;
    let _receipts = p.start_receipts(p.receipts_settings());
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob, stranger) = (1, 2, 9);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut alice_ws = p.connect(&gw.url, alice).await;
    let mut bob_ws = p.connect(&gw.url, bob).await;
    let mut stranger_ws = p.connect(&gw.url, stranger).await;
    fanout.wait_online(&[alice, bob], PRESENCE_DEADLINE).await;
    let mut seq = 0;
    for i in 0..3 {
        seq = p
            .app
            .user(alice)
            .send_message(conversation, &format!("m{i}"))
            .await;
    }
    bob_ws
        .until(PUSH_DEADLINE, is_message(conversation, seq))
        .await;
    let ack = |seq: i64| format!(r#"{{"type":"ack","conversationId":{conversation},"seq":{seq}}}"#);
    stranger_ws.send_text(&ack(seq)).await;
    for junk in [
        "not json",
        r#"{"type":"ack","seq":1}"#,
        r#"{"type":"wave"}"#,
    ] {
        bob_ws.send_text(junk).await;
    }
    bob_ws.send_text(&ack(seq)).await;

    let (frame, _) = alice_ws
        .until(PUSH_DEADLINE, |f| f["type"] == "delivery.updated")
        .await;
    assert_eq!(
        (frame["userId"].clone(), frame["lastDeliveredSeq"].clone()),
        (bob.into(), seq.into())
    );
    let (read, delivered) = p.app.watermarks(conversation, bob).await;
    assert_eq!((read, delivered), (0, seq));
    // The stranger's ack reached the acks topic and the receipts processor went past it
    // (its group committed the topic's end)...
    let acks_group = format!("{}-acks", p.ns);
    wait_until_consumed(&acks_group, &p.acks_topic, PUSH_DEADLINE).await;
    assert!(
        end_offsets(&p.acks_topic).await >= 2,
        "the stranger's ack and Bob's are both on {}",
        p.acks_topic
    );
    // Bob's connection is still open: the next message reaches it.
    let next = p
        .app
        .user(alice)
        .send_message(conversation, "still there?")
        .await;
    bob_ws
        .until(PUSH_DEADLINE, is_message(conversation, next))
        .await;
    // ...and chat.events, up to the message sent after it was applied (one partition per
    // conversation, in commit order), moved no delivery watermark but Bob's.
    let records = p
        .consume_until(PUSH_DEADLINE, |records| {
            messages(records).contains(&(conversation, next))
        })
        .await;
    let moved: Vec<i64> = records
        .iter()
        .filter_map(|r| match &r.event {
            ChatEvent::DeliveryUpdated(d) => Some(d.user_id.get()),
            _ => None,
        })
        .collect();
    assert_eq!(moved, vec![bob], "delivery.updated events on chat.events");
    gw.stop().await.unwrap();
    p.cleanup().await;
}

#[tokio::test]
async fn a_1000_member_group_pushes_light_to_its_50_online_members_and_the_rest_catch_up() {
    let p = spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let sender = 1;
    let members: Vec<i64> = (2..=1000).collect();
    let group = p.app.user(sender).create_group(&members).await;
    let online: Vec<i64> = (2..=51).collect();
    let mut clients = Vec::new();
    for user in &online {
        clients.push((*user, p.connect(&gw.url, *user).await));
    }
    fanout.wait_online(&online, PRESENCE_DEADLINE).await;

    let seq = p.app.user(sender).send_message(group, "big news").await;
    // What fanout decided: light lists whose recipients are exactly those 50, once each.
    let is_news = |d: &chatpipe_schemas::delivery::Delivery| {
        d.event_type == "message.new"
            && d.conversation_id.get() == group
            && d.seq.map(|s| s.get()) == Some(seq)
    };
    let lists = p
        .deliveries_until(PUSH_DEADLINE, |ls| {
            ls.iter()
                .filter(|d| is_news(d))
                .map(|d| d.user_ids.len())
                .sum::<usize>()
                >= online.len()
        })
        .await;
    let mut recipients: Vec<i64> = lists
        .iter()
        .filter(|d| is_news(d))
        .inspect(|d| assert!(d.light && d.body.is_none(), "{d:?}"))
        .flat_map(|d| d.user_ids.iter().map(|u| u.get()))
        .collect();
    recipients.sort_unstable();
    assert_eq!(
        recipients, online,
        "the online members, each once, and no one else"
    );
    for (user, ws) in &mut clients {
        let (frame, _) = ws.until(PUSH_DEADLINE, is_message(group, seq)).await;
        assert_eq!(frame["light"], true, "user {user}: {frame}");
        assert!(
            frame.get("body").is_none() && frame.get("senderId").is_none(),
            "a light push carries only conversationId and seq: {frame}"
        );
    }
    // A read in a large group: the reader's devices get it in full, the other online
    // members one light, coalesced frame.
    let (reader, other) = (clients[0].0, clients[1].0);
    p.app.user(reader).mark_read(group, seq).await;
    let (full, _) = clients[0]
        .1
        .until(PUSH_DEADLINE, |f| f["type"] == "read.updated")
        .await;
    assert_eq!(
        (full["userId"].as_i64(), full["lastReadSeq"].as_i64()),
        (Some(reader), Some(seq))
    );
    assert!(full.get("light").is_none(), "{full}");
    let (light, _) = clients[1]
        .1
        .until(PUSH_DEADLINE, |f| f["type"] == "read.updated")
        .await;
    assert_eq!(light["light"], true, "user {other}: {light}");
    assert_eq!(light["lastReadSeq"], seq);
    assert!(light.get("userId").is_none(), "{light}");

    // An offline member catches up: the inbox shows the news, afterSeq brings the body.
    let offline = 500;
    let inbox = p.app.user(offline).get("/v1/inbox").await.expect(200);
    let entry = inbox["conversations"]
        .as_array()
        .expect("conversations")
        .iter()
        .find(|c| c["conversationId"] == group)
        .cloned()
        .unwrap_or_else(|| panic!("the group is in the inbox: {inbox}"));
    assert_eq!(entry["unreadCount"], 1, "{entry}");
    let page = p
        .app
        .user(offline)
        .get(&format!("/v1/conversations/{group}/messages?afterSeq=0"))
        .await
        .expect(200);
    assert_eq!(page["messages"][0]["body"], "big news", "{page}");
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// Waits for `device`'s next read.updated frame and checks it says `reader` read
/// `conversation` up to `seq`.
async fn expect_read(
    device: &mut chatpipe_tests::push::WsClient,
    conversation: i64,
    reader: i64,
    seq: i64,
) {
    let (read, _) = device
        .until(PUSH_DEADLINE, |f| f["type"] == "read.updated")
        .await;
    assert_eq!(read["conversationId"], conversation);
    assert_eq!(read["userId"], reader);
    assert_eq!(read["lastReadSeq"], seq);
}

/// Every frame a client sees until its connection closes (`None` if still open at the
/// deadline).
pub async fn frames_until_closed(
    ws: &mut chatpipe_tests::push::WsClient,
    deadline: Duration,
) -> (Vec<Value>, Option<Seen>) {
    let until = std::time::Instant::now() + deadline;
    let mut frames = Vec::new();
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        match ws.next(left).await {
            Some(Seen::Frame(f)) => frames.push(f),
            other => return (frames, other),
        }
    }
}
