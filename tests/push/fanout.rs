//! Fanout's own guarantees: events older than `fanout.max_age_ms` are not pushed, and
//! two instances sharing chat.events' partitions hand them over without losing or
//! repeating a push.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::stream::{spawn_pipeline, wait_for_partitions};
use serde_json::{json, Value};

use crate::{is_message, PRESENCE_DEADLINE, PUSH_DEADLINE};

#[tokio::test]
async fn an_event_older_than_max_age_is_not_pushed_and_a_fresh_one_is() {
    let p = spawn_pipeline().await;
    let max_age = Duration::from_secs(3);
    let mut settings = p.fanout_settings();
    settings.fanout.max_age_ms = max_age.as_millis() as u64;
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut ws = p.connect(&gw.url, bob).await;

    // Sent while no fanout runs; on chat.events it ages past max_age.
    let stale = p.app.user(alice).send_message(conversation, "stale").await;
    let records = p
        .consume_until(PUSH_DEADLINE, |rs| {
            rs.iter().any(|r| matches!(&r.event, ChatEvent::MessageNew(m) if m.seq.get() == stale && m.conversation_id.get() == conversation))
        })
        .await;
    let created = records
        .iter()
        .find_map(|r| match &r.event {
            ChatEvent::MessageNew(m) if m.conversation_id.get() == conversation => {
                Some(m.created_at)
            }
            _ => None,
        })
        .unwrap();
    let old_enough = created + chrono::Duration::from_std(max_age).unwrap();
    while chrono::Utc::now() <= old_enough {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Fanout starts with bob online (it joins only once presence is caught up), reads
    // the stale event first, then a fresh one.
    let fanout = p.start_fanout(settings);
    fanout.wait_online(&[bob], PRESENCE_DEADLINE).await;
    let fresh = p.app.user(alice).send_message(conversation, "fresh").await;
    let (frame, before) = ws
        .until(PUSH_DEADLINE, is_message(conversation, fresh))
        .await;
    assert_eq!(frame["body"], "fresh");
    assert!(
        before.iter().all(|f| f["seq"] != stale),
        "the stale message was pushed: {before:?}"
    );
    assert!(
        fanout.status.events() >= 2,
        "fanout read the stale event too"
    );
    let lists = p
        .deliveries_until(PUSH_DEADLINE, |ls| {
            ls.iter().any(|d| d.seq.map(|s| s.get()) == Some(fresh))
        })
        .await;
    assert!(
        lists.iter().all(|d| d.seq.map(|s| s.get()) != Some(stale)),
        "no fanout list for the stale message: {lists:?}"
    );
    gw.stop().await.unwrap();
    p.cleanup().await;
}

#[tokio::test]
async fn two_fanout_instances_rebalancing_push_every_message_once() {
    let p = spawn_pipeline().await;
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let bob = 2;
    // Twelve conversations spread over chat.events' six partitions.
    let mut conversations = Vec::new();
    for i in 0..12 {
        conversations.push(p.app.user(100 + i).create_group(&[bob]).await);
    }
    let mut ws = p.connect(&gw.url, bob).await.collect();
    let first = p.start_fanout(p.fanout_settings());
    first.wait_online(&[bob], PRESENCE_DEADLINE).await;

    // A round of one message per conversation every 100 ms, until the second instance
    // has joined, the first has left, and a few rounds more went through the second.
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = {
        let (base, http) = (p.app.base.clone(), p.app.http.clone());
        let tokens: Vec<String> = (0..12).map(|i| p.app.token(100 + i)).collect();
        let (conversations, sent, stop) = (conversations.clone(), sent.clone(), stop.clone());
        tokio::spawn(async move {
            let mut rounds = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for (conv, token) in conversations.iter().zip(&tokens) {
                    let res = http
                        .post(format!("{base}/v1/conversations/{conv}/messages"))
                        .bearer_auth(token)
                        .json(&json!({"clientMsgId": uuid::Uuid::new_v4(), "body": format!("m{rounds}")}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(res.status(), 201);
                }
                rounds += 1;
                sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            rounds
        })
    };
    let rounds_past = |at_least: usize| {
        let sent = sent.clone();
        async move {
            let until = Instant::now() + Duration::from_secs(60);
            while sent.load(std::sync::atomic::Ordering::SeqCst) < at_least {
                assert!(Instant::now() < until, "sends stopped");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    rounds_past(3).await;
    let second = p.start_fanout(p.fanout_settings());
    wait_for_partitions(
        &[&first.readiness, &second.readiness],
        "fanout-events",
        Duration::from_secs(60),
        |held| !held.is_empty(),
    )
    .await;
    let at_join = sent.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!(
        "round {at_join} when both held partitions: {:?} and {:?}",
        chatpipe_tests::stream::held_partitions(&first.readiness, "fanout-events"),
        chatpipe_tests::stream::held_partitions(&second.readiness, "fanout-events"),
    );
    rounds_past(at_join + 3).await;
    first.stop().expect("the first instance leaves cleanly");
    wait_for_partitions(
        &[&second.readiness],
        "fanout-events",
        Duration::from_secs(60),
        |held| held == [0, 1, 2, 3, 4, 5],
    )
    .await;
    let at_leave = sent.load(std::sync::atomic::Ordering::SeqCst);
    rounds_past(at_leave + 3).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let rounds = sender.await.unwrap();
    eprintln!("{rounds} rounds; the first instance left at round {at_leave}");

    // Bob's frames: every (conversation, seq) exactly once.
    let expected: BTreeSet<(i64, i64)> = conversations
        .iter()
        .flat_map(|&c| (1..=rounds as i64).map(move |s| (c, s)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: BTreeSet<(i64, i64)> = pushes(ws.drain()).into_keys().collect();
        if got.is_superset(&expected) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "missing pushes: {:?}",
            expected.difference(&got).take(10).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A repeat would come before a marker sent after everything else (bob's frames
    // come from one deliveries partition, in order).
    let marker_conv = conversations[0];
    let marker = p.app.user(100).send_message(marker_conv, "marker").await;
    ws.until(PUSH_DEADLINE, is_message(marker_conv, marker))
        .await;
    let mut pushed = pushes(ws.drain());
    pushed.remove(&(marker_conv, marker));
    let repeated: Vec<_> = pushed.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "pushed more than once: {repeated:?}");
    assert_eq!(pushed.into_keys().collect::<BTreeSet<_>>(), expected);
    second.stop().unwrap();
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// How often each (conversation, seq) was pushed as message.new.
fn pushes(frames: &[Value]) -> BTreeMap<(i64, i64), usize> {
    let mut counts = BTreeMap::new();
    for f in frames.iter().filter(|f| f["type"] == "message.new") {
        let key = (
            f["conversationId"].as_i64().unwrap(),
            f["seq"].as_i64().unwrap(),
        );
        *counts.entry(key).or_default() += 1;
    }
    counts
}
