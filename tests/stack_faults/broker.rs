//! The broker stalled (SIGSTOP) for 90 s, as a long GC pause, a frozen VM or a network
//! partition would, and the broker restarted: every service of ours waits it out and
//! resumes by itself.

use chatpipe_core::kafka::CreateGuarded;
use std::time::{Duration, Instant};

use chatpipe_tests::push::Collector;
use chatpipe_tests::stream::spawn_pipeline_with;
use ingest_api::configuration::ReadMode;
use serde_json::Value;

use crate::{messages, one_fault_at_a_time, signal, stack, stack_pid, StartOnPanic};

/// 90 s in CI; `CHATPIPE_BROKER_STALL_SECS=120` runs the longer variant.
fn stall() -> Duration {
    let secs = std::env::var("CHATPIPE_BROKER_STALL_SECS")
        .ok()
        .map(|s| {
            s.parse()
                .expect("CHATPIPE_BROKER_STALL_SECS is a number of seconds")
        })
        .unwrap_or(90);
    Duration::from_secs(secs)
}
/// What every leg (pushes, CDC, receipts, readiness) may take to come back, timed from
/// the broker's return: SIGCONT after a stall, `scripts/stack start kafka` returning
/// after a restart. It was 120 s for restarts until the cause of the long stalls was
/// found (librdkafka#5301, `core/src/kafka/rebootstrap.rs`).
const RECOVERY: Duration = Duration::from_secs(30);

/// The broker process, stopped; resumed when dropped (a failing test never leaves the
/// stack frozen for the next one).
struct Stalled(i32);

impl Stalled {
    fn broker() -> Self {
        let pid = stack_pid("kafka");
        signal("-STOP", pid);
        Stalled(pid)
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        signal("-CONT", self.0);
    }
}

/// Waits until the broker acknowledges a record from an idempotent producer (which
/// needs the transaction coordinator loaded); returns how long that took. `topic` is
/// one nobody in the test reads.
async fn broker_serves(topic: &str, deadline: Duration) -> Duration {
    let started = Instant::now();
    let producer: chatpipe_core::kafka::FutureProducer =
        chatpipe_core::kafka::producer_config(&chatpipe_tests::stream::brokers())
            .create_guarded()
            .expect("Kafka producer");
    let record = rdkafka::producer::FutureRecord::to(topic)
        .key("probe")
        .payload("broker readiness probe");
    match producer.send(record, deadline).await {
        Ok(_) => started.elapsed(),
        Err((e, _)) => panic!(
            "the broker did not serve an idempotent producer within {deadline:?} of its return: {e}"
        ),
    }
}

/// The body of `admin`'s `/readyz` when it is not 200 (or why it did not answer).
async fn not_ready(admin: &str) -> Option<String> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    match http.get(format!("{admin}/readyz")).send().await {
        Ok(r) if r.status() == 200 => None,
        Ok(r) => Some(format!(
            "{} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        )),
        Err(e) => Some(e.to_string()),
    }
}

/// The seqs of `conversation` pushed in `frames`.
fn pushed_seqs(frames: &[Value], conversation: i64) -> impl Iterator<Item = i64> + '_ {
    frames
        .iter()
        .filter(move |f| f["type"] == "message.new" && f["conversationId"] == conversation)
        .filter_map(|f| f["seq"].as_i64())
}

/// The last seq of `conversation` a client holds with none missing before it, from the
/// frames it received: where its catch-up starts.
fn held_without_gap(frames: &[Value], conversation: i64) -> i64 {
    let held: std::collections::BTreeSet<i64> = pushed_seqs(frames, conversation).collect();
    (1..).take_while(|s| held.contains(s)).last().unwrap_or(0)
}

fn is_message(conversation: i64, seq: i64) -> impl Fn(&Value) -> bool {
    move |f| f["type"] == "message.new" && f["conversationId"] == conversation && f["seq"] == seq
}

/// What happens to the broker in a drill.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// SIGSTOP, wait, SIGCONT.
    Stall(Duration),
    /// `scripts/stack restart kafka`: a clean stop and a start.
    Restart,
}

#[tokio::test]
async fn a_stalled_broker_is_waited_out_and_pushes_cdc_and_receipts_resume() {
    broker_fault(Fault::Stall(stall())).await;
}

#[tokio::test]
async fn a_restarted_broker_is_waited_out_and_pushes_cdc_and_receipts_resume() {
    broker_fault(Fault::Restart).await;
}

async fn broker_fault(fault: Fault) {
    let _turn = one_fault_at_a_time().await;
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let receipts = p.start_receipts(p.receipts_settings());
    let fanout = p.start_fanout(p.fanout_settings());
    let notifier = p.start_notifications(p.notification_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    // Carol never connects: the notifications processor tells her.
    let (alice, bob, carol) = (1, 2, 3);
    let conversation = p.app.user(alice).create_group(&[bob, carol]).await;
    let mut bob_ws: Collector = p.connect(&gw.url, bob).await.collect();
    fanout.wait_online(&[bob], Duration::from_secs(20)).await;
    let first = p.app.user(alice).send_message(conversation, "before").await;
    bob_ws
        .until(Duration::from_secs(20), is_message(conversation, first))
        .await;

    let _restart = StartOnPanic::new("kafka");
    // PostgreSQL alone acknowledges sends: they are committed with their outbox rows.
    let send_during = || async {
        let mut during = Vec::new();
        for i in 0..5 {
            during.push(
                p.app
                    .user(alice)
                    .send_message(conversation, &format!("during {i}"))
                    .await,
            );
        }
        during
    };
    let during = match fault {
        Fault::Stall(stall) => {
            let stalled = Stalled::broker();
            eprintln!("broker stalled (SIGSTOP) for {stall:?}");
            let during = send_during().await;
            // The readers wait the broker out, and once it has been silent for
            // readers.stall_after_ms (30 s) they say so: /readyz turns 503 naming it.
            let stalled_at = Instant::now();
            let mut said = None;
            while stalled_at.elapsed() < stall {
                if said.is_none() {
                    if let Some(body) = not_ready(&gw.admin).await {
                        if body.contains("the broker has not answered") {
                            said = Some(stalled_at.elapsed());
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            drop(stalled);
            let said = said.unwrap_or_else(|| {
                panic!("the gateway's /readyz never said the broker was silent during a {stall:?} stall")
            });
            eprintln!(
                "gateway /readyz 503 (broker silent) {:.1} s into the stall",
                said.as_secs_f64()
            );
            during
        }
        Fault::Restart => {
            stack(&["down", "kafka"]).await;
            let during = send_during().await;
            stack(&["start", "kafka"]).await;
            during
        }
    };
    // Every leg is timed from here: the broker is back (resumed, or started and
    // answering). A restarted broker loads its coordinators after it answers; how long it
    // took to serve an idempotent producer (which needs the transaction coordinator) is
    // printed beside our services' times.
    let returned = Instant::now();
    let probe = format!("{}.dlq", p.receipts_topic);
    let broker_ready = broker_serves(&probe, RECOVERY).await;
    eprintln!(
        "broker back ({fault:?}), serving an idempotent producer {:.1} s later",
        broker_ready.as_secs_f64()
    );

    // Pushes resume on bob's open WebSocket. The first messages after a long outage may
    // find bob's presence lease expired (his gateway could not renew it while the broker
    // was away) until the gateway's renewal is read: those are not pushed (pushes are
    // best effort, clients catch up over REST). So: a message every 2 s until one is.
    let recovery = RECOVERY;
    // What is left of the recovery time.
    let left = || recovery.saturating_sub(returned.elapsed());
    let mut afters = Vec::new();
    let after = loop {
        let after = p.app.user(alice).send_message(conversation, "after").await;
        afters.push(after);
        let wait = Duration::from_secs(2);
        if bob_ws
            .try_until(wait, is_message(conversation, after))
            .await
            .is_some()
        {
            break after;
        }
        if returned.elapsed() >= recovery {
            // Say which part of the push path did not come back.
            let gateway = reqwest::get(format!("{}/readyz", gw.admin))
                .await
                .map(|r| r.status().to_string())
                .unwrap_or_else(|e| e.to_string());
            let gateway_body = match reqwest::get(format!("{}/readyz", gw.admin)).await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(e) => e.to_string(),
            };
            panic!(
                "no push reached bob's WebSocket within {recovery:?} of the broker's return; \
                 fanout: {} events, bob online: {}, readers: {:?}; gateway /readyz: {gateway} {gateway_body}; \
                 receipts readers: {:?}; connector: {}",
                fanout.status.events(),
                fanout.status.online_among(&[chatpipe_core::UserId::of(bob)]) == 1,
                fanout.readiness.report(),
                receipts.readiness.report(),
                chatpipe_tests::stream::connector_status(&p.connector).await,
            );
        }
    };
    let push_back = returned.elapsed();
    // The messages sent during the outage reach chat.events after it, older than
    // fanout.max_age_ms or while bob's lease had expired in fanout: not pushed. Bob's
    // socket stayed open, so nothing but the gateway's resync frame tells his client to
    // catch up, and the catch-up has every one of them.
    let resync = bob_ws
        .until(left(), |f| f["type"] == gateway::resync::RESYNC)
        .await;
    let resync_back = returned.elapsed();
    eprintln!("bob's socket got {resync}");
    // A fixed sentence: nothing of the broker's errors reaches a client.
    let fixed = [
        gateway::resync::Cause::Presence.reason(),
        gateway::resync::Cause::Deliveries.reason(),
    ];
    assert!(
        fixed.contains(&resync["reason"].as_str().unwrap_or_default()),
        "{resync}"
    );
    // Bob's client catches up from what it holds, as docs/protocol.md says: the seqs
    // pushed to it before the resync frame, without a gap. From then on pushes alone
    // must carry every message: a lost one fails here, as nothing would tell the client.
    let resync_at = bob_ws
        .seen
        .iter()
        .position(|f| f["type"] == gateway::resync::RESYNC)
        .expect("the resync frame is among the frames seen");
    let known = held_without_gap(&bob_ws.seen[..resync_at], conversation);
    let caught_up = p
        .app
        .user(bob)
        .get(&format!(
            "/v1/conversations/{conversation}/messages?afterSeq={known}"
        ))
        .await;
    let mut view: std::collections::BTreeSet<i64> = caught_up.body["messages"]
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["seq"].as_i64()).collect())
        .unwrap_or_default();
    let mut tail = Vec::new();
    for i in 0..3 {
        let seq = p
            .app
            .user(alice)
            .send_message(conversation, &format!("tail {i}"))
            .await;
        tail.push(seq);
        if bob_ws
            .try_until(left(), is_message(conversation, seq))
            .await
            .is_none()
        {
            panic!("seq {seq}, sent after bob's catch-up, was never pushed to him: lost");
        }
    }
    view.extend(pushed_seqs(&bob_ws.seen, conversation));
    let sent: Vec<i64> = std::iter::once(first)
        .chain(during.iter().copied())
        .chain(afters.iter().copied())
        .chain(tail.iter().copied())
        .collect();
    let missing: Vec<i64> = sent.iter().copied().filter(|s| !view.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "bob's client lacks {missing:?}: pushed, or caught up from seq {known} after the resync, \
         it should hold every message sent ({sent:?}); it holds {view:?}"
    );
    // CDC: every message, the ones sent during the stall included, is on chat.events.
    let expected: Vec<(i64, i64)> = sent.iter().map(|&s| (conversation, s)).collect();
    p.consume_until(left(), |rs| {
        let seen = messages(rs);
        expected.iter().all(|m| seen.contains(m))
    })
    .await;
    let cdc_back = returned.elapsed();
    // Notifications: carol, offline, is told of the newest message.
    let newest = *sent.last().expect("messages were sent");
    p.notifications_until(left(), |records| {
        records
            .iter()
            .any(|(_, n)| n.user_id.get() == carol && n.last_seq.get() == newest)
    })
    .await;
    let notified_back = returned.elapsed();
    // Receipts: a read accepted now is flushed (the producer and the processor resumed).
    let until = returned + recovery;
    loop {
        let res = p
            .app
            .user(bob)
            .post(
                &format!("/v1/conversations/{conversation}/read"),
                serde_json::json!({"seq": after}),
            )
            .await;
        if res.status == 202 {
            break;
        }
        assert!(
            Instant::now() < until,
            "POST /read still {} {recovery:?} after the broker came back",
            res.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    while p.app.watermark(conversation, bob).await < Some(after) {
        assert!(
            Instant::now() < until,
            "bob's read was not flushed within {recovery:?} of the broker's return"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let receipts_back = returned.elapsed();
    // The messages sent during the stall are older than fanout.max_age_ms (60 s) by the
    // time they stream: not pushed; clients catch up over REST (afterSeq).
    assert!(
        receipts.is_running() && fanout.is_running() && notifier.is_running(),
        "nothing was restarted"
    );
    // Ready again once the broker answers.
    let until = returned + recovery;
    while let Some(body) = not_ready(&gw.admin).await {
        assert!(
            Instant::now() < until,
            "the gateway's /readyz still 503 after the broker came back: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ready_back = returned.elapsed();
    let legs = [
        ("push", push_back),
        ("resync frame", resync_back),
        ("every message on chat.events", cdc_back),
        ("offline member notified", notified_back),
        ("read flushed", receipts_back),
        ("gateway ready", ready_back),
    ];
    let line: Vec<String> = legs
        .iter()
        .map(|(leg, t)| format!("{leg} {:.1} s", t.as_secs_f64()))
        .collect();
    eprintln!(
        "after the broker came back ({fault:?}): {}",
        line.join(", ")
    );
    for (leg, t) in legs {
        assert!(
            t <= recovery,
            "{leg}: {:.1} s after the broker's return, over {recovery:?} ({fault:?}); all: {line:?}",
            t.as_secs_f64()
        );
    }
    gw.stop().await.unwrap();
    p.cleanup().await;
}
