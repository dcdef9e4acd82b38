//! The drill's own reader of chat.events: what reached the topic, from the drill's start.

use chatpipe_core::kafka::CreateGuarded;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chatpipe_core::kafka::BaseConsumer;
use chatpipe_schemas::registry::{EventDecoder, Registry};
use chatpipe_schemas::ChatEvent;
use rdkafka::consumer::Consumer;
use rdkafka::{Message, Offset, TopicPartitionList};

/// What the topic carried of the drill's conversations.
#[derive(Default)]
pub struct Topic {
    /// (conversation, seq) -> how many times it was read.
    pub messages: HashMap<(i64, i64), u32>,
    /// (conversation, seq, clientMsgId) of every message.new read: a phantom (an event of
    /// a transaction the new primary never had) is one PostgreSQL has no such row for.
    pub sent: BTreeSet<(i64, i64, uuid::Uuid)>,
    /// Highest `read.updated` per (conversation, user), and how often one went lower.
    pub watermarks: HashMap<(i64, i64), i64>,
    pub regressions: u64,
    /// Records that did not decode within two minutes of retries.
    pub undecodable: u64,
    /// When each record arrived here.
    pub arrivals: Vec<Instant>,
    /// When each (conversation, seq) first arrived here.
    pub first_seen: HashMap<(i64, i64), Instant>,
}

impl Topic {
    /// The longest an acknowledged message of `acks` waited from its 201 to its arrival
    /// here (those not arrived yet are not counted).
    pub fn slowest(&self, acks: &[super::load::Ack]) -> Option<Duration> {
        acks.iter()
            .filter_map(|a| {
                let seen = self.first_seen.get(&(a.conversation, a.seq))?;
                Some(seen.saturating_duration_since(a.at))
            })
            .max()
    }

    /// How many of `acks` took longer than `bound` from their 201 to their arrival here.
    pub fn later_than(&self, acks: &[super::load::Ack], bound: Duration) -> u64 {
        acks.iter()
            .filter(|a| {
                self.first_seen
                    .get(&(a.conversation, a.seq))
                    .is_some_and(|seen| seen.saturating_duration_since(a.at) > bound)
            })
            .count() as u64
    }

    pub fn first_after(&self, t: Instant) -> Option<Instant> {
        self.arrivals.iter().filter(|a| **a > t).min().copied()
    }

    /// Seqs missing below the highest one of each of `conversations`.
    pub fn gaps(&self, conversations: &BTreeSet<i64>) -> u64 {
        let mut by_conversation: BTreeMap<i64, (i64, u64)> = BTreeMap::new();
        for (c, s) in self
            .messages
            .keys()
            .filter(|(c, _)| conversations.contains(c))
        {
            let e = by_conversation.entry(*c).or_default();
            e.0 = e.0.max(*s);
            e.1 += 1;
        }
        by_conversation
            .values()
            .map(|(max, n)| (*max as u64).saturating_sub(*n))
            .sum()
    }

    pub fn duplicates(&self, conversations: &BTreeSet<i64>) -> u64 {
        self.messages
            .iter()
            .filter(|((c, _), _)| conversations.contains(c))
            .map(|(_, n)| u64::from(n - 1))
            .sum()
    }
}

/// Reads every partition of `topic` from its end as of now, on a thread, until `stop`.
pub fn follow(
    brokers: &str,
    registry_url: &str,
    topic: &str,
    stop: Arc<AtomicBool>,
) -> Arc<Mutex<Topic>> {
    let consumer: BaseConsumer = chatpipe_core::kafka::client_config(brokers)
        .set("group.id", "chatpipe-drill-reader")
        .set("enable.auto.commit", "false")
        .create_guarded()
        .expect("Kafka consumer");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("chat.events metadata");
    let mut tpl = TopicPartitionList::new();
    for p in metadata.topics()[0].partitions() {
        let (_, high) = consumer
            .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
            .expect("watermarks");
        tpl.add_partition_offset(topic, p.id(), Offset::Offset(high))
            .unwrap();
    }
    consumer.assign(&tpl).expect("assign");
    let decoder: EventDecoder = Registry::new(registry_url, Duration::from_secs(5))
        .unwrap()
        .event_decoder();
    let seen = Arc::new(Mutex::new(Topic::default()));
    let out = seen.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let Some(bytes) = m.payload() else { continue };
            // The registry may be down (a drill fault): retry for up to two minutes.
            let mut event = None;
            for _ in 0..240 {
                match rt.block_on(decoder.decode(bytes)) {
                    Ok(e) => {
                        event = Some(e);
                        break;
                    }
                    Err(_) if stop.load(Ordering::Relaxed) => return,
                    Err(_) => std::thread::sleep(Duration::from_millis(500)),
                }
            }
            let mut t = seen.lock().unwrap();
            let Some(event) = event else {
                t.undecodable += 1;
                continue;
            };
            let now = Instant::now();
            t.arrivals.push(now);
            match event {
                ChatEvent::MessageNew(e) => {
                    let key = (e.conversation_id.get(), e.seq.get());
                    *t.messages.entry(key).or_default() += 1;
                    t.sent.insert((key.0, key.1, e.client_msg_id));
                    t.first_seen.entry(key).or_insert(now);
                }
                ChatEvent::ReadUpdated(e) => {
                    let key = (e.conversation_id.get(), e.user_id.get());
                    let now = e.last_read_seq.get();
                    match t.watermarks.get(&key) {
                        Some(was) if now < *was => t.regressions += 1,
                        _ => {
                            t.watermarks.insert(key, now);
                        }
                    }
                }
                _ => {}
            }
        }
    });
    out
}
