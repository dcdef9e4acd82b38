//! A client that stops reading overflows its queue and is closed with 1008; a fast
//! client of the same conversation on the same gateway gets every message.

use std::time::Duration;

use chatpipe_tests::push::{Seen, WsClient};
use chatpipe_tests::stream::spawn_pipeline;
use futures::StreamExt;

use crate::{frames_until_closed, PRESENCE_DEADLINE, PUSH_DEADLINE};

const MESSAGES: i64 = 300;

#[tokio::test]
async fn a_slow_client_is_closed_and_the_others_get_every_message() {
    let p = spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let mut settings = p.gateway_settings("gw", 0);
    settings.sessions.queue_bound = 8;
    let gw = p.start_gateway(settings).await;
    let (sender, fast, slow) = (1, 2, 3);
    let conversation = p.app.user(sender).create_group(&[fast, slow]).await;
    let mut fast_ws = p.connect(&gw.url, fast).await;
    // A tiny receive buffer and nobody reading: the gateway's writes stall at once.
    let mut slow_ws = WsClient::connect_with_recv_buffer(&gw.url, &p.app.token(slow), 4096).await;
    fanout.wait_online(&[fast, slow], PRESENCE_DEADLINE).await;

    // The fast client reads while the messages are sent; the slow one never does.
    let body = "x".repeat(3_900);
    let client = p.app.user(sender);
    let sending = futures::stream::iter(0..MESSAGES)
        .map(|_| client.send_message(conversation, &body))
        .buffer_unordered(8)
        .collect::<Vec<_>>();
    let reading = async {
        let mut seqs = Vec::new();
        while seqs.len() < MESSAGES as usize {
            let frame = fast_ws.frame(PUSH_DEADLINE).await;
            if frame["conversationId"] == conversation {
                seqs.push(frame["seq"].as_i64().unwrap());
            }
        }
        seqs
    };
    let (sent, seqs) = tokio::join!(sending, reading);
    assert_eq!(sent.len() as i64, MESSAGES);
    assert_eq!(
        seqs,
        (1..=MESSAGES).collect::<Vec<_>>(),
        "the fast client got everything, in order"
    );

    // Now read the slow client: what was buffered, then the close.
    let (frames, end) = frames_until_closed(&mut slow_ws, Duration::from_secs(30)).await;
    match end {
        Some(Seen::Closed(Some(close))) => {
            assert_eq!(u16::from(close.code), 1008, "{close:?}");
            assert_eq!(close.reason.as_str(), "send queue overflow");
        }
        other => panic!("the slow client was not closed for overflow: {other:?}"),
    }
    assert!(
        (frames.len() as i64) < MESSAGES,
        "the slow client was cut off, not served: it got {} frames",
        frames.len()
    );
    gw.stop().await.unwrap();
    // Its readers leave their groups before cleanup deletes their topics: closing a
    // consumer whose topics vanished under it has aborted librdkafka (an assert in
    // rd_kafka_cgrp_terminated).
    fanout.stop().unwrap();
    p.cleanup().await;
}
