//! PostgreSQL restarted (fast) while a receipts window is open: the flush fails, is held
//! and retried, the processor stays up and applies every receipt. ingest-api's pool and
//! Debezium reconnect by themselves.

use std::time::{Duration, Instant};

use chatpipe_tests::stream::spawn_pipeline_with;
use ingest_api::configuration::ReadMode;
use serde_json::json;

use crate::{messages, one_fault_at_a_time, stack};

#[tokio::test]
async fn a_fast_postgresql_restart_during_a_receipts_window_loses_no_receipt() {
    let _turn = one_fault_at_a_time().await;
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let mut settings = p.receipts_settings();
    // A window long enough to restart PostgreSQL inside it.
    settings.receipts.debounce_window_ms = 3_000;
    let receipts = p.start_receipts(settings);
    let alice = 1;
    let readers: Vec<i64> = (2..=11).collect();
    let conversation = p.app.user(alice).create_group(&readers).await;
    let mut last = 0;
    for i in 0..10 {
        last = p
            .app
            .user(alice)
            .send_message(conversation, &format!("m{i}"))
            .await;
    }
    // Reader u reads up to seq u - 1: ten receipts, one window.
    for &u in &readers {
        p.app
            .user(u)
            .post(
                &format!("/conversations/{conversation}/read"),
                json!({"seq": u - 1}),
            )
            .await
            .expect(202);
    }
    stack(&["restart", "postgres"]).await;
    let restarted = Instant::now();

    let deadline = restarted + Duration::from_secs(30);
    for &u in &readers {
        loop {
            if p.app.watermark(conversation, u).await == Some(u - 1) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "user {u}'s receipt was not applied within 30 s of the restart"
            );
            assert!(receipts.is_running(), "the receipts processor stopped");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    eprintln!(
        "every receipt applied {:.1} s after PostgreSQL was back",
        restarted.elapsed().as_secs_f64()
    );
    assert!(receipts.is_running(), "the receipts processor stayed up");

    // The send path and CDC heal too: a message sent now reaches chat.events.
    let until = Instant::now() + Duration::from_secs(60);
    let after = loop {
        let res = p
            .app
            .user(alice)
            .post(
                &format!("/conversations/{conversation}/messages"),
                json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "after"}),
            )
            .await;
        if res.status == 201 {
            break res.body["seq"].as_i64().unwrap();
        }
        assert!(Instant::now() < until, "sends still fail: {}", res.status);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(after, last + 1);
    p.consume_until(Duration::from_secs(60), |rs| {
        messages(rs).contains(&(conversation, after))
    })
    .await;
    eprintln!(
        "a send after the restart reached chat.events {:.1} s after PostgreSQL was back",
        restarted.elapsed().as_secs_f64()
    );
    drop(receipts);
    p.cleanup().await;
}
