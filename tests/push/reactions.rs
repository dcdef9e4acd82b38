//! Reactions on the real stack: each change reaches chat.events through Debezium in
//! commit order, with the count after it, and every online member's sockets as a
//! reaction frame; a non-member's socket gets nothing of it.

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::stream::spawn_pipeline;
use serde_json::{json, Value};

use crate::{is_message, PRESENCE_DEADLINE, PUSH_DEADLINE};

#[tokio::test]
async fn reactions_reach_chat_events_in_order_and_members_sockets_only() {
    let p = spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob, outsider) = (10, 11, 99);
    let group = p.app.user(alice).create_group(&[bob]).await;
    let marker = p.app.user(alice).create_group(&[outsider]).await;
    let mut alice_ws = p.connect(&gw.url, alice).await;
    let mut bob_ws = p.connect(&gw.url, bob).await;
    let mut outsider_ws = p.connect(&gw.url, outsider).await;
    fanout
        .wait_online(&[alice, bob, outsider], PRESENCE_DEADLINE)
        .await;

    let seq = p.app.user(alice).send_message(group, "ship it?").await;
    let path = |key: &str| {
        let key: String = url::form_urlencoded::byte_serialize(key.as_bytes()).collect();
        format!("/v1/conversations/{group}/messages/{seq}/reactions/{key}")
    };
    p.app.user(bob).put(&path("🚀")).await.expect(200);
    p.app.user(alice).put(&path("🚀")).await.expect(200);
    p.app.user(bob).delete(&path("🚀")).await.expect(200);

    // What each member's socket got, in order: two adds and a removal, with counts.
    let reaction = |f: &Value| {
        (f["type"] == "reaction.added" || f["type"] == "reaction.removed")
            && f["conversationId"] == group
    };
    for ws in [&mut alice_ws, &mut bob_ws] {
        let mut got = Vec::new();
        while got.len() < 3 {
            let (frame, _) = ws.until(PUSH_DEADLINE, reaction).await;
            assert_eq!(frame["seq"], seq, "{frame}");
            assert_eq!(frame["key"], "🚀", "{frame}");
            got.push((
                frame["type"].as_str().unwrap().to_owned(),
                frame["userId"].as_i64().unwrap(),
                frame["count"].as_i64().unwrap(),
            ));
        }
        assert_eq!(
            got,
            vec![
                ("reaction.added".to_owned(), bob, 1),
                ("reaction.added".to_owned(), alice, 2),
                ("reaction.removed".to_owned(), bob, 1),
            ]
        );
    }
    // The outsider's marker comes after anything about `group` would have.
    let marker_seq = p.app.user(alice).send_message(marker, "marker").await;
    let (_, before) = outsider_ws
        .until(PUSH_DEADLINE, is_message(marker, marker_seq))
        .await;
    assert!(
        before.iter().all(|f| f["conversationId"] != group),
        "a non-member saw {before:?}"
    );

    // chat.events, as Debezium wrote it: the same three, in commit order.
    let of_group = |records: &[chatpipe_tests::stream::Record]| -> Vec<(&'static str, i64, i64)> {
        records
            .iter()
            .filter_map(|r| match &r.event {
                ChatEvent::ReactionAdded(e) if e.conversation_id.get() == group => {
                    Some(("added", e.user_id.get(), e.count))
                }
                ChatEvent::ReactionRemoved(e) if e.conversation_id.get() == group => {
                    Some(("removed", e.user_id.get(), e.count))
                }
                _ => None,
            })
            .collect()
    };
    let records = p
        .consume_until(PUSH_DEADLINE, |records| of_group(records).len() >= 3)
        .await;
    assert_eq!(
        of_group(&records),
        vec![("added", bob, 1), ("added", alice, 2), ("removed", bob, 1)]
    );
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// Above the fanout threshold: members get one light push per message and key between
/// two fanout ticks, with the count after the last change and no `userId`; the
/// reactor's own device gets each of their changes in full at once.
#[tokio::test]
async fn a_large_groups_reactions_coalesce_per_message_and_key_and_the_reactor_hears_in_full() {
    let p = spawn_pipeline().await;
    let mut settings = p.fanout_settings();
    settings.fanout.light_threshold = 3;
    let fanout = p.start_fanout(settings);
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob, carol, dave) = (10, 11, 12, 13);
    let group = p.app.user(alice).create_group(&[bob, carol, dave]).await;
    let mut bob_ws = p.connect(&gw.url, bob).await;
    let mut carol_ws = p.connect(&gw.url, carol).await;
    fanout.wait_online(&[bob, carol], PRESENCE_DEADLINE).await;

    let seq = p.app.user(alice).send_message(group, "vote").await;
    let path = |key: &str| {
        let key: String = url::form_urlencoded::byte_serialize(key.as_bytes()).collect();
        format!("/v1/conversations/{group}/messages/{seq}/reactions/{key}")
    };
    // Four changes of one key within a moment: add, take back, add again; then dave's.
    p.app.user(bob).put(&path("👍")).await.expect(200);
    p.app.user(bob).delete(&path("👍")).await.expect(200);
    p.app.user(bob).put(&path("👍")).await.expect(200);
    p.app.user(dave).put(&path("👍")).await.expect(200);
    // The marker: a message after them, in the same conversation (one partition, read
    // in order): every push about the reactions comes before its own.
    let marker = p.app.user(alice).send_message(group, "marker").await;

    let reaction = |f: &Value| {
        f["type"]
            .as_str()
            .is_some_and(|t| t.starts_with("reaction."))
    };
    // Bob's device: his three changes in full, in order, and never dave's.
    let mut bob_frames = Vec::new();
    while bob_frames.len() < 3 {
        let (frame, _) = bob_ws.until(PUSH_DEADLINE, reaction).await;
        if frame.get("light").is_none() {
            bob_frames.push((
                frame["type"].clone(),
                frame["userId"].clone(),
                frame["count"].clone(),
            ));
        }
    }
    assert_eq!(
        bob_frames,
        vec![
            (json!("reaction.added"), json!(bob), json!(1)),
            (json!("reaction.removed"), json!(bob), json!(0)),
            (json!("reaction.added"), json!(bob), json!(1)),
        ]
    );
    // Carol's: light pushes only, the last of them with the key's count now (2), and
    // fewer than the four changes once the window folded them.
    let mut light = Vec::new();
    loop {
        let (frame, _) = carol_ws
            .until(PUSH_DEADLINE, |f| reaction(f) || f["type"] == "message.new")
            .await;
        if frame["type"] == "message.new" && frame["seq"] == marker {
            break;
        }
        if reaction(&frame) {
            assert_eq!(frame["light"], true, "{frame}");
            assert!(frame.get("userId").is_none(), "{frame}");
            light.push(frame["count"].as_i64().unwrap());
        }
    }
    // The coalesced push may go after the marker's (it waits for the next tick).
    while light.last() != Some(&2) {
        let (frame, _) = carol_ws.until(PUSH_DEADLINE, reaction).await;
        assert_eq!(frame["light"], true, "{frame}");
        light.push(frame["count"].as_i64().unwrap());
    }
    assert!(light.len() < 4, "coalesced: {light:?}");
    gw.stop().await.unwrap();
    p.cleanup().await;
}
