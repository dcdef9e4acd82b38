//! PostgreSQL restarted (fast) while a receipts window, or a notifications window, is
//! open: the flush fails, is held and retried, the processor stays up and applies every
//! receipt (writes every notification once). ingest-api's pool and Debezium reconnect by
//! themselves.

use std::time::{Duration, Instant};

use chatpipe_tests::stream::spawn_pipeline_with;
use ingest_api::configuration::ReadMode;
use serde_json::json;

use crate::{messages, one_fault_at_a_time, stack, three_messages, told_once};

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
                &format!("/v1/conversations/{conversation}/read"),
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
                &format!("/v1/conversations/{conversation}/messages"),
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

/// PostgreSQL restarted (fast) while a notifications window is open: the window's
/// statement fails, the window is held and retried, the processor stays up, and the
/// offline member gets exactly one record for the window's messages.
#[tokio::test]
async fn a_fast_postgresql_restart_during_a_notifications_window_loses_no_notification() {
    let _turn = one_fault_at_a_time().await;
    let p = chatpipe_tests::stream::spawn_pipeline().await;
    let mut settings = p.notification_settings();
    // A window long enough to restart PostgreSQL inside it.
    settings.notifications.collapse_ms = 3_000;
    let notifier = p.start_notifications(settings);
    let (alice, erin) = (1, 2);
    let (conversation, last) = three_messages(&p, (alice, erin)).await;
    // The window opens once the processor reads the first message from chat.events.
    p.consume_until(Duration::from_secs(60), |rs| {
        messages(rs).contains(&(conversation, last))
    })
    .await;
    stack(&["restart", "postgres"]).await;
    let restarted = Instant::now();
    told_once(&p, (erin, 3, last)).await;
    eprintln!(
        "the window's record written {:.1} s after PostgreSQL was back",
        restarted.elapsed().as_secs_f64()
    );
    assert!(
        notifier.is_running(),
        "the notifications processor stayed up"
    );
    drop(notifier);
    p.cleanup().await;
}

/// Invariant 3 under a power cut: PostgreSQL stopped with `pg_ctl stop -m immediate`
/// (no checkpoint, every backend killed) while sends run. Every message that got its
/// 201, up to the last one before the crash, is there after crash recovery, seqs
/// stay gapless, and CDC delivers each to chat.events.
#[tokio::test]
async fn every_acknowledged_send_survives_an_immediate_postgresql_crash() {
    let _turn = one_fault_at_a_time().await;
    let p = chatpipe_tests::stream::spawn_pipeline().await;
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    // The sender retries a failed send with the same clientMsgId until it is answered,
    // as a client must; `acked` holds (seq, body) of every 201 or 200, in order.
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(i64, String)>::new()));
    let failures = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = {
        let (base, http, token) = (p.app.base.clone(), p.app.http.clone(), p.app.token(alice));
        let (acked, failures, stop) = (acked.clone(), failures.clone(), stop.clone());
        tokio::spawn(async move {
            let url = format!("{base}/v1/conversations/{conversation}/messages");
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                n += 1;
                let body = format!("m{n}");
                let msg = json!({"clientMsgId": uuid::Uuid::new_v4(), "body": body});
                loop {
                    let res = http.post(&url).bearer_auth(&token).json(&msg).send().await;
                    match res {
                        Ok(res) if res.status() == 201 || res.status() == 200 => {
                            let v: serde_json::Value = res.json().await.unwrap();
                            acked
                                .lock()
                                .unwrap()
                                .push((v["seq"].as_i64().unwrap(), body));
                            break;
                        }
                        _ => {
                            failures.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }
        })
    };
    let acked_len = || acked.lock().unwrap().len();
    let until = Instant::now() + Duration::from_secs(30);
    while acked_len() < 100 {
        assert!(Instant::now() < until, "sends did not get going");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last_before = acked.lock().unwrap().last().cloned().unwrap();
    let _start = crate::StartOnPanic::new("postgres");
    stack(&["crash", "postgres"]).await;
    let recovered = Instant::now();
    // Sends go on after recovery: at least 50 more, then stop.
    let at_recovery = acked_len();
    let until = Instant::now() + Duration::from_secs(60);
    while acked_len() < at_recovery + 50 {
        assert!(
            Instant::now() < until,
            "sends did not resume within 60 s of crash recovery ({} failures)",
            failures.load(std::sync::atomic::Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    sender.await.unwrap();
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "{} sends acknowledged (seq {} when the crash was ordered); {} attempts failed around the crash; sends resumed {:.1} s after recovery",
        acked.len(),
        last_before.0,
        failures.load(std::sync::atomic::Ordering::SeqCst),
        recovered.elapsed().as_secs_f64()
    );

    let stored: Vec<(i64, String)> =
        sqlx::query_as("SELECT seq, body FROM message WHERE conversation_id = $1 ORDER BY seq")
            .bind(conversation)
            .fetch_all(&p.app.pool)
            .await
            .unwrap();
    assert!(
        stored.contains(&last_before),
        "the send acknowledged when the crash was ordered survived: {last_before:?}"
    );
    assert_eq!(
        stored, acked,
        "every acknowledged message is stored, in seq order, and nothing else"
    );
    let seqs: Vec<i64> = stored.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        seqs,
        (1..=acked.len() as i64).collect::<Vec<_>>(),
        "gapless"
    );
    // CDC rode out the crash too: every acknowledged seq reaches chat.events.
    let want: std::collections::BTreeSet<(i64, i64)> =
        seqs.iter().map(|s| (conversation, *s)).collect();
    p.consume_until(Duration::from_secs(120), |rs| {
        let got: std::collections::BTreeSet<(i64, i64)> = messages(rs).into_iter().collect();
        got.is_superset(&want)
    })
    .await;
    p.cleanup().await;
}
