//! `ready` (docs/protocol.md): a connection is told once its pushes are live, so a
//! client catches up once. What holds it to account: the fanout members' own presence
//! tables, and messages committed right after the frame, which must be pushed with no
//! other wait (no `wait_online` in these tests).

use std::collections::BTreeSet;
use std::time::Duration;

use chatpipe_tests::push::WsClient;
use chatpipe_tests::stream::{end_offsets, spawn_pipeline, Pipeline};
use serde_json::Value;

use super::{is_message, PRESENCE_DEADLINE, PUSH_DEADLINE};

fn is_ready(f: &Value) -> bool {
    f["type"] == "ready"
}

/// Waits for `ws`'s `ready`; checks its shape.
async fn ready(ws: &mut WsClient) {
    let (frame, before) = ws.until(PRESENCE_DEADLINE, is_ready).await;
    let at = frame["pushesFrom"].as_str().expect("pushesFrom");
    chrono::DateTime::parse_from_rfc3339(at).expect("an RFC 3339 time");
    assert!(
        before.iter().all(|f| f["type"] != "ready"),
        "one ready: {before:?}"
    );
}

/// Sends into each conversation and checks `ws` gets every message (pushes of
/// different conversations come in any order).
async fn pushed_at_once(p: &Pipeline, ws: &mut WsClient, sender: i64, conversations: &[i64]) {
    let mut missing = BTreeSet::new();
    for &c in conversations {
        missing.insert((c, p.app.user(sender).send_message(c, "after ready").await));
    }
    let deadline = tokio::time::Instant::now() + PUSH_DEADLINE;
    while !missing.is_empty() {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let (frame, _) = ws
            .until(left, |f| {
                missing.iter().any(|(c, seq)| is_message(*c, *seq)(f))
            })
            .await;
        missing.remove(&(
            frame["conversationId"].as_i64().unwrap(),
            frame["seq"].as_i64().unwrap(),
        ));
    }
}

#[tokio::test]
async fn a_connection_is_told_ready_and_what_is_committed_right_after_is_pushed() {
    let p = spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let alice = 1;
    let users: Vec<i64> = (2..=6).collect();
    let conversation = p.app.user(alice).create_group(&users).await;
    for &user in &users {
        let mut ws = p.connect(&gw.url, user).await;
        ready(&mut ws).await;
        assert_eq!(
            fanout
                .status
                .online_among(&[chatpipe_schemas::UserId::of(user)]),
            1,
            "user {user} was told ready before fanout's presence table held them"
        );
        pushed_at_once(&p, &mut ws, alice, &[conversation]).await;
    }
    gw.stop().await.unwrap();
    p.cleanup().await;
}

#[tokio::test]
async fn no_ready_comes_while_no_fanout_member_has_read_the_presence_and_one_comes_after() {
    let p = spawn_pipeline().await;
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut ws = p.connect(&gw.url, bob).await;
    // The gateway has written bob's presence (the topic's offsets say so) ...
    let deadline = tokio::time::Instant::now() + PRESENCE_DEADLINE;
    while end_offsets(&p.presence_topic()).await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no presence record");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ... but no fanout member has read it: no ready, over a renewal or two.
    match ws.next(Duration::from_secs(2)).await {
        None => {}
        other => panic!("a frame with no fanout running: {other:?}"),
    }
    let _fanout = p.start_fanout(p.fanout_settings());
    ready(&mut ws).await;
    pushed_at_once(&p, &mut ws, alice, &[conversation]).await;
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// Two fanout members share chat.events: a connection is ready only once the members
/// that read its presence fan out every partition, and one that took partitions over
/// read the presence first.
#[tokio::test]
async fn with_two_fanout_members_a_ready_connection_gets_every_conversation_at_once() {
    let p = spawn_pipeline().await;
    let first = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let alice = 1;
    // Enough conversations to land on every partition of chat.events.
    let mut conversations = Vec::new();
    for i in 0..12 {
        conversations.push(p.app.user(alice).create_group(&[2, 3, 100 + i]).await);
    }
    let mut bob = p.connect(&gw.url, 2).await;
    ready(&mut bob).await;
    // A second member joins: the group rebalances, partitions move to it.
    let second = p.start_fanout(p.fanout_settings());
    let deadline = tokio::time::Instant::now() + PRESENCE_DEADLINE;
    while second
        .status
        .online_among(&[chatpipe_schemas::UserId::of(2)])
        == 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second member never read the presence"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut carol = p.connect(&gw.url, 3).await;
    ready(&mut carol).await;
    pushed_at_once(&p, &mut carol, alice, &conversations).await;
    pushed_at_once(&p, &mut bob, alice, &conversations).await;
    assert!(first.is_running() && second.is_running());
    gw.stop().await.unwrap();
    p.cleanup().await;
}
