//! Threads on the push path: a reply's `message.new` names its root, in the full frame
//! of a small group and in the light frame of a large one, so a client files it under
//! its thread without fetching it first; a thread read reaches the reader's other
//! devices, and nobody else.

use serde_json::json;

use crate::{is_message, PRESENCE_DEADLINE, PUSH_DEADLINE};
use chatpipe_tests::stream::spawn_pipeline;

#[tokio::test]
async fn a_replys_frame_names_its_root_full_and_light() {
    let p = spawn_pipeline().await;
    let mut settings = p.fanout_settings();
    settings.fanout.light_threshold = 3;
    let fanout = p.start_fanout(settings);
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob, carol, dave) = (10, 11, 12, 13);
    let small = p.app.user(alice).create_group(&[bob]).await;
    let large = p.app.user(alice).create_group(&[bob, carol, dave]).await;
    let mut bob_ws = p.connect(&gw.url, bob).await;
    fanout.wait_online(&[bob], PRESENCE_DEADLINE).await;

    for (conv, light) in [(small, false), (large, true)] {
        let root = p.app.user(alice).send_message(conv, "root").await;
        let reply = p
            .app
            .user(alice)
            .post(
                &format!("/v1/conversations/{conv}/messages"),
                json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "in the thread",
                       "threadRootSeq": root}),
            )
            .await
            .expect(201)["seq"]
            .as_i64()
            .unwrap();
        let (top, _) = bob_ws.until(PUSH_DEADLINE, is_message(conv, root)).await;
        assert!(top.get("threadRootSeq").is_none(), "{top}");
        let (frame, _) = bob_ws.until(PUSH_DEADLINE, is_message(conv, reply)).await;
        assert_eq!(frame["threadRootSeq"], root, "{frame}");
        assert_eq!(frame["light"] == true, light, "{frame}");
        if !light {
            assert_eq!(frame["body"], "in the thread", "{frame}");
        }
    }

    // Bob reads a thread on another device: this socket learns his place; Carol, a
    // member online beside him, gets nothing of it.
    let mut carol_ws = p.connect(&gw.url, carol).await;
    fanout.wait_online(&[carol], PRESENCE_DEADLINE).await;
    let root = p.app.user(alice).send_message(large, "another").await;
    let reply = p
        .app
        .user(carol)
        .post(
            &format!("/v1/conversations/{large}/messages"),
            json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "r", "threadRootSeq": root}),
        )
        .await
        .expect(201)["seq"]
        .as_i64()
        .unwrap();
    p.app
        .user(bob)
        .post(
            &format!("/v1/conversations/{large}/threads/{root}/read"),
            json!({"seq": reply}),
        )
        .await
        .expect(200);
    let thread_read = |f: &serde_json::Value| f["type"] == "thread.read";
    let (frame, _) = bob_ws.until(PUSH_DEADLINE, thread_read).await;
    assert_eq!(
        frame,
        json!({"type": "thread.read", "conversationId": large, "rootSeq": root,
               "lastReadSeq": reply, "following": false})
    );
    // A marker after it: Carol's socket has had everything about `large` by then.
    let marker = p.app.user(alice).send_message(large, "marker").await;
    let (_, before) = carol_ws
        .until(PUSH_DEADLINE, is_message(large, marker))
        .await;
    assert!(
        !before.iter().any(thread_read),
        "carol got bob's thread read: {before:?}"
    );
}
