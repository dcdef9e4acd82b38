//! What the benchmark binaries share: REST calls that time the commit, and a reader of
//! chat.events that notes when each message lands there.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chatpipe_schemas::registry::Registry;
use chatpipe_schemas::{ChatEvent, ConversationId, Seq, UserId, Watermark};
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde_json::json;
use tokio::sync::Mutex;

/// Where the benchmarks find Kafka and the registry (the stack's defaults).
#[derive(clap::Args, Debug, Clone)]
pub struct StackArgs {
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,
    #[arg(
        long,
        env = "SCHEMA_REGISTRY_URL",
        default_value = "http://127.0.0.1:8081/apis/ccompat/v7"
    )]
    pub registry: String,
}

/// When each (conversation, seq) was read from chat.events.
pub type Arrivals = Arc<Mutex<HashMap<(i64, i64), Instant>>>;

/// Reads `topic` from its current end (assigned explicitly, so nothing sent after this
/// returns can be missed) and notes when each message.new arrives.
pub async fn start_event_reader(
    brokers: &str,
    registry: &str,
    topic: &str,
    arrivals: Arrivals,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let config = {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", brokers)
            .set("group.id", format!("bench-{}", uuid::Uuid::new_v4()))
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "5");
        c
    };
    let probe: BaseConsumer = config.create()?;
    let metadata = probe.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = metadata
        .topics()
        .first()
        .context("topic metadata")?
        .partitions()
        .len() as i32;
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        let (_, high) = probe.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        assignment.add_partition_offset(topic, p, Offset::Offset(high))?;
    }
    let consumer: StreamConsumer = config.create()?;
    consumer.assign(&assignment)?;
    let decoder = Registry::new(registry, Duration::from_secs(5))?.event_decoder();
    Ok(tokio::spawn(async move {
        loop {
            let Ok(m) = consumer.recv().await else {
                continue;
            };
            let now = Instant::now();
            if let Some(Ok(ChatEvent::MessageNew(e))) = match m.payload() {
                Some(bytes) => Some(decoder.decode(bytes).await),
                None => None,
            } {
                arrivals
                    .lock()
                    .await
                    .entry((e.conversation_id.get(), e.seq.get()))
                    .or_insert(now);
            }
        }
    }))
}

/// Waits until `key` has arrived; when it did.
pub async fn wait_for(
    arrivals: &Arrivals,
    key: (i64, i64),
    limit: Duration,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(at) = arrivals.lock().await.get(&key) {
            return Ok(*at);
        }
        if Instant::now() > deadline {
            bail!("{key:?} not on the topic after {limit:?}");
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// POSTs `body` to `path` (`/conversations` or `/direct`); returns the conversation id.
async fn create_conversation(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    token: &str,
    body: serde_json::Value,
) -> anyhow::Result<i64> {
    let res = http
        .post(format!("{base}{path}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await?;
    if res.status() != 201 && res.status() != 200 {
        bail!(
            "creating a conversation: {} {}",
            res.status(),
            res.text().await.unwrap_or_default()
        );
    }
    res.json::<serde_json::Value>().await?["conversationId"]
        .as_i64()
        .context("conversationId")
}

/// Creates a group of the caller and `members`; returns its id.
pub async fn create_group(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    members: &[i64],
) -> anyhow::Result<i64> {
    let body = json!({"type": "GROUP", "memberIds": members});
    create_conversation(http, base, "/conversations", token, body).await
}

/// The direct conversation of the caller and `peer`; returns its id.
pub async fn create_direct(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    peer: i64,
) -> anyhow::Result<i64> {
    create_conversation(http, base, "/direct", token, json!({"peerId": peer})).await
}

/// Sends one message; returns its seq and the moment the 201 (the commit) arrived.
pub async fn send(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    conv: i64,
) -> anyhow::Result<(i64, Instant)> {
    let res = http
        .post(format!("{base}/conversations/{conv}/messages"))
        .bearer_auth(token)
        .json(&json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "latency probe"}))
        .send()
        .await?;
    let at = Instant::now();
    if res.status() != 201 {
        bail!(
            "send: {} {}",
            res.status(),
            res.text().await.unwrap_or_default()
        );
    }
    let seq = res.json::<serde_json::Value>().await?["seq"]
        .as_i64()
        .context("seq")?;
    Ok((seq, at))
}

/// Synthetic conversations get ids far above the real ones the API hands out.
pub const SYNTHETIC_FIRST_ID: i64 = 1_000_000;

/// Produces `events` (conversation id, framed value) to `topic`, keyed by conversation
/// id (murmur2, as Debezium partitions), and waits for every ack. Blocking.
pub fn produce_events(
    brokers: &str,
    topic: &str,
    events: impl Iterator<Item = (i64, Vec<u8>)>,
) -> u64 {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let producer: ThreadedProducer<DefaultProducerContext> =
        chatpipe_core::kafka::producer_config(brokers)
            .set("linger.ms", "20")
            .set("batch.num.messages", "10000")
            .set("queue.buffering.max.messages", "500000")
            .create()
            .expect("Kafka producer");
    let mut n = 0;
    for (conversation, value) in events {
        let key = conversation.to_string();
        let mut record = BaseRecord::to(topic).key(&key).payload(&value);
        while let Err((_, back)) = producer.send(record) {
            // The local queue is full: let the broker catch up.
            producer.poll(Duration::from_millis(10));
            record = back;
        }
        n += 1;
    }
    producer.flush(Duration::from_secs(300)).expect("flushing");
    n
}

/// `history` old messages spread over `live` synthetic conversations (a history no
/// fanout needs to read).
pub fn old_messages(
    codec: &chatpipe_schemas::avro::EventCodec,
    history: i64,
    live: i64,
    at: chrono::DateTime<chrono::Utc>,
) -> impl Iterator<Item = (i64, Vec<u8>)> + '_ {
    (0..history).map(move |i| {
        let conversation = SYNTHETIC_FIRST_ID + i % live;
        let event = ChatEvent::MessageNew(chatpipe_schemas::MessageNew {
            conversation_id: ConversationId::of(conversation),
            seq: Seq::of(i / live + 1),
            sender_id: UserId::of(1),
            client_msg_id: uuid::Uuid::nil(),
            body: "old".into(),
            created_at: at,
        });
        (conversation, codec.encode(&event))
    })
}

/// `live` synthetic groups, each created with members 1 and `2 + i`: three membership
/// events a conversation.
pub fn live_groups(
    codec: &chatpipe_schemas::avro::EventCodec,
    live: i64,
    at: chrono::DateTime<chrono::Utc>,
) -> impl Iterator<Item = (i64, Vec<u8>)> + '_ {
    (0..live).flat_map(move |i| {
        let conversation = SYNTHETIC_FIRST_ID + i;
        let created = ChatEvent::ConversationCreated(chatpipe_schemas::ConversationCreated {
            conversation_id: ConversationId::of(conversation),
            conversation_type: "GROUP".into(),
            title: None,
            created_by: UserId::of(1),
            occurred_at: at,
        });
        let joined = |user| {
            ChatEvent::MemberJoined(chatpipe_schemas::MemberJoined {
                conversation_id: ConversationId::of(conversation),
                user_id: user,
                last_read_seq: Watermark::ZERO,
                added_by: UserId::of(1),
                occurred_at: at,
            })
        };
        [created, joined(UserId::of(1)), joined(UserId::of(2 + i))]
            .map(|e| (conversation, codec.encode(&e)))
    })
}

/// Commits `group`'s offsets at the current end of every partition of `topic`: the group
/// starts after what is there (as if it had processed it long ago).
pub fn start_group_at_end(brokers: &str, group: &str, topic: &str, partitions: i32) {
    use rdkafka::consumer::CommitMode;
    let committer: BaseConsumer = chatpipe_core::kafka::consumer_config(brokers, group)
        .create()
        .expect("Kafka consumer");
    let mut ends = TopicPartitionList::new();
    for p in 0..partitions {
        let (_, high) = committer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .expect("watermarks");
        ends.add_partition_offset(topic, p, Offset::Offset(high))
            .expect("offset");
    }
    committer
        .commit(&ends, CommitMode::Sync)
        .expect("committing the group's start");
}
