//! Typing indicators end to end: a client's `typing` frame -> gateway -> chat.ephemeral
//! -> fanout (membership, throttle) -> chat.deliveries -> the other members' sockets.
//! Never PostgreSQL's tables, never chat.events.

use std::time::{Duration, Instant};

use chatpipe_tests::bench::end_offsets;
use chatpipe_tests::stream::{brokers, Pipeline};
use chatpipe_tests::{metric_sum, TestApp};
use serde_json::Value;

use crate::{is_message, PRESENCE_DEADLINE, PUSH_DEADLINE};

fn typing(conversation: i64) -> String {
    format!(r#"{{"type":"typing","conversationId":{conversation}}}"#)
}

fn is_typing(conversation: i64, user: i64) -> impl Fn(&Value) -> bool {
    move |f| f["type"] == "typing" && f["conversationId"] == conversation && f["userId"] == user
}

/// Rows and the newest writer of every table a chat change writes: any insert or
/// update gives a row a newer xmin, any delete lowers a count.
async fn tables(app: &TestApp) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for table in [
        "conversation",
        "conversation_member",
        "message",
        "conversation_departure",
        "outbox",
    ] {
        out.push(
            sqlx::query_as(&format!(
                "SELECT count(*), coalesce(max(xmin::text::bigint), 0) FROM {table}"
            ))
            .fetch_one(&app.pool)
            .await
            .unwrap(),
        );
    }
    out
}

/// Waits until this process's fanout has dropped `n` more typing signals for `reason`.
async fn until_dropped(app: &TestApp, reason: &str, before: f64, n: f64) {
    let deadline = Instant::now() + PUSH_DEADLINE;
    let label = format!("reason=\"{reason}\"");
    loop {
        let now = metric_sum(
            &app.metrics().await,
            "fanout_typing_dropped_total",
            &[&label],
        )
        .unwrap_or(0.0);
        if now >= before + n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "fanout dropped {now} for {reason}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn dropped(app: &TestApp, reason: &str) -> f64 {
    metric_sum(
        &app.metrics().await,
        "fanout_typing_dropped_total",
        &[&format!("reason=\"{reason}\"")],
    )
    .unwrap_or(0.0)
}

fn events_end(p: &Pipeline) -> Vec<i64> {
    end_offsets(&brokers(), &p.topic).expect("chat.events offsets")
}

#[tokio::test]
async fn typing_reaches_the_other_online_members_and_nothing_is_stored() {
    let p = chatpipe_tests::stream::spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob, stranger) = (1, 2, 9);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut alice_ws = p.connect(&gw.url, alice).await;
    let mut bob_ws = p.connect(&gw.url, bob).await;
    let mut stranger_ws = p.connect(&gw.url, stranger).await;
    fanout
        .wait_online(&[alice, bob, stranger], PRESENCE_DEADLINE)
        .await;
    // Everything written so far has streamed: chat.events stands still from here.
    let seq = p.app.user(alice).send_message(conversation, "hi").await;
    bob_ws
        .until(PUSH_DEADLINE, is_message(conversation, seq))
        .await;
    alice_ws
        .until(PUSH_DEADLINE, is_message(conversation, seq))
        .await;
    let (stored, streamed) = (tables(&p.app).await, events_end(&p));
    let ephemeral = end_offsets(&brokers(), &p.ephemeral_topic).unwrap();

    // A stranger's typing in the conversation: fanout drops it.
    let non_members = dropped(&p.app, "non_member").await;
    stranger_ws.send_text(&typing(conversation)).await;
    until_dropped(&p.app, "non_member", non_members, 1.0).await;

    alice_ws.send_text(&typing(conversation)).await;
    let (frame, before) = bob_ws
        .until(PUSH_DEADLINE, is_typing(conversation, alice))
        .await;
    assert_eq!(
        frame,
        serde_json::json!({"type": "typing", "conversationId": conversation, "userId": alice})
    );
    assert!(
        before.iter().all(|f| f["type"] != "typing"),
        "only alice's typing: {before:?}"
    );

    // The typer hears nothing of it, the stranger nothing at all: their next frames are
    // the next message.
    let next = p.app.user(bob).send_message(conversation, "yes?").await;
    let (_, before) = alice_ws
        .until(PUSH_DEADLINE, is_message(conversation, next))
        .await;
    assert!(before.iter().all(|f| f["type"] != "typing"), "{before:?}");
    let mut stranger_frames = Vec::new();
    while let Some(chatpipe_tests::push::Seen::Frame(f)) =
        stranger_ws.next(Duration::from_millis(500)).await
    {
        // Its own connection's `ready` is not about the conversation.
        if f["type"] != "ready" {
            stranger_frames.push(f);
        }
    }
    assert!(stranger_frames.is_empty(), "{stranger_frames:?}");

    // The signals were on chat.ephemeral; chat.events and the tables saw only bob's
    // message.
    let after = end_offsets(&brokers(), &p.ephemeral_topic).unwrap();
    assert!(
        after.iter().sum::<i64>() >= ephemeral.iter().sum::<i64>() + 2,
        "the two typing signals on chat.ephemeral: {ephemeral:?} -> {after:?}"
    );
    let message = p
        .consume_until(PUSH_DEADLINE, |rs| {
            rs.iter().any(|r| {
                matches!(&r.event, chatpipe_schemas::ChatEvent::MessageNew(m) if m.seq.get() == next)
            })
        })
        .await;
    assert!(message
        .iter()
        .all(|r| !format!("{:?}", r.event).contains("typing")));
    let grown: i64 = events_end(&p)
        .iter()
        .zip(&streamed)
        .map(|(a, b)| a - b)
        .sum();
    assert_eq!(grown, 1, "chat.events got bob's message and nothing else");
    let stored_after = tables(&p.app).await;
    let changed: Vec<_> = stored
        .iter()
        .zip(&stored_after)
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, _)| i)
        .collect();
    // conversation (last_seq), conversation_member (bob's watermark), message and outbox
    // (its message.new row, kept until an auditor confirms it): bob's send, nothing else.
    assert_eq!(changed, vec![0, 1, 2, 4], "{stored:?} -> {stored_after:?}");
    assert_eq!(stored_after[2].0, stored[2].0 + 1);
    assert_eq!(
        stored_after[4].0,
        stored[4].0 + 1,
        "one outbox row: bob's message.new"
    );
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// A client that sends typing 50 times a second for 4 s: the others see it at most once
/// per 3 s (fanout's throttle), and the gateway passes on at most one a second.
#[tokio::test]
async fn the_throttle_holds_under_a_client_typing_50_times_a_second() {
    let p = chatpipe_tests::stream::spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut alice_ws = p.connect(&gw.url, alice).await;
    let bob_ws = p.connect(&gw.url, bob).await;
    fanout.wait_online(&[alice, bob], PRESENCE_DEADLINE).await;
    let mut bob_frames = bob_ws.collect();
    let ephemeral = end_offsets(&brokers(), &p.ephemeral_topic).unwrap();

    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut sent = 0;
    while started.elapsed() < Duration::from_secs(4) {
        tick.tick().await;
        alice_ws.send_text(&typing(conversation)).await;
        sent += 1;
    }
    // Whatever fanout pushes for the burst arrives within the push deadline of its end;
    // a marker message after it says when bob has everything before.
    let marker = p.app.user(alice).send_message(conversation, "done").await;
    bob_frames
        .until(PUSH_DEADLINE, is_message(conversation, marker))
        .await;
    let typed: Vec<Value> = bob_frames
        .drain()
        .iter()
        .filter(|f| is_typing(conversation, alice)(f))
        .cloned()
        .collect();
    assert!(sent >= 150, "the client sent {sent}");
    assert!(
        (1..=2).contains(&typed.len()),
        "{} typing frames for a 4 s burst: at most one per 3 s",
        typed.len()
    );
    let passed: i64 = end_offsets(&brokers(), &p.ephemeral_topic)
        .unwrap()
        .iter()
        .zip(&ephemeral)
        .map(|(a, b)| a - b)
        .sum();
    assert!(
        (1..=5).contains(&passed),
        "the gateway passed on {passed} of {sent} (one a second)"
    );
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// A client typing in 40 conversation ids it made up, faster than fanout's budget of
/// membership loads (2 a second here): PostgreSQL is asked for the members of a bounded
/// number of them (its own statement count), the rest are dropped, and a member's typing
/// in a real conversation still arrives once the budget is back.
#[tokio::test]
async fn typing_in_made_up_conversations_costs_the_database_a_bounded_rate() {
    let p = chatpipe_tests::stream::spawn_pipeline().await;
    let mut settings = p.fanout_settings();
    settings.fanout.typing_member_loads_per_sec = 2;
    let fanout = p.start_fanout(settings);
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut alice_ws = p.connect(&gw.url, alice).await;
    let bob_ws = p.connect(&gw.url, bob).await;
    fanout.wait_online(&[alice, bob], PRESENCE_DEADLINE).await;
    let mut bob_frames = bob_ws.collect();
    const LOAD: &str = "SELECT user_id FROM conversation_member WHERE conversation_id = $1";
    let loads_before = p.app.statement_calls(LOAD).await;
    let budget_drops = dropped(&p.app, "membership_budget").await;

    let started = Instant::now();
    for made_up in 0..40 {
        alice_ws
            .send_text(&typing(conversation + 1_000 + made_up))
            .await;
    }
    until_dropped(&p.app, "membership_budget", budget_drops, 30.0).await;
    let took = started.elapsed().as_secs_f64();
    let loads = p.app.statement_calls(LOAD).await - loads_before;
    let allowed = 2 * (took.ceil() as i64 + 1);
    println!("40 made-up conversations in {took:.1} s: {loads} membership loads");
    assert!(
        loads <= allowed,
        "{loads} loads in {took:.1} s (budget 2/s)"
    );

    // A real conversation, once the budget is back: bob sees alice typing.
    let deadline = Instant::now() + PUSH_DEADLINE;
    loop {
        alice_ws.send_text(&typing(conversation)).await;
        let seen = bob_frames
            .try_until(Duration::from_millis(1_100), is_typing(conversation, alice))
            .await;
        if seen.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "bob never saw alice typing");
    }
    gw.stop().await.unwrap();
    p.cleanup().await;
}
