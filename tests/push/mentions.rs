//! Mentions on the push path: a full `message.new` names its mentioned members; in a
//! group above the fanout threshold, where the push is light, each named member who is
//! online gets a `mention` frame at once and nobody else does; an edit's frame says who
//! is named after it.

use serde_json::{json, Value};

use crate::{is_message, PRESENCE_DEADLINE, PUSH_DEADLINE};
use chatpipe_tests::stream::spawn_pipeline;

#[tokio::test]
async fn frames_name_the_mentioned_and_a_light_message_sends_them_a_mention() {
    let p = spawn_pipeline().await;
    let mut settings = p.fanout_settings();
    settings.fanout.light_threshold = 3;
    let fanout = p.start_fanout(settings);
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob, carol, dave) = (10, 11, 12, 13);
    let small = p.app.user(alice).create_group(&[bob]).await;
    let large = p.app.user(alice).create_group(&[bob, carol, dave]).await;
    let mut bob_ws = p.connect(&gw.url, bob).await;
    let mut carol_ws = p.connect(&gw.url, carol).await;
    fanout.wait_online(&[bob, carol], PRESENCE_DEADLINE).await;

    let send = |conv: i64, mentions: Value| {
        let app = &p.app;
        async move {
            app.user(alice)
                .post(
                    &format!("/v1/conversations/{conv}/messages"),
                    json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "@bob look", "mentions": mentions}),
                )
                .await
                .expect(201)["seq"]
                .as_i64()
                .unwrap()
        }
    };
    // A small group: the full frame names bob.
    let seq = send(small, json!([bob])).await;
    let (frame, _) = bob_ws.until(PUSH_DEADLINE, is_message(small, seq)).await;
    assert_eq!(frame["mentions"], json!([bob]), "{frame}");
    // An edit that names nobody any more says so.
    p.app
        .user(alice)
        .patch(
            &format!("/v1/conversations/{small}/messages/{seq}"),
            json!({"body": "look", "mentions": []}),
        )
        .await
        .expect(200);
    let (edited, _) = bob_ws
        .until(PUSH_DEADLINE, |f| {
            f["type"] == "message.edited" && f["seq"] == seq
        })
        .await;
    assert_eq!(edited["mentions"], json!([]), "{edited}");

    // A large group: light for all, and bob (named) also gets a mention frame.
    let seq = send(large, json!([bob])).await;
    let mention = |f: &Value| f["type"] == "mention" && f["conversationId"] == large;
    let (frame, _) = bob_ws.until(PUSH_DEADLINE, mention).await;
    assert_eq!(
        (frame["seq"].as_i64(), frame["senderId"].as_i64()),
        (Some(seq), Some(alice))
    );
    let (light, _) = bob_ws.until(PUSH_DEADLINE, is_message(large, seq)).await;
    assert_eq!(light["light"], true, "{light}");
    assert!(light.get("mentions").is_none(), "{light}");
    // Carol, not named, gets the light push and no mention: a marker to her comes after
    // anything about `large` would have.
    let (_, before) = carol_ws.until(PUSH_DEADLINE, is_message(large, seq)).await;
    let marker = send(large, json!([carol])).await;
    let (_, between) = carol_ws.until(PUSH_DEADLINE, mention).await;
    assert!(
        before
            .iter()
            .chain(&between)
            .all(|f| f["type"] != "mention" || f["seq"] == marker),
        "carol got a mention that was not hers: {before:?} {between:?}"
    );
    gw.stop().await.unwrap();
    p.cleanup().await;
}
