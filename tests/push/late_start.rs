//! A gateway started before the broker and the registry (a compose file, a reboot) waits
//! for them instead of exiting, and pushes once they answer.

use std::time::{Duration, Instant};

use chatpipe_tests::stream::{brokers, spawn_pipeline};
use chatpipe_tests::{late_port, late_registry};

use crate::{is_message, PUSH_DEADLINE};

#[tokio::test]
async fn a_gateway_started_before_the_broker_and_the_registry_waits_and_then_pushes() {
    let p = spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    // The broker's port opens only after the reader's first look for the end of its
    // partition has timed out (10 s), so the gateway must retry, not exit.
    let (broker_port, broker_opens) = late_port(&brokers(), Duration::from_secs(12));
    let (late_registry, _) = late_registry(Duration::from_secs(3));
    let mut settings = p.gateway_settings("late", 0);
    settings.kafka.brokers = format!("127.0.0.1:{broker_port}");
    settings.registry.url = late_registry;
    let gw = p.start_gateway(settings).await;

    // Ready only once the broker answers.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = http.get(format!("{}/readyz", gw.admin)).send().await;
        if ready.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "the gateway never became ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        Instant::now() >= broker_opens,
        "ready before the broker could answer"
    );
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut bob_ws = p.connect(&gw.url, bob).await.collect();
    fanout.wait_online(&[bob], Duration::from_secs(30)).await;
    let seq = p.app.user(alice).send_message(conversation, "late").await;
    bob_ws
        .until(PUSH_DEADLINE, is_message(conversation, seq))
        .await;
    p.cleanup().await;
}
