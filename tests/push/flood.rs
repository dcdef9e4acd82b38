//! A client that floods its socket with acks and typing: closed with 1008 "too many
//! frames" once past its connection's bucket (`signals.frames`), its acks coalesced
//! (one record per conversation per `signals.ack_interval_ms`, the highest seq, the last
//! one passed on as it closes), and nobody else on the gateway notices: another user's
//! ack reaches PostgreSQL and their typing reaches a member's socket.

use std::time::{Duration, Instant};

use chatpipe_tests::bench::end_offsets;
use chatpipe_tests::push::Seen;
use chatpipe_tests::stream::brokers;
use chatpipe_tests::TestApp;

use crate::{PRESENCE_DEADLINE, PUSH_DEADLINE};

async fn delivered(app: &TestApp, conversation: i64, user: i64) -> i64 {
    app.watermarks(conversation, user).await.1
}

/// Polls PostgreSQL until `user`'s delivered watermark in `conversation` is `seq`.
async fn until_delivered(app: &TestApp, conversation: i64, user: i64, seq: i64) {
    let deadline = Instant::now() + PUSH_DEADLINE;
    loop {
        let now = delivered(app, conversation, user).await;
        if now == seq {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "user {user}'s delivered watermark is {now}, not {seq}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_flooding_socket_is_closed_and_the_others_acks_and_typing_still_arrive() {
    let p = chatpipe_tests::stream::spawn_pipeline().await;
    let _receipts = p.start_receipts(p.receipts_settings());
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob, carol) = (1, 2, 3);
    let conversation = p.app.user(alice).create_group(&[bob, carol]).await;
    let mut top = 0;
    for body in ["one", "two", "three"] {
        top = p.app.user(alice).send_message(conversation, body).await;
    }
    let mut alice_ws = p.connect(&gw.url, alice).await;
    let mut bob_ws = p.connect(&gw.url, bob).await;
    let mut carol_ws = p.connect(&gw.url, carol).await;
    fanout
        .wait_online(&[alice, bob, carol], PRESENCE_DEADLINE)
        .await;
    let acks_before: i64 = end_offsets(&brokers(), &p.acks_topic).unwrap().iter().sum();

    // Bob floods: 1,000 acks of every seq and typing, as fast as the socket takes them.
    let mut sent = 0;
    for i in 0..1_000 {
        let frame = if i % 2 == 0 {
            let seq = 1 + (i / 2) % top;
            format!(r#"{{"type":"ack","conversationId":{conversation},"seq":{seq}}}"#)
        } else {
            format!(r#"{{"type":"typing","conversationId":{conversation}}}"#)
        };
        if !bob_ws.try_send_text(&frame).await {
            break;
        }
        sent += 1;
    }
    let close = loop {
        match bob_ws.next(PUSH_DEADLINE).await {
            Some(Seen::Closed(close)) => break close,
            Some(Seen::Frame(_)) => continue,
            None => panic!("bob's flooding socket is still open after {sent} frames"),
        }
    };
    let close = close.expect("a close frame");
    assert_eq!(
        (u16::from(close.code), close.reason.as_str()),
        (1008, "too many frames")
    );
    // His acks were coalesced, not dropped: the highest seq he sent is his watermark.
    until_delivered(&p.app, conversation, bob, top).await;
    let acks_after: i64 = end_offsets(&brokers(), &p.acks_topic).unwrap().iter().sum();
    let records = acks_after - acks_before;
    println!("bob sent {sent} frames; {records} ack records reached the topic");
    assert!(
        (1..=4).contains(&records),
        "{records} ack records for one conversation within a second"
    );

    // Carol, on the same gateway: her ack reaches PostgreSQL, her typing alice's socket.
    assert_eq!(delivered(&p.app, conversation, carol).await, 0);
    carol_ws
        .send_text(&format!(
            r#"{{"type":"ack","conversationId":{conversation},"seq":{top}}}"#
        ))
        .await;
    until_delivered(&p.app, conversation, carol, top).await;
    carol_ws
        .send_text(&format!(
            r#"{{"type":"typing","conversationId":{conversation}}}"#
        ))
        .await;
    alice_ws
        .until(PUSH_DEADLINE, |f| {
            f["type"] == "typing" && f["userId"] == carol
        })
        .await;
    gw.stop().await.unwrap();
    // Its readers leave their groups before cleanup deletes their topics: closing a
    // consumer whose topics vanished under it has aborted librdkafka (an assert in
    // rd_kafka_cgrp_terminated).
    fanout.stop().unwrap();
    p.cleanup().await;
}
