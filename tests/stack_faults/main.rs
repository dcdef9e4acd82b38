//! Faults of the streaming stack itself: Kafka Connect killed, the broker stalled, the
//! registry stopped, PostgreSQL restarted. Its own test binary: cargo runs test binaries
//! one after another, so these faults disturb no other test; inside the binary the tests
//! take turns ([`one_fault_at_a_time`]).

mod broker;
mod cassandra;
mod fenced;
mod postgres;
mod registry;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use chatpipe_tests::stack::component_pid as stack_pid;
pub use chatpipe_tests::stack::{one_fault_at_a_time, run_stack as stack, signal, StartOnPanic};
use chatpipe_tests::stream::{spawn_pipeline, wait_until_streaming};
use serde_json::json;

fn connect_pid() -> i32 {
    stack_pid("connect")
}

pub use chatpipe_tests::stream::messages;

/// A group of `alice` and `erin` with three messages of alice's ("m0" to "m2"): the
/// conversation and the last seq.
pub(crate) async fn three_messages(
    p: &chatpipe_tests::stream::Pipeline,
    (alice, erin): (i64, i64),
) -> (i64, i64) {
    let conversation = p.app.user(alice).create_group(&[erin]).await;
    let mut last = 0;
    for i in 0..3 {
        last = p
            .app
            .user(alice)
            .send_message(conversation, &format!("m{i}"))
            .await;
    }
    (conversation, last)
}

/// Waits for the namespace's first notification record and checks it is the only one:
/// `user` told of `count` messages up to seq `last` (one record for the window, not one
/// per retry).
pub(crate) async fn told_once(
    p: &chatpipe_tests::stream::Pipeline,
    (user, count, last): (i64, i64, i64),
) {
    let records = p
        .notifications_until(Duration::from_secs(60), |r| !r.is_empty())
        .await;
    let told: Vec<(i64, i64, i64)> = records
        .iter()
        .map(|(_, n)| (n.user_id.get(), n.count, n.last_seq.get()))
        .collect();
    assert_eq!(told, vec![(user, count, last)]);
    let all = p.notifications_all(Duration::from_secs(30)).await;
    assert_eq!(all.len(), 1, "one record, not one per retry: {all:?}");
}

#[tokio::test]
async fn kafka_connect_killed_with_sigkill_mid_stream_loses_no_event() {
    let _turn = one_fault_at_a_time().await;
    let p = spawn_pipeline().await;
    let mut conversations = Vec::new();
    for i in 0..10 {
        conversations.push(p.app.user(500 + i).create_group(&[1]).await);
    }
    // 1,000 messages, 100 per conversation, sent while Connect dies and comes back.
    // `acked` counts the 201s, to show when the kill fell.
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sender = {
        let (base, http) = (p.app.base.clone(), p.app.http.clone());
        let acked = acked.clone();
        let tokens: Vec<String> = (0..10).map(|i| p.app.token(500 + i)).collect();
        let conversations = conversations.clone();
        tokio::spawn(async move {
            let sends = conversations.into_iter().zip(tokens).map(|(conv, token)| {
                let (base, http, acked) = (base.clone(), http.clone(), acked.clone());
                async move {
                    for n in 0..100 {
                        let body =
                            json!({"clientMsgId": uuid::Uuid::new_v4(), "body": format!("m{n}")});
                        let res = http
                            .post(format!("{base}/v1/conversations/{conv}/messages"))
                            .bearer_auth(&token)
                            .json(&body)
                            .send()
                            .await
                            .expect("send");
                        assert_eq!(res.status(), 201);
                        acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        // Paced: the sends outlast Connect's restart.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            });
            futures::future::join_all(sends).await;
        })
    };

    let mut records = p
        .consume_until(Duration::from_secs(60), |rs| messages(rs).len() >= 150)
        .await;
    let _restart = StartOnPanic::new("connect");
    let pid = connect_pid();
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -9 {pid}");
    let killed_at = Instant::now();
    let acked_at_kill = acked.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!(
        "killed Kafka Connect (pid {pid}) after {} messages had arrived, {acked_at_kill} acknowledged",
        messages(&records).len()
    );
    assert!(
        acked_at_kill < 1000,
        "the kill fell mid-stream: sends were still going"
    );

    stack(&["start", "connect"]).await;
    wait_until_streaming(&p.connector, &p.slot).await;
    let acked_when_back = acked.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!(
        "Kafka Connect streaming again {:.1} s after the kill; {} sends committed meanwhile",
        killed_at.elapsed().as_secs_f64(),
        acked_when_back - acked_at_kill
    );
    assert!(
        acked_when_back > acked_at_kill,
        "messages were committed while Connect was down"
    );
    sender.await.expect("every send succeeded");

    let expected: BTreeSet<(i64, i64)> = conversations
        .iter()
        .flat_map(|&c| (1..=100).map(move |s| (c, s)))
        .collect();
    let rest = p
        .consume_until(Duration::from_secs(120), |rs| {
            let mut seen: BTreeSet<(i64, i64)> = messages(&records).into_iter().collect();
            seen.extend(messages(rs));
            seen.is_superset(&expected)
        })
        .await;
    records.extend(rest);
    let all = messages(&records);
    let unique: BTreeSet<_> = all.iter().copied().collect();
    assert!(
        unique.is_superset(&expected),
        "every committed message arrived"
    );
    eprintln!(
        "{} message.new records for {} messages: {} duplicates",
        all.len(),
        expected.len(),
        all.len() - unique.len()
    );
    // Per conversation, after dedupe the seqs are 1..=100 in arrival order.
    for &conv in &conversations {
        let mut order = Vec::new();
        for (c, s) in &all {
            if *c == conv && !order.contains(s) {
                order.push(*s);
            }
        }
        assert_eq!(order, (1..=100).collect::<Vec<_>>(), "conversation {conv}");
    }
    p.cleanup().await;
}
