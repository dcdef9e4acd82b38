//! What the benchmark binaries share: REST calls that time the commit, a reader of
//! chat.events that notes when each message lands there, Kafka's own record counts
//! (offsets), the machine, and the summary of repeated runs.

use chatpipe_core::kafka::CreateGuarded;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chatpipe_core::kafka::{BaseConsumer, StreamConsumer};
use chatpipe_schemas::registry::Registry;
use chatpipe_schemas::{ChatEvent, ConversationId, Seq, UserId, Watermark};
use rdkafka::consumer::Consumer;
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
    let mut assignment = TopicPartitionList::new();
    for (p, high) in end_offsets(brokers, topic)?.into_iter().enumerate() {
        assignment.add_partition_offset(topic, p as i32, Offset::Offset(high))?;
    }
    let consumer: StreamConsumer = config.create_guarded()?;
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

/// POSTs `body` to `path` (`/v1/conversations` or `/v1/direct`); returns the conversation id.
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
    create_conversation(http, base, "/v1/conversations", token, body).await
}

/// The direct conversation of the caller and `peer`; returns its id.
pub async fn create_direct(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    peer: i64,
) -> anyhow::Result<i64> {
    create_conversation(http, base, "/v1/direct", token, json!({"peerId": peer})).await
}

/// Sends one message; returns its seq and the moment the 201 (the commit) arrived.
pub async fn send(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    conv: i64,
) -> anyhow::Result<(i64, Instant)> {
    let res = http
        .post(format!("{base}/v1/conversations/{conv}/messages"))
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
    use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
    let producer: ThreadedProducer<chatpipe_core::kafka::Guarded> =
        chatpipe_core::kafka::producer_config(brokers)
            .set("linger.ms", "20")
            .set("batch.num.messages", "10000")
            .set("queue.buffering.max.messages", "500000")
            .create_guarded()
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
            mentions: Vec::new(),
            thread_root_seq: None,
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
                role: if user == UserId::of(1) {
                    chatpipe_schemas::Role::Admin
                } else {
                    chatpipe_schemas::Role::Member
                },
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
        .create_guarded()
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

/// Writes a benchmark's JSON report to `out` (its directory made if missing) and says
/// where.
pub fn write_report(out: &str, report: &serde_json::Value) -> anyhow::Result<()> {
    if let Some(dir) = std::path::Path::new(out).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_vec_pretty(report)?)?;
    println!("report: {out}");
    Ok(())
}

/// Every partition's end offset (high watermark) of `topic`, in partition order: how many
/// records each has ever held. Blocking.
pub fn end_offsets(brokers: &str, topic: &str) -> anyhow::Result<Vec<i64>> {
    let probe: BaseConsumer = chatpipe_core::kafka::client_config(brokers).create_guarded()?;
    let metadata = probe.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = metadata
        .topics()
        .first()
        .context("topic metadata")?
        .partitions()
        .len() as i32;
    anyhow::ensure!(partitions > 0, "{topic} has no partitions");
    (0..partitions)
        .map(|p| Ok(probe.fetch_watermarks(topic, p, Duration::from_secs(10))?.1))
        .collect()
}

/// The records of `topic` on the broker now (the sum of its end offsets). Blocking.
pub fn records_on(brokers: &str, topic: &str) -> anyhow::Result<i64> {
    Ok(end_offsets(brokers, topic)?.iter().sum())
}

/// How much of a topic a consumer group has consumed, by Kafka's count: the group's
/// committed offsets against the topic's end offsets. It never joins the group.
pub struct GroupProgress {
    client: BaseConsumer,
    topic: String,
    partitions: i32,
}

impl GroupProgress {
    pub fn new(brokers: &str, group: &str, topic: &str) -> anyhow::Result<Self> {
        let partitions = end_offsets(brokers, topic)?.len() as i32;
        Ok(Self {
            client: chatpipe_core::kafka::consumer_config(brokers, group).create_guarded()?,
            topic: topic.to_owned(),
            partitions,
        })
    }

    /// (records committed, records not yet committed). A partition without a commit
    /// counts as unread. Blocking.
    pub fn read(&self) -> anyhow::Result<(i64, i64)> {
        let mut wanted = TopicPartitionList::new();
        for p in 0..self.partitions {
            wanted.add_partition(&self.topic, p);
        }
        let committed = self
            .client
            .committed_offsets(wanted, Duration::from_secs(10))?;
        let (mut done, mut left) = (0, 0);
        for p in 0..self.partitions {
            let (_, end) = self
                .client
                .fetch_watermarks(&self.topic, p, Duration::from_secs(10))?;
            let at = match committed.find_partition(&self.topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => 0,
            };
            done += at;
            left += end - at;
        }
        Ok((done, left))
    }
}

/// The machine a report was measured on.
pub fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned());
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": cpu,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "memory_kb": read("/proc/meminfo").lines().next().unwrap_or("").split_whitespace().nth(1),
    })
}

/// The figures of repeated runs, each kept per run and summarised as its median and its
/// spread (min–max), in the order they were first recorded.
#[derive(Debug, Default)]
pub struct Runs {
    figures: Vec<(String, Vec<f64>)>,
}

impl Runs {
    pub fn record(&mut self, name: &str, value: f64) {
        match self.figures.iter_mut().find(|(n, _)| n == name) {
            Some((_, values)) => values.push(value),
            None => self.figures.push((name.to_owned(), vec![value])),
        }
    }

    /// (median, min, max) of `name`; `None` when it was never recorded.
    pub fn summary(&self, name: &str) -> Option<(f64, f64, f64)> {
        let (_, values) = self.figures.iter().find(|(n, _)| n == name)?;
        Some(summarise(values))
    }

    pub fn json(&self) -> serde_json::Value {
        self.figures
            .iter()
            .map(|(name, values)| {
                let (median, min, max) = summarise(values);
                let v = json!({"median": median, "min": min, "max": max, "runs": values});
                (name.clone(), v)
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// One line per figure: median and spread over the runs.
    pub fn print(&self) {
        let runs = self.figures.first().map_or(0, |(_, v)| v.len());
        println!("over {runs} runs: median (min–max)");
        for (name, values) in &self.figures {
            let (median, min, max) = summarise(values);
            println!("  {name:<40} {median:>12.2}  ({min:.2}–{max:.2})");
        }
    }
}

fn summarise(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    (median, sorted[0], sorted[n - 1])
}
