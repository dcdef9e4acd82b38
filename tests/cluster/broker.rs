//! A broker lost with its process (SIGKILL) while messages stream: the broker that leads
//! partition 0 of the test's chat.events.

use std::time::{Duration, Instant};

use chatpipe_core::kafka::CreateGuarded;
use chatpipe_tests::audit::is_firing;
use chatpipe_tests::stream::{brokers, spawn_pipeline_with};
use ingest_api::configuration::ReadMode;
use pipeline::audit::alarm;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};

use crate::{
    every_acknowledged_on_the_topic, kill, one_fault_at_a_time, require_cluster, stack, Sender,
    StartOnPanic, RECOVERY,
};

fn leader_and_isr(topic: &str, partition: i32) -> (i32, Vec<i32>) {
    chatpipe_tests::cluster::leader_and_isr(&brokers(), topic, partition)
}

/// A topic of one partition with its one replica on broker `node`.
async fn create_on(topic: &str, node: i32) {
    let admin: chatpipe_core::kafka::AdminClient = chatpipe_core::kafka::client_config(&brokers())
        .create_guarded()
        .expect("Kafka admin client");
    let replicas: &[&[i32]] = &[&[node]];
    let results = admin
        .create_topics(
            &[NewTopic::new(
                topic,
                1,
                TopicReplication::Variable(replicas),
            )],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("creating a topic");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
}

#[tokio::test]
async fn the_leader_of_chat_events_partition_0_killed_under_load_loses_nothing_and_pushes_resume() {
    require_cluster();
    let _turn = one_fault_at_a_time().await;
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut bob_ws = p.connect(&gw.url, bob).await.collect();
    fanout.wait_online(&[bob], Duration::from_secs(20)).await;
    let sender = Sender::start(&p, alice, conversation, Duration::from_millis(50));
    // Pushes flow before the fault.
    bob_ws
        .until(Duration::from_secs(30), |f| {
            f["type"] == "message.new" && f["conversationId"] == conversation
        })
        .await;

    let (leader, isr) = leader_and_isr(&p.topic, 0);
    assert_eq!(
        isr.len(),
        3,
        "every replica of {}/0 is in sync before the kill: {isr:?}",
        p.topic
    );
    // The auditor watches the test's chat.events and a one-replica topic that lives on
    // the broker about to die (it goes offline with it); thresholds of 5 s.
    let lonely = format!("{}.on-{leader}-only", p.ns);
    create_on(&lonely, leader).await;
    let mut settings = p.audit_settings();
    settings.audit.replicated_topics = vec![p.topic.clone(), lonely.clone()];
    settings.audit.under_replicated_alert_ms = 5000;
    settings.audit.offline_alert_ms = 5000;
    let audit = p.start_audit(settings).await;
    audit
        .until(
            Duration::from_secs(30),
            "the auditor sees the cluster whole",
            |r| {
                r["checks"]["replication"]["partitions"] == 7
                    && !is_firing(r, alarm::UNDER_REPLICATED)
                    && !is_firing(r, alarm::OFFLINE_PARTITIONS)
            },
        )
        .await;
    let node = format!("kafka-{leader}");
    let _again = StartOnPanic::new(node.clone());
    let before = sender.seqs().into_iter().max().unwrap_or(0);
    let pid = kill(&node);
    let killed = Instant::now();
    eprintln!(
        "killed {node} (pid {pid}), the leader of {}/0, after seq {before}",
        p.topic
    );

    // Pushes resume: a message acknowledged after the kill reaches bob's open socket.
    let pushed = bob_ws
        .try_until(RECOVERY, |f| {
            f["type"] == "message.new"
                && f["conversationId"] == conversation
                && f["seq"].as_i64().is_some_and(|s| s > before)
        })
        .await;
    let push_back = killed.elapsed();
    let (new_leader, _) = leader_and_isr(&p.topic, 0);
    assert!(
        pushed.is_some(),
        "no message sent after the kill of {node} was pushed within {RECOVERY:?}; partition 0's leader is now {new_leader}; fanout readers: {:?}",
        fanout.readiness.report()
    );
    assert_ne!(new_leader, leader, "leadership of {}/0 moved", p.topic);
    let report = audit
        .until(
            Duration::from_secs(60),
            "under-replicated and offline alarms",
            |r| is_firing(r, alarm::UNDER_REPLICATED) && is_firing(r, alarm::OFFLINE_PARTITIONS),
        )
        .await;
    let alarms_at = killed.elapsed();
    eprintln!(
        "auditor {:.1} s after the kill: {}",
        alarms_at.as_secs_f64(),
        report["firing"]
    );
    // Sends go on a while on two brokers, then the third comes back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stack(&["start", &node]).await;
    let acked = sender.stop().await;
    let duplicates =
        every_acknowledged_on_the_topic(&p, conversation, &acked, Duration::from_secs(60)).await;
    eprintln!(
        "{node} killed: pushes back {:.1} s after the kill (leader {leader} -> {new_leader}); {} sends acknowledged, every one on {} ({duplicates} duplicates)",
        push_back.as_secs_f64(),
        acked.len(),
        p.topic
    );
    assert!(
        push_back <= RECOVERY,
        "pushes back within {RECOVERY:?} of the kill"
    );
    // The restarted broker catches up into the ISR before the next test.
    let deadline = Instant::now() + Duration::from_secs(60);
    while leader_and_isr(&p.topic, 0).1.len() < 3 {
        assert!(
            Instant::now() < deadline,
            "{node} back in the ISR of {}/0 within 60 s",
            p.topic
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    audit
        .until(Duration::from_secs(60), "the alarms clear", |r| {
            !is_firing(r, alarm::UNDER_REPLICATED) && !is_firing(r, alarm::OFFLINE_PARTITIONS)
        })
        .await;
    gw.stop().await.unwrap();
    p.cleanup().await;
}
