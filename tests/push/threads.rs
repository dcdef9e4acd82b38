//! Threads on the push path: a reply's `message.new` names its root, in the full frame
//! of a small group and in the light frame of a large one, so a client files it under
//! its thread without fetching it first.

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
                &format!("/conversations/{conv}/messages"),
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
}
