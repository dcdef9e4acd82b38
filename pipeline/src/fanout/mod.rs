//! The fanout processor (`pipeline fanout`): consumes chat.events, joins each event with
//! the conversation's members ([`members`], kept from the membership events) and with
//! the presence table ([`online`], the compacted chat.presence read in full), and
//! produces fanout lists to chat.deliveries, one record per gateway on that gateway's
//! partition ([`plan`]).
//!
//! Pushes are a shortcut, never the only copy: clients catch up over REST. So the
//! guarantees are at least once while the processor runs (offsets are committed after
//! the lists are acknowledged), events older than `max_age_ms` are not pushed at all
//! (a new group, or a long outage, does not flood clients with history), and a list
//! whose produce fails is counted and dropped. Undecodable records go to `<topic>.dlq`.

pub mod members;
pub mod online;
pub mod plan;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_schemas::avro::{from_value, read_with};
use chatpipe_schemas::delivery::DeliveryCodec;
use chatpipe_schemas::presence::{parse_key, Presence};
use chatpipe_schemas::ChatEvent;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, FutureProducer, FutureRecord, Producer, ProducerContext,
    ThreadedProducer,
};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use sqlx::PgPool;

use crate::settings::{FanoutSettings, Settings};
use crate::streams::{processor_runtime, record_lag, WriterSchemas};
use members::Members;
use online::{Gateway, Online};
use plan::{Coalescer, Routed};

/// What the processor knows, for tests and operators: the presence table it joins with.
#[derive(Debug, Default)]
pub struct Status {
    online: Mutex<Online>,
    restored_records: AtomicU64,
    membership_loads: AtomicU64,
}

impl Status {
    /// chat.events records read to rebuild membership since start.
    pub fn restored_records(&self) -> u64 {
        self.restored_records.load(Ordering::Relaxed)
    }

    /// Conversations whose members were loaded from PostgreSQL since start.
    pub fn membership_loads(&self) -> u64 {
        self.membership_loads.load(Ordering::Relaxed)
    }

    /// How many of `users` the processor sees online now.
    pub fn online_among(&self, users: &[i64]) -> usize {
        let now = now_ms();
        let online = self.online.lock().expect("presence lock");
        users.iter().filter(|u| online.is_online(**u, now)).count()
    }
}

/// Presence records applied between two polls of chat.events.
const PRESENCE_BATCH: usize = 256;

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

struct FanoutContext {
    topic: String,
    revoked: Mutex<Vec<i32>>,
}

impl ClientContext for FanoutContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        record_lag(&statistics, &self.topic, "fanout_consumer_lag");
    }
}

impl ConsumerContext for FanoutContext {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(revoked) = rebalance {
            let mut list = self.revoked.lock().expect("revoked lock");
            list.extend(revoked.elements().iter().map(|e| e.partition()));
        }
    }
}

/// Fanout lists produced and not yet acknowledged, by sequence number. Offsets are
/// committed once every list produced before them has its delivery report, so the loop
/// never waits for the broker (a blocking flush stalled it for up to 250 ms).
#[derive(Default)]
struct Unacked(Mutex<BTreeSet<u64>>);

impl Unacked {
    fn add(&self, n: u64) {
        self.0.lock().expect("unacked lock").insert(n);
    }

    fn done(&self, n: u64) {
        self.0.lock().expect("unacked lock").remove(&n);
    }

    /// The oldest list still waiting, and how many wait.
    fn oldest(&self) -> (Option<u64>, usize) {
        let set = self.0.lock().expect("unacked lock");
        (set.first().copied(), set.len())
    }
}

/// Delivery reports: each list leaves the unacked set. A list the broker refused (a
/// gateway partition that does not exist, a broker down past the timeout) is counted
/// and dropped: pushes are best effort, clients catch up over REST.
struct DeliveryReport {
    unacked: Arc<Unacked>,
}

impl ClientContext for DeliveryReport {}

impl ProducerContext for DeliveryReport {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, n: usize) {
        self.unacked.done(n as u64);
        if let Err((err, _)) = result {
            metrics::counter!("fanout_produce_errors_total").increment(1);
            tracing::warn!("a fanout list was not delivered: {err}");
        }
    }
}

/// Runs the fanout processor until `stop` is set. Blocking: call it from a thread.
pub fn run(settings: &Settings, stop: Arc<AtomicBool>, status: Arc<Status>) -> anyhow::Result<()> {
    let (rt, registry) = processor_runtime(settings)?;
    let cfg = settings.fanout.clone();
    let (codec, pool) = rt.block_on(async {
        let codec = registry
            .delivery_codec_for(&format!("{}-value", cfg.deliveries_topic))
            .await?;
        let pool = settings.database.connect().await?;
        anyhow::Ok((codec, pool))
    })?;
    let brokers = &settings.kafka.brokers;
    let consumer: BaseConsumer<FanoutContext> =
        chatpipe_core::kafka::consumer_config(brokers, &cfg.group)
            .set("statistics.interval.ms", "5000")
            .create_with_context(FanoutContext {
                topic: cfg.events_topic.clone(),
                revoked: Mutex::default(),
            })
            .context("creating the chat.events consumer")?;
    consumer
        .subscribe(&[&cfg.events_topic])
        .context("subscribing")?;
    let unacked = Arc::new(Unacked::default());
    let producer: ThreadedProducer<DeliveryReport> = chatpipe_core::kafka::producer_config(brokers)
        .set("linger.ms", "1")
        .set(
            "queue.buffering.max.messages",
            cfg.produce_queue_max.to_string(),
        )
        .create_with_context(DeliveryReport {
            unacked: unacked.clone(),
        })
        .context("creating the deliveries producer")?;
    let dlq: FutureProducer = chatpipe_core::kafka::producer_config(brokers)
        .create()
        .context("creating the DLQ producer")?;

    let mut fanout = Fanout {
        schemas: WriterSchemas::new(registry.event_decoder(), rt.handle().clone()),
        rt,
        pool,
        codec,
        producer,
        dlq,
        dlq_topic: format!("{}.dlq", cfg.events_topic),
        members: Members::default(),
        restored: HashSet::new(),
        coalescer: Coalescer::default(),
        offsets: HashMap::new(),
        unacked,
        sent: 0,
        pending: VecDeque::new(),
        status,
        cfg,
        brokers: brokers.clone(),
    };
    let presence = fanout.presence_consumer()?;
    fanout.catch_up_presence(&presence)?;
    tracing::info!(topic = %fanout.cfg.events_topic, group = %fanout.cfg.group, "fanout running");

    let poll = Duration::from_millis(fanout.cfg.max_poll_ms);
    let tick = Duration::from_millis(fanout.cfg.tick_ms);
    let mut next_tick = Instant::now() + tick;
    while !stop.load(Ordering::Relaxed) {
        let more_presence = fanout.take_presence(&presence, Duration::ZERO);
        let revoked = std::mem::take(&mut *consumer.context().revoked.lock().expect("lock"));
        if !revoked.is_empty() {
            fanout.members.drop_partitions(&revoked);
            for p in &revoked {
                fanout.restored.remove(p);
                fanout.offsets.remove(p);
            }
            for (_, offsets) in &mut fanout.pending {
                offsets.retain(|p, _| !revoked.contains(p));
            }
        }
        match consumer.poll(if more_presence { Duration::ZERO } else { poll }) {
            Some(Ok(message)) => fanout.take_in(&message)?,
            Some(Err(err)) => {
                metrics::counter!("fanout_consumer_errors_total").increment(1);
                tracing::warn!("consumer: {err}");
            }
            None => {}
        }
        if Instant::now() >= next_tick {
            fanout.tick(&consumer, false);
            next_tick = Instant::now() + tick;
        }
    }
    // Leaving: what was fanned out is committed before the group hears of it.
    fanout.tick(&consumer, true);
    consumer.unsubscribe();
    Ok(())
}

/// The offsets of `pending` whose lists are all acknowledged (no list older than their
/// snapshot is still waiting: `oldest` is the oldest unacknowledged list), merged to the
/// highest per partition and taken out of `pending`.
fn releasable(
    pending: &mut VecDeque<(u64, HashMap<i32, i64>)>,
    oldest: Option<u64>,
) -> HashMap<i32, i64> {
    let mut ready: HashMap<i32, i64> = HashMap::new();
    while let Some((before, _)) = pending.front() {
        if oldest.is_some_and(|o| o < *before) {
            break;
        }
        let (_, offsets) = pending.pop_front().expect("front exists");
        for (p, o) in offsets {
            let e = ready.entry(p).or_insert(o);
            *e = (*e).max(o);
        }
    }
    ready
}

struct Fanout {
    rt: tokio::runtime::Runtime,
    schemas: WriterSchemas,
    pool: PgPool,
    codec: DeliveryCodec,
    producer: ThreadedProducer<DeliveryReport>,
    /// Dead letters, and presence tombstones.
    dlq: FutureProducer,
    dlq_topic: String,
    members: Members,
    /// Partitions whose membership history has been read since they were assigned.
    restored: HashSet<i32>,
    coalescer: Coalescer,
    /// The next offset to commit, per partition of chat.events.
    offsets: HashMap<i32, i64>,
    unacked: Arc<Unacked>,
    /// Sequence number of the next list produced.
    sent: u64,
    /// Offsets waiting for their lists' acks: (lists produced before them, offsets).
    pending: VecDeque<(u64, HashMap<i32, i64>)>,
    status: Arc<Status>,
    cfg: FanoutSettings,
    brokers: String,
}

impl Fanout {
    /// A consumer of every partition of chat.presence from the beginning, in no group:
    /// the whole table, on every fanout member.
    fn presence_consumer(&self) -> anyhow::Result<BaseConsumer> {
        let consumer: BaseConsumer = chatpipe_core::kafka::consumer_config(
            &self.brokers,
            &format!("{}-presence", self.cfg.group),
        )
        .create()
        .context("creating the chat.presence consumer")?;
        let metadata = consumer
            .fetch_metadata(Some(&self.cfg.presence_topic), Duration::from_secs(10))
            .with_context(|| format!("reading the metadata of {}", self.cfg.presence_topic))?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        anyhow::ensure!(
            !partitions.is_empty(),
            "topic {} has no partitions (does it exist?)",
            self.cfg.presence_topic
        );
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition_offset(&self.cfg.presence_topic, p, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        Ok(consumer)
    }

    /// Reads chat.presence up to its end as of now, so the first events are joined with
    /// everyone already connected.
    fn catch_up_presence(&mut self, presence: &BaseConsumer) -> anyhow::Result<()> {
        let topic = self.cfg.presence_topic.clone();
        let mut ends = HashMap::new();
        for e in presence.assignment()?.elements() {
            let (low, high) =
                presence.fetch_watermarks(&topic, e.partition(), Duration::from_secs(10))?;
            if high > low {
                ends.insert(e.partition(), high);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ends.is_empty() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "{topic} not read to its end within 60 s"
            );
            if let Some(Ok(m)) = presence.poll(Duration::from_millis(200)) {
                let (p, o) = (m.partition(), m.offset());
                self.apply_presence(&m);
                if ends.get(&p).is_some_and(|end| o + 1 >= *end) {
                    ends.remove(&p);
                }
            }
        }
        Ok(())
    }

    /// Applies up to `PRESENCE_BATCH` records of chat.presence, waiting at most `wait`
    /// for the first; true if more may be waiting (the loop then polls events without
    /// waiting, so a burst of presence never holds events up for long).
    fn take_presence(&mut self, presence: &BaseConsumer, wait: Duration) -> bool {
        let mut wait = wait;
        for _ in 0..PRESENCE_BATCH {
            match presence.poll(wait) {
                Some(Ok(m)) => self.apply_presence(&m),
                Some(Err(err)) => tracing::warn!("presence consumer: {err}"),
                None => return false,
            }
            wait = Duration::ZERO;
        }
        true
    }

    fn apply_presence(&mut self, m: &BorrowedMessage<'_>) {
        let Some((user, gateway)) = m
            .key()
            .and_then(|k| std::str::from_utf8(k).ok())
            .and_then(parse_key)
        else {
            metrics::counter!("fanout_presence_undecodable_total").increment(1);
            return;
        };
        let mut online = self.status.online.lock().expect("presence lock");
        match m.payload() {
            None => online.remove(user, gateway),
            Some(bytes) => match self
                .schemas
                .of(bytes)
                .and_then(|w| Presence::decode_with(w, bytes).map_err(|e| e.to_string()))
            {
                Ok(p) => online.upsert(
                    p.user_id,
                    Gateway {
                        id: Arc::from(p.gateway_id.as_str()),
                        partition: p.partition,
                    },
                    p.lease_expires_at,
                ),
                Err(error) => {
                    metrics::counter!("fanout_presence_undecodable_total").increment(1);
                    tracing::warn!(error, "undecodable presence record: ignored");
                }
            },
        }
    }

    /// Rebuilds the membership of `partition`'s conversations from its history before
    /// `upto` (the first offset this member will process).
    fn restore(&mut self, partition: i32, upto: i64) -> anyhow::Result<()> {
        let started = Instant::now();
        let topic = self.cfg.events_topic.clone();
        let reader: BaseConsumer = chatpipe_core::kafka::consumer_config(
            &self.brokers,
            &format!("{}-restore", self.cfg.group),
        )
        .create()
        .context("creating the restore consumer")?;
        let (low, _) = reader.fetch_watermarks(&topic, partition, Duration::from_secs(10))?;
        let mut read = 0u64;
        if low < upto {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&topic, partition, Offset::Offset(low))?;
            reader.assign(&tpl)?;
            let deadline = Instant::now() + Duration::from_secs(300);
            'read: loop {
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "restoring {topic}/{partition} took over 300 s"
                );
                let Some(result) = reader.poll(Duration::from_millis(500)) else {
                    continue;
                };
                let m = result.with_context(|| format!("restoring {topic}/{partition}"))?;
                if m.offset() >= upto {
                    break 'read;
                }
                read += 1;
                if let Ok(event) = self.decode(&m) {
                    self.members.apply(partition, &event);
                }
                if m.offset() + 1 >= upto {
                    break 'read;
                }
            }
        }
        self.restored.insert(partition);
        metrics::counter!("fanout_restored_records_total").increment(read);
        self.status
            .restored_records
            .fetch_add(read, Ordering::Relaxed);
        metrics::gauge!("fanout_conversations").set(self.members.len() as f64);
        tracing::info!(
            partition,
            from = low,
            upto,
            read,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "membership restored"
        );
        Ok(())
    }

    fn decode(&mut self, m: &BorrowedMessage<'_>) -> Result<ChatEvent, String> {
        let bytes = m.payload().ok_or("record without a value")?;
        let writer = self.schemas.of(bytes)?;
        read_with(writer, bytes)
            .and_then(from_value)
            .map_err(|e| e.to_string())
    }

    fn take_in(&mut self, m: &BorrowedMessage<'_>) -> anyhow::Result<()> {
        let (partition, offset) = (m.partition(), m.offset());
        if !self.restored.contains(&partition) {
            self.restore(partition, offset)?;
        }
        match self.decode(m) {
            Ok(event) => self.fan_out(partition, &event)?,
            Err(error) => {
                tracing::warn!(
                    partition,
                    offset,
                    error,
                    "undecodable event: to {}",
                    self.dlq_topic
                );
                self.rt.block_on(chatpipe_core::kafka::dead_letter(
                    &self.dlq,
                    &self.dlq_topic,
                    m,
                    &error,
                ))?;
                metrics::counter!("fanout_dlq_total").increment(1);
            }
        }
        self.offsets.insert(partition, offset + 1);
        Ok(())
    }

    fn fan_out(&mut self, partition: i32, event: &ChatEvent) -> anyhow::Result<()> {
        metrics::counter!("fanout_events_total", "type" => event.event_type()).increment(1);
        let conversation = event.conversation_id();
        if !self.members.knows(conversation) && !matches!(event, ChatEvent::ConversationCreated(_))
        {
            self.load_members(conversation, partition)?;
        }
        self.members.apply(partition, event);
        let occurred_at = match event {
            ChatEvent::MessageNew(e) => e.created_at,
            ChatEvent::ReadUpdated(e) => e.occurred_at,
            _ => return Ok(()),
        };
        let age = chrono::Utc::now() - occurred_at;
        metrics::histogram!("fanout_event_age_seconds")
            .record(age.num_microseconds().unwrap_or(i64::MAX).max(0) as f64 / 1e6);
        let age_ms = age.num_milliseconds();
        if age_ms > self.cfg.max_age_ms as i64 {
            metrics::counter!("fanout_stale_skipped_total").increment(1);
            return Ok(());
        }
        let Some(members) = self.members.of(conversation) else {
            return Ok(());
        };
        let now = now_ms();
        let routed = {
            let online = self.status.online.lock().expect("presence lock");
            match event {
                ChatEvent::MessageNew(e) => {
                    plan::message_new(e, members, &online, now, self.cfg.light_threshold)
                }
                ChatEvent::ReadUpdated(e) if members.len() > self.cfg.light_threshold => {
                    self.coalescer.add(e);
                    plan::read_updated_to_reader(e, &online, now)
                }
                ChatEvent::ReadUpdated(e) => plan::read_updated(e, members, &online, now),
                _ => Vec::new(),
            }
        };
        for r in routed {
            self.send(r)?;
        }
        Ok(())
    }

    /// The members of a conversation whose creation this member never saw (the topic's
    /// retention dropped it): once from PostgreSQL, then kept from its events.
    fn load_members(&mut self, conversation: i64, partition: i32) -> anyhow::Result<()> {
        let users: Vec<i64> = self
            .rt
            .block_on(
                sqlx::query_scalar(
                    "SELECT user_id FROM conversation_member WHERE conversation_id = $1",
                )
                .bind(conversation)
                .fetch_all(&self.pool),
            )
            .with_context(|| format!("loading the members of conversation {conversation}"))?;
        metrics::counter!("fanout_membership_loads_total").increment(1);
        self.status.membership_loads.fetch_add(1, Ordering::Relaxed);
        self.members.load(conversation, partition, users);
        Ok(())
    }

    fn send(&mut self, r: Routed) -> anyhow::Result<()> {
        let payload = self.codec.encode(&r.delivery);
        let key = r.delivery.conversation_id.to_string();
        let users = r.delivery.user_ids.len();
        let n = self.sent;
        self.sent += 1;
        self.unacked.add(n);
        let mut record = BaseRecord::with_opaque_to(&self.cfg.deliveries_topic, n as usize)
            .partition(r.partition)
            .key(&key)
            .payload(&payload);
        loop {
            match self.producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // The bound (fanout.produce_queue_max) holds: wait for the broker.
                    metrics::counter!("fanout_produce_queue_full_total").increment(1);
                    std::thread::sleep(Duration::from_millis(5));
                    record = back;
                }
                Err((err, _)) => {
                    self.unacked.done(n);
                    return Err(err).context("producing a fanout list");
                }
            }
        }
        metrics::counter!("fanout_deliveries_total").increment(1);
        metrics::counter!("fanout_recipients_total").increment(users as u64);
        metrics::histogram!("fanout_list_size").record(users as f64);
        Ok(())
    }

    /// Writes tombstones for presence entries whose gateway stopped renewing them long
    /// ago, so chat.presence does not keep dead gateways' users forever. Several fanout
    /// members may write the same tombstone; that is harmless.
    fn tombstone(&self, gone: &[(i64, Arc<str>)]) {
        for (user, gateway) in gone {
            let key = chatpipe_schemas::presence::key(*user, gateway);
            let record: FutureRecord<'_, str, [u8]> =
                FutureRecord::to(&self.cfg.presence_topic).key(&key);
            // Not awaited: the tombstone is housekeeping, not a condition for progress.
            if let Err((err, _)) = self.dlq.send_result(record) {
                tracing::warn!("tombstoning {key}: {err}");
            } else {
                metrics::counter!("fanout_presence_tombstones_total").increment(1);
            }
        }
    }

    /// Every `tick_ms`: the coalesced reads go out, expired leases are dropped, and the
    /// offsets whose lists are all acknowledged are committed. `leaving`: wait for every
    /// ack first and commit synchronously.
    fn tick(&mut self, consumer: &BaseConsumer<FanoutContext>, leaving: bool) {
        let now = now_ms();
        let routed = {
            let online = self.status.online.lock().expect("presence lock");
            let members = &self.members;
            self.coalescer.drain(|c| members.of(c), &online, now)
        };
        for r in routed {
            if let Err(err) = self.send(r) {
                tracing::warn!("coalesced read: {err:#}");
            }
        }
        let (online, gone) = {
            let mut table = self.status.online.lock().expect("presence lock");
            let gone = table.forget(now - self.cfg.presence_forget_ms as i64);
            (table.online_users(now), gone)
        };
        metrics::gauge!("fanout_presence_online").set(online as f64);
        self.tombstone(&gone);
        if !self.offsets.is_empty() {
            self.pending
                .push_back((self.sent, std::mem::take(&mut self.offsets)));
        }
        if leaving {
            if let Err(err) = self.producer.flush(Duration::from_secs(10)) {
                tracing::warn!("flushing fanout lists: {err}");
            }
        }
        let (oldest, waiting) = self.unacked.oldest();
        metrics::gauge!("fanout_unacked_lists").set(waiting as f64);
        let ready = releasable(&mut self.pending, oldest);
        if ready.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (p, o) in ready {
            let _ = tpl.add_partition_offset(&self.cfg.events_topic, p, Offset::Offset(o));
        }
        let mode = if leaving {
            CommitMode::Sync
        } else {
            CommitMode::Async
        };
        if let Err(err) = consumer.commit(&tpl, mode) {
            tracing::warn!("committing offsets: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_wait_for_every_older_list_and_merge_to_the_highest() {
        // Snapshot A after lists 0..3, snapshot B after lists 0..5.
        let mut pending = VecDeque::from([
            (3, HashMap::from([(0, 10), (1, 4)])),
            (5, HashMap::from([(0, 12)])),
        ]);
        // List 2 is still out: nothing may be committed.
        assert!(releasable(&mut pending, Some(2)).is_empty());
        // Lists 0..3 acknowledged (4 is out): A only.
        assert_eq!(
            releasable(&mut pending, Some(4)),
            HashMap::from([(0, 10), (1, 4)])
        );
        assert_eq!(pending.len(), 1);
        // Everything acknowledged.
        assert_eq!(releasable(&mut pending, None), HashMap::from([(0, 12)]));
        assert!(pending.is_empty());
    }
}
