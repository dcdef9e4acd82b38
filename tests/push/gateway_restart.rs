//! The gateway binary killed with SIGKILL and started again: its users' presence lapses
//! with the lease, clients reconnect, catch up over REST (history, or one sync with the
//! cursor they kept), and no seq, edit or delete is missed.

use std::collections::BTreeSet;
use std::process::Child;
use std::time::Duration;

use chatpipe_tests::binaries::gateway_command;
use chatpipe_tests::push::{reconnect, wait_for_tombstone};
use chatpipe_tests::stream::{spawn_pipeline, Pipeline};

use crate::{is_message, PRESENCE_DEADLINE, PUSH_DEADLINE};

fn spawn_gateway(p: &Pipeline, addr: &str) -> Child {
    gateway_command(&p.gateway_settings("proc", 1), addr)
        .spawn()
        .expect("starting the gateway binary")
}

#[tokio::test]
async fn a_gateway_killed_and_restarted_loses_no_seq_for_its_clients() {
    let p = spawn_pipeline().await;
    let mut settings = p.fanout_settings();
    // Forget (and tombstone) an expired entry a second after its lease ran out.
    settings.fanout.presence_forget_ms = 1_000;
    let fanout = p.start_fanout(settings);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let url = format!("ws://{addr}/ws");
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let token = p.app.token(bob);
    let mut have = BTreeSet::new();

    let mut gateway = spawn_gateway(&p, &addr);
    let mut ws = reconnect(&url, &token).await;
    fanout.wait_online(&[bob], PRESENCE_DEADLINE).await;
    for i in 1..=3 {
        let seq = p
            .app
            .user(alice)
            .send_message(conversation, &format!("m{i}"))
            .await;
        ws.until(PUSH_DEADLINE, is_message(conversation, seq)).await;
        have.insert(seq);
    }

    // The client keeps a sync cursor, as a client that syncs on every reconnect does.
    let kept = p.app.user(bob).get("/v1/sync").await.expect(200)["nextCursor"]
        .as_str()
        .unwrap()
        .to_owned();

    gateway.kill().expect("SIGKILL the gateway");
    gateway.wait().unwrap();
    // Closed, with or without a close frame: the connection did not outlive its gateway.
    let _ = ws.until_closed(PUSH_DEADLINE).await;
    for i in 4..=6 {
        p.app
            .user(alice)
            .send_message(conversation, &format!("m{i}"))
            .await;
    }
    // Changes to messages bob already has, made while he cannot be told.
    let message = |seq: i64| format!("/v1/conversations/{conversation}/messages/{seq}");
    p.app
        .user(alice)
        .patch(&message(2), serde_json::json!({"body": "m2, edited"}))
        .await
        .expect(200);
    assert_eq!(p.app.user(alice).delete(&message(3)).await.status, 204);
    // Nobody said goodbye: bob stops counting when his lease (3 s) runs out, and fanout
    // tombstones the dead gateway's entry so the compacted topic forgets it.
    fanout.wait_offline(&[bob], Duration::from_secs(15)).await;
    let key = chatpipe_schemas::presence::key(
        chatpipe_schemas::UserId::of(bob),
        &p.gateway_settings("proc", 1).gateway.id,
    );
    wait_for_tombstone(&p.presence_topic(), &key, Duration::from_secs(15)).await;

    let mut gateway = spawn_gateway(&p, &addr);
    let mut ws = reconnect(&url, &token).await;
    // Catch up as docs/protocol.md says: the inbox, then afterSeq from the last seq held.
    let inbox = p.app.user(bob).get("/v1/inbox").await.expect(200);
    let last_seq = inbox["conversations"][0]["lastSeq"].as_i64().unwrap();
    assert_eq!(last_seq, 6, "{inbox}");
    // What each source gave, kept apart: a source that repeated or missed a seq shows.
    let pushed_before: Vec<i64> = have.iter().copied().collect();
    assert_eq!(pushed_before, vec![1, 2, 3]);
    let after = *have.last().unwrap();
    let page = p
        .app
        .user(bob)
        .get(&format!(
            "/v1/conversations/{conversation}/messages?afterSeq={after}"
        ))
        .await
        .expect(200);
    let caught_up: Vec<i64> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(
        caught_up,
        vec![4, 5, 6],
        "the page brings what was sent while the gateway was down"
    );
    // One sync with the kept cursor brings exactly what was missed, edits and deletes
    // of older messages included, and the next sync nothing.
    let missed = p
        .app
        .user(bob)
        .get(&format!("/v1/sync?since={kept}"))
        .await
        .expect(200);
    let entries = missed["conversations"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{missed}");
    let got: Vec<(i64, Option<&str>)> = entries[0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["seq"].as_i64().unwrap(), m["body"].as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (2, Some("m2, edited")),
            (3, None),
            (4, Some("m4")),
            (5, Some("m5")),
            (6, Some("m6"))
        ]
    );
    let next = missed["nextCursor"].as_str().unwrap();
    let again = p
        .app
        .user(bob)
        .get(&format!("/v1/sync?since={next}"))
        .await
        .expect(200);
    assert_eq!(again["conversations"], serde_json::json!([]), "once");
    fanout.wait_online(&[bob], PRESENCE_DEADLINE).await;
    let mut pushed_after = Vec::new();
    for i in 7..=9 {
        let seq = p
            .app
            .user(alice)
            .send_message(conversation, &format!("m{i}"))
            .await;
        let (_, earlier) = ws.until(PUSH_DEADLINE, is_message(conversation, seq)).await;
        pushed_after.extend(
            earlier
                .iter()
                .filter(|f| f["type"] == "message.new")
                .filter_map(|f| f["seq"].as_i64()),
        );
        pushed_after.push(seq);
    }
    assert_eq!(
        pushed_after,
        vec![7, 8, 9],
        "after the reconnect each new seq is pushed once, and nothing else"
    );
    let all: BTreeSet<i64> = pushed_before
        .iter()
        .chain(&caught_up)
        .chain(&pushed_after)
        .copied()
        .collect();
    assert_eq!(all, (1..=9).collect(), "a seq went missing");
    gateway.kill().unwrap();
    gateway.wait().unwrap();
    p.cleanup().await;
}
