//! The gateway's listener against sockets that never finish their upgrade request.

use std::time::Duration;

use chatpipe_tests::stream::spawn_pipeline;
use chatpipe_tests::{slow_header_sockets, until_closed};

use crate::{is_message, PRESENCE_DEADLINE, PUSH_DEADLINE};

#[tokio::test]
async fn sockets_that_never_finish_their_upgrade_are_closed_while_clients_connect_and_get_pushes() {
    let metrics = chatpipe_tests::OwnMetrics::start();
    let p = spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let mut settings = p.gateway_settings("gw", 0);
    settings.http.header_read_timeout_ms = 1_000;
    let gw = p.start_gateway(settings).await;
    let addr = gw
        .url
        .trim_start_matches("ws://")
        .trim_end_matches("/ws")
        .to_owned();
    let slow = slow_header_sockets(&addr, 200).await;

    // Meanwhile a client connects and is pushed to.
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut bob_ws = p.connect(&gw.url, bob).await;
    fanout.wait_online(&[bob], PRESENCE_DEADLINE).await;
    let seq = p.app.user(alice).send_message(conversation, "hi").await;
    bob_ws
        .until(PUSH_DEADLINE, is_message(conversation, seq))
        .await;

    until_closed(slow, Duration::from_secs(10)).await;
    // This test's recorder: its gateway is the only server the slow sockets reach.
    let timeouts = metrics.sum("http_connection_timeouts_total", &[]);
    assert!(timeouts >= 200.0, "counted {timeouts}");
    gw.stop().await.unwrap();
    p.cleanup().await;
}
