//! Read receipts as a stream: POST /read -> chat.read-receipts -> the receipts
//! processor -> one batched, monotone UPDATE per window -> read.updated on chat.events.

use std::time::Duration;

use chatpipe_schemas::receipt::{ReadReceipt, ReceiptCodec};
use chatpipe_schemas::registry::Registry;
use chatpipe_schemas::ChatEvent;
use chatpipe_tests::stream::{
    produce_raw, spawn_pipeline_with, wait_until_consumed, Pipeline, Record,
};
use chatpipe_tests::{registry_url, TestApp};
use ingest_api::configuration::ReadMode;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;

async fn watermark(app: &TestApp, conv: i64, user: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT last_read_seq FROM conversation_member WHERE conversation_id = $1 AND user_id = $2",
    )
    .bind(conv)
    .bind(user)
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

fn reads_of(records: &[Record], user: i64) -> Vec<i64> {
    records
        .iter()
        .filter_map(|r| match &r.event {
            ChatEvent::ReadUpdated(e) if e.user_id == user => Some(e.last_read_seq),
            _ => None,
        })
        .collect()
}

async fn group_with_messages(p: &Pipeline, n: usize) -> i64 {
    let conv = p.app.user(10).create_group(&[20, 30]).await;
    for i in 0..n {
        p.app.user(10).send_message(conv, &format!("m{i}")).await;
    }
    conv
}

/// Writes receipts straight to the namespace's receipts topic, as any producer could.
struct Receipts {
    topic: String,
    codec: ReceiptCodec,
    producer: FutureProducer,
}

impl Receipts {
    async fn new(p: &Pipeline) -> Self {
        let registry = Registry::new(&registry_url(), Duration::from_secs(5)).unwrap();
        Self {
            topic: p.receipts_topic.clone(),
            codec: registry.receipt_codec().await.unwrap(),
            producer: chatpipe_core::kafka::producer_config(&chatpipe_tests::stream::brokers())
                .create()
                .unwrap(),
        }
    }

    async fn send(&self, conv: i64, user: i64, seq: i64) {
        let bytes = self.codec.encode(&ReadReceipt {
            conversation_id: conv,
            user_id: user,
            seq,
            at: chrono::Utc::now(),
        });
        let key = conv.to_string();
        self.producer
            .send(
                FutureRecord::to(&self.topic).key(&key).payload(&bytes),
                Duration::from_secs(10),
            )
            .await
            .expect("produced");
    }
}

#[tokio::test]
async fn a_read_answers_202_and_the_watermark_follows_within_a_window_never_backwards() {
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let settings = p.receipts_settings();
    let group = settings.receipts.group.clone();
    let processor = p.start_receipts(settings);
    let conv = group_with_messages(&p, 60).await;
    let bob = p.app.user(20);
    let path = format!("/conversations/{conv}/read");

    let accepted = bob.post(&path, json!({"seq": 50})).await.expect(202);
    assert_eq!(
        accepted,
        json!({"conversationId": conv, "acceptedSeq": 50, "lastReadSeq": 0})
    );
    bob.post(&path, json!({"seq": 45})).await.expect(202); // the laptop, late

    let mut records = p
        .consume_until(Duration::from_secs(30), |rs| reads_of(rs, 20).contains(&50))
        .await;
    wait_until_consumed(&group, &p.receipts_topic, Duration::from_secs(30)).await;
    assert_eq!(
        watermark(&p.app, conv, 20).await,
        50,
        "45 after 50 keeps 50"
    );
    let inbox = bob.get("/inbox").await.expect(200);
    assert_eq!(inbox["conversations"][0]["lastReadSeq"], 50);
    assert_eq!(inbox["conversations"][0]["unreadCount"], 10);
    // Now 45 cannot advance anything: the API answers without producing.
    let late = bob.post(&path, json!({"seq": 45})).await.expect(202);
    assert_eq!(late["lastReadSeq"], 50);

    // Above last_seq: the API clamps what it accepts, and so does the flush for a
    // receipt that reaches the topic some other way.
    let clamped = bob.post(&path, json!({"seq": 999})).await.expect(202);
    assert_eq!(clamped["acceptedSeq"], 60);
    Receipts::new(&p).await.send(conv, 30, 999).await;
    records.extend(
        p.consume_until(Duration::from_secs(30), |rs| {
            reads_of(rs, 20).contains(&60) && reads_of(rs, 30).contains(&60)
        })
        .await,
    );
    assert_eq!(watermark(&p.app, conv, 30).await, 60);
    assert_eq!(
        reads_of(&records, 20),
        vec![50, 60],
        "one read.updated per real advance"
    );
    processor.stop().unwrap();
    p.cleanup().await;
}

#[tokio::test]
async fn many_receipts_from_two_members_collapse_into_one_flush_with_each_ones_max() {
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let conv = group_with_messages(&p, 40).await;
    // Produced before the processor runs: it finds them all at once, in one window.
    let receipts = Receipts::new(&p).await;
    for i in 0..200 {
        receipts.send(conv, 20, 1 + (i * 7) % 37).await;
    }
    for i in 0..150 {
        receipts.send(conv, 30, 1 + (i * 5) % 33).await;
    }
    let settings = p.receipts_settings();
    let group = settings.receipts.group.clone();
    let processor = p.start_receipts(settings);
    wait_until_consumed(&group, &p.receipts_topic, Duration::from_secs(30)).await;
    let records = p
        .consume_until(Duration::from_secs(30), |rs| {
            !reads_of(rs, 20).is_empty() && !reads_of(rs, 30).is_empty()
        })
        .await;
    assert_eq!(
        reads_of(&records, 20),
        vec![37],
        "one advance, straight to the max"
    );
    assert_eq!(reads_of(&records, 30), vec![33]);
    assert_eq!(
        (
            watermark(&p.app, conv, 20).await,
            watermark(&p.app, conv, 30).await
        ),
        (37, 33)
    );
    processor.stop().unwrap();
    p.cleanup().await;
}

#[tokio::test]
async fn a_garbage_record_goes_to_the_dead_letter_topic_and_later_receipts_still_flush() {
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let settings = p.receipts_settings();
    let group = settings.receipts.group.clone();
    let processor = p.start_receipts(settings);
    let conv = group_with_messages(&p, 5).await;
    let key = conv.to_string();

    produce_raw(&p.receipts_topic, &key, b"{\"not\": \"avro\"}").await;
    produce_raw(&p.receipts_topic, &key, &[0, 0, 0, 0]).await;
    p.app
        .user(20)
        .post(&format!("/conversations/{conv}/read"), json!({"seq": 4}))
        .await
        .expect(202);

    p.consume_until(Duration::from_secs(30), |rs| reads_of(rs, 20).contains(&4))
        .await;
    wait_until_consumed(&group, &p.receipts_topic, Duration::from_secs(30)).await;
    assert!(
        processor.is_running(),
        "a bad record does not stop the processor"
    );

    // Both bad records are in the DLQ, unchanged, with the reason in a header.
    let dlq = dlq_records(&format!("{}.dlq", p.receipts_topic), 2).await;
    assert_eq!(dlq[0].1, b"{\"not\": \"avro\"}");
    assert_eq!(dlq[1].1, [0, 0, 0, 0]);
    for (k, _, headers) in &dlq {
        assert_eq!(k, &key);
        assert!(
            headers.iter().any(|(h, v)| h == "error" && !v.is_empty()),
            "{headers:?}"
        );
        assert!(headers
            .iter()
            .any(|(h, v)| h == "source.topic" && v == &p.receipts_topic));
    }
    processor.stop().unwrap();
    p.cleanup().await;
}

/// (key, value, headers) of the first `n` records of a topic.
async fn dlq_records(topic: &str, n: usize) -> Vec<(String, Vec<u8>, Vec<(String, String)>)> {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::{Headers, Message};
    let consumer: StreamConsumer = chatpipe_core::kafka::consumer_config(
        &chatpipe_tests::stream::brokers(),
        &format!("{topic}-check"),
    )
    .create()
    .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} records on {topic}", out.len()))
            .unwrap();
        let headers = m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| {
                        (
                            h.key.to_owned(),
                            String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push((
            String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
            m.payload().unwrap_or_default().to_vec(),
            headers,
        ));
    }
    out
}
