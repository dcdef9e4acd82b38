//! Read receipts as a stream: POST /read -> chat.read-receipts -> the receipts
//! processor -> one batched, monotone UPDATE per window -> read.updated on chat.events.

use chatpipe_core::kafka::CreateGuarded;
use secrecy::ExposeSecret;
use std::time::Duration;

use chatpipe_core::kafka::FutureProducer;
use chatpipe_schemas::receipt::{ReadReceipt, ReceiptCodec};
use chatpipe_schemas::registry::Registry;
use chatpipe_schemas::{ChatEvent, ConversationId, Seq, UserId};
use chatpipe_tests::stream::{
    dlq_records, produce_raw, spawn_pipeline_with, wait_for_partitions, wait_until_consumed,
    Pipeline, Record,
};
use chatpipe_tests::{registry_url, TestApp};
use ingest_api::configuration::ReadMode;
use rdkafka::producer::FutureRecord;
use serde_json::json;

/// A line of the flush's batched UPDATE (`chatpipe_core::watermark::advance`), as
/// `pg_stat_statements` shows it.
/// The receipts flush's call of the read watermark's move (`chatpipe_core::watermark::
/// advance`), as pg_stat_statements records it (top-level statements only).
const FLUSH_STATEMENT: &str = "FROM chat_advance_reads(";

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
            ChatEvent::ReadUpdated(e) if e.user_id.get() == user => Some(e.last_read_seq.get()),
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
                .create_guarded()
                .unwrap(),
        }
    }

    async fn send(&self, conv: i64, user: i64, seq: i64) {
        let bytes = self.codec.encode(&ReadReceipt {
            conversation_id: ConversationId::of(conv),
            user_id: UserId::of(user),
            seq: Seq::of(seq),
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
    let path = format!("/v1/conversations/{conv}/read");

    let accepted = bob.post(&path, json!({"seq": 50})).await.expect(202);
    assert_eq!(accepted, json!({"conversationId": conv, "acceptedSeq": 50}));
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
    let inbox = bob.get("/v1/inbox").await.expect(200);
    assert_eq!(inbox["conversations"][0]["lastReadSeq"], 50);
    assert_eq!(inbox["conversations"][0]["unreadCount"], 10);
    // Above last_seq: the API sends it on as asked, the flush clamps it.
    let asked = bob.post(&path, json!({"seq": 999})).await.expect(202);
    assert_eq!(asked["acceptedSeq"], 999);
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
    let flushes_before = p.app.statement_calls(FLUSH_STATEMENT).await;
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
    // Counted by PostgreSQL: the processor ran the batched UPDATE exactly once.
    assert_eq!(
        p.app.statement_calls(FLUSH_STATEMENT).await - flushes_before,
        1,
        "350 receipts, one flush"
    );
    processor.stop().unwrap();
    p.cleanup().await;
}

/// A registry that answers 404 for the receipts' schema id for 30 s (restored from an
/// old backup) and then knows it: the receipt waits, is applied once the registry knows
/// the id, and nothing is dead-lettered (`registry.unknown_id_grace_ms`, 5 min).
#[tokio::test]
async fn a_schema_id_the_registry_does_not_know_yet_is_waited_for_not_dead_lettered() {
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let conv = group_with_messages(&p, 5).await;
    let registry = chatpipe_tests::forgetful_registry(Duration::from_secs(30)).await;
    let remembers = registry.remembers_at();
    let mut settings = p.receipts_settings();
    settings.registry.url = registry.url.clone();
    let group = settings.receipts.group.clone();
    let processor = p.start_receipts(settings);
    p.app
        .user(20)
        .post(&format!("/v1/conversations/{conv}/read"), json!({"seq": 4}))
        .await
        .expect(202);

    p.consume_until(Duration::from_secs(90), |rs| reads_of(rs, 20).contains(&4))
        .await;
    assert!(
        std::time::Instant::now() >= remembers,
        "applied only once the registry knew the id"
    );
    assert_eq!(watermark(&p.app, conv, 20).await, 4);
    wait_until_consumed(&group, &p.receipts_topic, Duration::from_secs(30)).await;
    let dlq = format!("{}.dlq", p.receipts_topic);
    assert_eq!(
        chatpipe_tests::stream::end_offsets(&dlq).await,
        0,
        "nothing dead-lettered"
    );
    assert!(processor.is_running());
    processor.stop().unwrap();
    p.cleanup().await;
}

/// Dead letters made on purpose (a registry without the id, no grace) come back with
/// `pipeline redrive` once the registry knows it: applied, and a second run redrives
/// nothing (the source topic got each record once).
#[tokio::test]
async fn redrive_brings_dead_letters_back_once() {
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let conv = group_with_messages(&p, 5).await;
    let registry = chatpipe_tests::forgetful_registry(Duration::from_secs(3600)).await;
    let mut settings = p.receipts_settings();
    settings.registry.url = registry.url.clone();
    settings.registry.unknown_id_grace_ms = 0;
    let group = settings.receipts.group.clone();
    let processor = p.start_receipts(settings.clone());
    for (user, seq) in [(20, 4), (30, 5)] {
        p.app
            .user(user)
            .post(
                &format!("/v1/conversations/{conv}/read"),
                json!({"seq": seq}),
            )
            .await
            .expect(202);
    }
    let dlq = format!("{}.dlq", p.receipts_topic);
    wait_until_consumed(&group, &p.receipts_topic, Duration::from_secs(60)).await;
    assert_eq!(chatpipe_tests::stream::end_offsets(&dlq).await, 2);
    assert_eq!(
        watermark(&p.app, conv, 20).await,
        0,
        "dead-lettered, not applied"
    );

    registry.remember();
    let source_before = chatpipe_tests::stream::end_offsets(&p.receipts_topic).await;
    let redrive = |settings: pipeline::settings::Settings, dlq: String| {
        tokio::task::spawn_blocking(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let args = pipeline::redrive::RedriveArgs { topic: dlq };
            rt.block_on(pipeline::redrive::run(&settings, &args))
        })
    };
    let first = redrive(settings.clone(), dlq.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first, 2);
    p.consume_until(Duration::from_secs(60), |rs| {
        reads_of(rs, 20).contains(&4) && reads_of(rs, 30).contains(&5)
    })
    .await;
    assert_eq!(
        (
            watermark(&p.app, conv, 20).await,
            watermark(&p.app, conv, 30).await
        ),
        (4, 5)
    );
    let again = redrive(settings, dlq.clone()).await.unwrap().unwrap();
    assert_eq!(again, 0, "what went back is not sent again");
    assert_eq!(
        chatpipe_tests::stream::end_offsets(&p.receipts_topic).await,
        source_before + 2
    );
    assert_eq!(chatpipe_tests::stream::end_offsets(&dlq).await, 2);
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
    // Well-framed Avro of the registered schema, but a seq no message can have.
    let out_of_range = receipt_with_raw_seq(conv, 20, -1).await;
    produce_raw(&p.receipts_topic, &key, &out_of_range).await;
    p.app
        .user(20)
        .post(&format!("/v1/conversations/{conv}/read"), json!({"seq": 4}))
        .await
        .expect(202);

    p.consume_until(Duration::from_secs(30), |rs| reads_of(rs, 20).contains(&4))
        .await;
    wait_until_consumed(&group, &p.receipts_topic, Duration::from_secs(30)).await;
    assert!(
        processor.is_running(),
        "a bad record does not stop the processor"
    );

    // The bad records are in the DLQ, unchanged, with the reason in a header.
    let dlq = dlq_records(&format!("{}.dlq", p.receipts_topic), 3).await;
    assert_eq!(dlq[0].1, b"{\"not\": \"avro\"}");
    assert_eq!(dlq[1].1, [0, 0, 0, 0]);
    assert_eq!(dlq[2].1, out_of_range);
    let reason = |i: usize| {
        dlq[i]
            .2
            .iter()
            .find(|(h, _)| h == "error")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert!(reason(2).contains("seq"), "{}", reason(2));
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

/// A receipt framed with the registered schema's id whose seq is `seq` as given, in
/// range or not: what a buggy or hostile producer could write.
async fn receipt_with_raw_seq(conv: i64, user: i64, seq: i64) -> Vec<u8> {
    use apache_avro::types::Value;
    let registry = Registry::new(&registry_url(), Duration::from_secs(5)).unwrap();
    let valid = registry
        .receipt_codec()
        .await
        .unwrap()
        .encode(&ReadReceipt {
            conversation_id: ConversationId::of(conv),
            user_id: UserId::of(user),
            seq: Seq::of(1),
            at: chrono::Utc::now(),
        });
    let schema_id = u32::from_be_bytes(valid[1..5].try_into().unwrap());
    let contract = chatpipe_schemas::contract::READ_RECEIPTS;
    chatpipe_schemas::avro::Framed::new(contract.schema, schema_id).encode(Value::Record(vec![
        ("conversationId".into(), Value::Long(conv)),
        ("userId".into(), Value::Long(user)),
        ("seq".into(), Value::Long(seq)),
        ("at".into(), Value::TimestampMicros(0)),
    ]))
}

/// `pipeline receipts` as a process of its own, configured for this namespace.
fn processor_process(p: &Pipeline, extra: &[(&str, &str)]) -> tokio::process::Child {
    let bin = std::env::var("CHATPIPE_PIPELINE_BIN").unwrap_or_else(|_| {
        panic!("CHATPIPE_PIPELINE_BIN is not set: run the suite with scripts/test, which builds `pipeline`")
    });
    let s = p.receipts_settings();
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("receipts")
        .env("KAFKA_BROKERS", &s.kafka.brokers)
        .env("SCHEMA_REGISTRY_URL", &s.registry.url)
        .env("DATABASE_URL", s.database.url.expose_secret())
        .env(
            "CHATPIPE_REGISTRY__EVENTS_SUBJECT",
            &s.registry.events_subject,
        )
        .env("CHATPIPE_RECEIPTS__TOPIC", &s.receipts.topic)
        .env("CHATPIPE_RECEIPTS__GROUP", &s.receipts.group)
        .env("CHATPIPE_HTTP__METRICS_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().expect("pipeline receipts starts")
}

async fn read_updated_rows(app: &TestApp, user: i64) -> Vec<i64> {
    let payloads: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT payload FROM outbox WHERE type = 'read.updated' ORDER BY created_at, ctid",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    payloads
        .iter()
        .filter_map(|b| match app.codec.decode(b).unwrap() {
            ChatEvent::ReadUpdated(e) if e.user_id.get() == user => Some(e.last_read_seq.get()),
            _ => None,
        })
        .collect()
}

/// Killed between the database COMMIT and the offset commit, the processor reads the same
/// receipts again after a restart: the monotone UPDATE moves nothing and emits nothing.
#[tokio::test]
async fn sigkill_after_the_db_commit_and_before_the_offset_commit_changes_nothing_on_replay() {
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let conv = group_with_messages(&p, 10).await;
    p.app
        .user(20)
        .post(&format!("/v1/conversations/{conv}/read"), json!({"seq": 7}))
        .await
        .expect(202);
    let keep_rows = ("CHATPIPE_OUTBOX__RETAIN_UNTIL_CONFIRMED", "true");

    let mut doomed = processor_process(
        &p,
        &[keep_rows, ("CHATPIPE_FAULT__KILL_AFTER_DB_COMMIT", "true")],
    );
    let status = tokio::time::timeout(Duration::from_secs(60), doomed.wait())
        .await
        .expect("it dies")
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status:?}");
    assert_eq!(
        watermark(&p.app, conv, 20).await,
        7,
        "the flush was committed"
    );
    assert_eq!(read_updated_rows(&p.app, 20).await, vec![7]);
    let group = p.receipts_settings().receipts.group;
    assert!(
        !chatpipe_tests::stream::is_consumed(&group, &p.receipts_topic).await,
        "died before committing the offsets"
    );

    let mut restarted = processor_process(&p, &[keep_rows]);
    wait_until_consumed(&group, &p.receipts_topic, Duration::from_secs(60)).await;
    assert_eq!(watermark(&p.app, conv, 20).await, 7);
    assert_eq!(
        read_updated_rows(&p.app, 20).await,
        vec![7],
        "no second read.updated for the same advance"
    );
    restarted.kill().await.unwrap();
    p.cleanup().await;
}

/// Two processors in one group; one leaves mid-stream (flushing what it holds). Every
/// member ends at the highest seq it sent, and no watermark ever went backwards.
#[tokio::test]
async fn two_processors_one_stopped_lose_nothing_and_regress_nothing() {
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let mut conversations = Vec::new();
    for i in 0..12 {
        let conv = p.app.user(100 + i).create_group(&[1, 2]).await;
        for _ in 0..30 {
            p.app.user(100 + i).send_message(conv, "x").await;
        }
        conversations.push(conv);
    }
    let mut settings = p.receipts_settings();
    settings.outbox.retain_until_confirmed = true;
    let mut a = Some(p.start_receipts(settings.clone()));
    let b = p.start_receipts(settings.clone());
    // A rebalance needs two members: both hold some of the six partitions first.
    wait_for_partitions(
        &[&a.as_ref().unwrap().readiness, &b.readiness],
        "receipts",
        Duration::from_secs(60),
        |held| !held.is_empty(),
    )
    .await;
    let receipts = Receipts::new(&p).await;
    let mut highest = std::collections::HashMap::new();
    for round in 0..60i64 {
        for &conv in &conversations {
            for user in [1, 2] {
                // Mostly forwards, sometimes a stale device going backwards.
                let seq = if round % 7 == 3 {
                    1 + round / 4
                } else {
                    1 + round / 2
                };
                receipts.send(conv, user, seq).await;
                let h = highest.entry((conv, user)).or_insert(0);
                *h = (*h).max(seq.min(30));
            }
        }
        if round == 25 {
            let leaving = a.take().expect("running");
            let (theirs, ours) = (leaving.partitions(), b.partitions());
            assert!(
                !theirs.is_empty() && !ours.is_empty(),
                "both hold partitions when one leaves: {theirs:?} and {ours:?}"
            );
            leaving.stop().expect("the first processor leaves cleanly");
            eprintln!("the processor holding {theirs:?} left; the other held {ours:?}");
        }
    }
    // The one left takes over every partition.
    wait_for_partitions(
        &[&b.readiness],
        "receipts",
        Duration::from_secs(60),
        |held| held == [0, 1, 2, 3, 4, 5],
    )
    .await;
    wait_until_consumed(
        &settings.receipts.group,
        &p.receipts_topic,
        Duration::from_secs(60),
    )
    .await;
    assert!(b.is_running());
    for (&(conv, user), &seq) in &highest {
        assert_eq!(
            watermark(&p.app, conv, user).await,
            seq,
            "conversation {conv}, user {user}"
        );
    }
    // Each member's read.updated events only ever go up.
    let payloads: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT payload FROM outbox WHERE type = 'read.updated' ORDER BY created_at, ctid",
    )
    .fetch_all(&p.app.pool)
    .await
    .unwrap();
    let mut last = std::collections::HashMap::new();
    for bytes in payloads {
        if let ChatEvent::ReadUpdated(e) = p.app.codec.decode(&bytes).unwrap() {
            let prev = last
                .insert((e.conversation_id, e.user_id), e.last_read_seq)
                .unwrap_or(chatpipe_schemas::Watermark::ZERO);
            assert!(e.last_read_seq > prev, "{e:?} after {prev}");
        }
    }
    b.stop().unwrap();
    p.cleanup().await;
}

/// Delivered ticks in stream mode: POST …/delivered answers 202 and the acks reader
/// moves the delivery watermark (never below the read one), writing delivery.updated to
/// chat.events; an ack of a non-member in the same window is dropped.
#[tokio::test]
async fn a_delivery_ack_answers_202_and_the_acks_reader_moves_the_delivery_watermark() {
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let settings = p.receipts_settings();
    let acks_group = settings.receipts.acks_group.clone();
    let _processor = p.start_receipts(settings);
    let conv = group_with_messages(&p, 10).await;
    let path = format!("/v1/conversations/{conv}/delivered");
    let accepted = p
        .app
        .user(20)
        .post(&path, json!({"seq": 8}))
        .await
        .expect(202);
    assert_eq!(accepted, json!({"conversationId": conv, "acceptedSeq": 8}));
    // A stranger's ack, written to the topic as any producer could.
    let mut acks = Receipts::new(&p).await;
    acks.topic = p.acks_topic.clone();
    acks.codec = Registry::new(&registry_url(), Duration::from_secs(5))
        .unwrap()
        .receipt_codec_for(&format!("{}-value", p.acks_topic))
        .await
        .unwrap();
    acks.send(conv, 99, 9).await;

    let records = p
        .consume_until(Duration::from_secs(30), |rs| {
            rs.iter()
                .any(|r| matches!(&r.event, ChatEvent::DeliveryUpdated(d) if d.user_id.get() == 20))
        })
        .await;
    wait_until_consumed(&acks_group, &p.acks_topic, Duration::from_secs(30)).await;
    let moved: Vec<(i64, i64)> = records
        .iter()
        .filter_map(|r| match &r.event {
            ChatEvent::DeliveryUpdated(d) => Some((d.user_id.get(), d.last_delivered_seq.get())),
            _ => None,
        })
        .collect();
    assert_eq!(moved, vec![(20, 8)], "the stranger's ack moved nothing");
    let (read, delivered): (i64, i64) = sqlx::query_as(
        "SELECT last_read_seq, last_delivered_seq FROM conversation_member
          WHERE conversation_id = $1 AND user_id = 20",
    )
    .bind(conv)
    .fetch_one(&p.app.pool)
    .await
    .unwrap();
    assert_eq!((read, delivered), (0, 8));
    assert_eq!(
        p.app
            .count("SELECT count(*) FROM conversation_member WHERE user_id = 99")
            .await,
        0
    );
    p.cleanup().await;
}
