//! The one consumer shell every processor plugs into: poll, decode, apply, dead-letter,
//! commit after the side effect, and wait out outages.
//!
//! A [`Processor`] is its state plus its side effect; the shell owns the consumer. For
//! each record it decodes the value ([`Decode`]) and hands it to the processor. Then:
//! - done: the processor says later which offsets are safe to commit
//!   ([`Processor::committable`]), and the shell commits them (asynchronously, every
//!   `commit_every`; a failed commit is simply sent again, later offsets supersede it);
//! - [`Failure::Poison`]: the record goes to the dead-letter topic with the error in
//!   headers (or, for a reader without one, is counted and dropped) and the partition
//!   moves on;
//! - [`Failure::Retriable`]: the shell *holds* the record. It pauses its partitions (so
//!   nothing behind the record is read), keeps polling (so the group and its rebalances
//!   go on), and tries the same record again after a capped exponential backoff with
//!   jitter, for as long as it takes. Nothing is skipped, nothing dead-lettered, and the
//!   reader never exits because something it depends on is down. While it holds, and
//!   whenever records wait without progress, `/readyz` says so ([`crate::health`]).
//!
//! The processor's periodic work ([`Processor::tick`]: a receipts flush) fails and is
//! held the same way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::kafka::{CreateGuarded, FutureProducer};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};

use crate::health::ReaderHealth;
use crate::retry::{Backoff, ReaderSettings};
use crate::schemas::{Decode, WriterSchemas};
use crate::Failure;

/// Where a record was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub partition: i32,
    pub offset: i64,
}

/// How a reader gets its partitions.
#[derive(Debug, Clone)]
pub enum Source {
    /// Shared with the other members of `group`; offsets committed after side effects.
    Group { group: String },
    /// Assigned directly, nothing committed: `partition` (or every partition of the
    /// topic) from `start`. A global table (every partition from the beginning), or a
    /// gateway's own partition from its end.
    Assigned {
        partition: Option<i32>,
        start: Offset,
    },
}

/// What a reader reads and how it behaves; see `[readers]` in the config files.
#[derive(Debug, Clone)]
pub struct ReaderSpec {
    /// In logs and `/readyz`, e.g. `receipts-0`.
    pub name: String,
    /// Prefix of the reader's metrics, e.g. `receipts` -> `receipts_dlq_total`.
    pub metric: &'static str,
    pub topic: String,
    pub source: Source,
    /// Where poison records go (`<topic>.dlq`); `None`: counted, logged and dropped.
    pub dead_letters: Option<String>,
    /// Longest wait for a record in one poll.
    pub max_poll: Duration,
    /// How often offsets are committed.
    pub commit_every: Duration,
    pub settings: ReaderSettings,
}

impl ReaderSpec {
    /// A reader of `topic` in consumer group `group`, its bad records to `<topic>.dlq`.
    pub fn group(
        name: &str,
        metric: &'static str,
        topic: &str,
        group: &str,
        max_poll_ms: u64,
        settings: &ReaderSettings,
    ) -> Self {
        Self {
            name: name.to_owned(),
            metric,
            topic: topic.to_owned(),
            source: Source::Group {
                group: group.to_owned(),
            },
            dead_letters: Some(format!("{topic}.dlq")),
            max_poll: Duration::from_millis(max_poll_ms),
            commit_every: settings.commit_interval(),
            settings: settings.clone(),
        }
    }
}

/// A processor: its state and its side effect, with no Kafka consumer of its own.
pub trait Processor: Send + 'static {
    type Record: Decode;

    /// A decoded record, in partition order. `Poison` dead-letters it; `Retriable` holds
    /// it and calls again later with the same record.
    fn apply(&mut self, at: Position, record: Self::Record) -> Result<(), Failure>;

    /// A record that was dead-lettered (or dropped): nothing to apply, but its offset is
    /// done. `key` is the record's key, for state the record would have changed.
    fn skip(&mut self, _at: Position, _key: Option<&[u8]>) {}

    /// Called on every turn of the loop: work that is due now. `Retriable` holds it.
    fn tick(&mut self) -> Result<(), Failure> {
        Ok(())
    }

    /// Offsets (the next to read, per partition) whose records' side effects are durable.
    fn committable(&mut self) -> Vec<(i32, i64)> {
        Vec::new()
    }

    /// The partitions were assigned to this reader.
    fn assigned(&mut self, _partitions: &[i32]) {}

    /// The partitions are about to go to another member: finish their work if possible
    /// (best effort; their records are read again by the next owner otherwise) and
    /// forget them. Their [`Processor::committable`] offsets are committed right after.
    fn revoke(&mut self, _partitions: &[i32]) {}

    /// The reader is stopping: finish what is open. Its committable offsets are then
    /// committed synchronously.
    fn finish(&mut self) -> Result<(), Failure> {
        Ok(())
    }
}

/// Offsets the processor released, and those the broker confirmed.
#[derive(Default)]
struct Offsets {
    desired: HashMap<i32, i64>,
    committed: HashMap<i32, i64>,
}

impl Offsets {
    fn merge(&mut self, released: Vec<(i32, i64)>) {
        for (p, o) in released {
            let e = self.desired.entry(p).or_insert(o);
            *e = (*e).max(o);
        }
    }

    /// Desired offsets not yet confirmed, of `partitions` (all if `None`).
    fn pending(&self, partitions: Option<&[i32]>) -> Vec<(i32, i64)> {
        self.desired
            .iter()
            .filter(|(p, _)| partitions.is_none_or(|ps| ps.contains(p)))
            .filter(|(p, o)| self.committed.get(p).is_none_or(|c| c < o))
            .map(|(p, o)| (*p, *o))
            .collect()
    }

    fn forget(&mut self, partitions: &[i32]) {
        self.desired.retain(|p, _| !partitions.contains(p));
        self.committed.retain(|p, _| !partitions.contains(p));
    }
}

/// The reader's metrics, registered once: a record must not pay for a name lookup.
struct ReaderMetrics {
    records: metrics::Counter,
    dlq: metrics::Counter,
    retries: metrics::Counter,
    consumer_errors: metrics::Counter,
    commit_failures: metrics::Counter,
    retrying: metrics::Gauge,
    refetches: metrics::Counter,
    leader_queries: metrics::Counter,
}

impl ReaderMetrics {
    fn new(prefix: &str) -> Self {
        assert!(
            chatpipe_core::catalogue::READER_PREFIXES.contains(&prefix),
            "reader metric prefix {prefix} is not in chatpipe_core::catalogue::READER_PREFIXES"
        );
        for (name, kind, help) in chatpipe_core::catalogue::reader_metrics(prefix) {
            chatpipe_core::catalogue::describe(name, kind, help);
        }
        Self {
            records: metrics::counter!(format!("{prefix}_records_total")),
            dlq: metrics::counter!(format!("{prefix}_dlq_total")),
            retries: metrics::counter!(format!("{prefix}_retries_total")),
            consumer_errors: metrics::counter!(format!("{prefix}_consumer_errors_total")),
            commit_failures: metrics::counter!(format!("{prefix}_commit_failures_total")),
            retrying: metrics::gauge!(format!("{prefix}_retrying")),
            refetches: metrics::counter!(format!("{prefix}_refetches_total")),
            leader_queries: metrics::counter!(format!("{prefix}_leader_queries_total")),
        }
    }
}

/// What the consumer's callbacks share with the loop. Callbacks run inside `poll`, on
/// the loop's own thread, so the locks are never contended.
struct Shared<P> {
    processor: Mutex<P>,
    offsets: Mutex<Offsets>,
    spec: ReaderSpec,
    metrics: ReaderMetrics,
    health: Arc<ReaderHealth>,
    /// The loop holds a record: newly assigned partitions are paused at once.
    paused: AtomicBool,
    /// Partitions revoked since the loop last looked.
    revoked: Mutex<Vec<i32>>,
    /// Assigned partitions the client knows no leader for, from its last statistics.
    leaderless: Mutex<Vec<i32>>,
}

impl<P> Shared<P> {
    fn processor(&self) -> MutexGuard<'_, P> {
        self.processor.lock().expect("processor lock")
    }

    fn offsets(&self) -> MutexGuard<'_, Offsets> {
        self.offsets.lock().expect("offsets lock")
    }
}

/// Records of a partition the reader has yet to process: from its position (what it
/// handed to the processor, else what it committed, else where it fetches next) to the
/// end (the last stable offset). Records below the log's start are gone (retention):
/// they are not waiting, though a committed offset from before their deletion still
/// points at them (seen on chat.ephemeral, whose records live one minute: the typing
/// reader counted 16 deleted signals as waiting and called itself stalled for good).
fn waiting(p: &rdkafka::statistics::Partition) -> Option<i64> {
    if p.ls_offset < 0 {
        return None;
    }
    let position = [p.app_offset, p.committed_offset, p.next_offset]
        .into_iter()
        .find(|o| *o >= 0)?;
    let position = if p.lo_offset >= 0 {
        position.max(p.lo_offset)
    } else {
        position
    };
    Some((p.ls_offset - position).max(0))
}

pub struct ReaderContext<P> {
    shared: Arc<Shared<P>>,
    rebootstrap: chatpipe_core::kafka::Rebootstrap,
}

impl<P: Processor> ClientContext for ReaderContext<P> {
    /// Lag per partition from librdkafka's statistics: the end of the partition (last
    /// stable offset) minus the reader's position. No broker round trip. And a consumer
    /// left without a broker gets its bootstrap servers again (see
    /// [`chatpipe_core::kafka::rebootstrap`]).
    fn stats(&self, statistics: rdkafka::Statistics) {
        self.rebootstrap.observe(&statistics);
        let spec = &self.shared.spec;
        let Some(topic) = statistics.topics.get(&spec.topic) else {
            return;
        };
        let mut total = 0;
        let mut leaderless = Vec::new();
        for (partition, p) in &topic.partitions {
            if *partition < 0 || !p.desired {
                continue;
            }
            if p.leader < 0 || p.unknown {
                leaderless.push(*partition);
            }
            let Some(lag) = waiting(p) else { continue };
            metrics::gauge!(format!("{}_consumer_lag", spec.metric), "partition" => partition.to_string())
                .set(lag as f64);
            total += lag;
        }
        *self.shared.leaderless.lock().expect("leaderless lock") = leaderless;
        self.shared.health.set_lag(total);
    }
}

impl<P: Processor> ConsumerContext for ReaderContext<P> {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        let partitions: Vec<i32> = revoked.elements().iter().map(|e| e.partition()).collect();
        // Lost, not handed over: the group fenced this member (its session expired, as
        // in a broker stall longer than it) and may have given the partitions to
        // another. Nothing can be committed for them any more, and a synchronous commit
        // would wait for a coordinator that refuses this member, inside the callback
        // that must return before the member can rejoin: seen as a fanout reader that
        // did not poll for over 30 s after a 90 s stall. The records are read again
        // from the last commit (at-least-once; consumers dedupe).
        let lost = consumer.assignment_lost();
        tracing::info!(reader = %self.shared.spec.name, ?partitions, lost, "partitions revoked: finishing them first");
        self.shared.health.revoked(&partitions);
        let released = {
            let mut processor = self.shared.processor();
            processor.revoke(&partitions);
            processor.committable()
        };
        let pending = {
            let mut offsets = self.shared.offsets();
            offsets.merge(released);
            let pending = offsets.pending(Some(&partitions));
            offsets.forget(&partitions);
            pending
        };
        if lost && !pending.is_empty() {
            tracing::info!(reader = %self.shared.spec.name, ?partitions, "partitions lost: their offsets are not committed; the next owner reads from the last commit");
        } else if !pending.is_empty() {
            match offset_list(&self.shared.spec.topic, &pending)
                .and_then(|tpl| consumer.commit(&tpl, CommitMode::Sync))
            {
                Ok(()) => self.shared.health.progressed(),
                // Not committed: the next owner reads these records again (harmless).
                Err(err) => {
                    tracing::warn!(reader = %self.shared.spec.name, "committing revoked partitions: {err}")
                }
            }
        }
        self.shared
            .revoked
            .lock()
            .expect("revoked lock")
            .extend(partitions);
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(assigned) = rebalance {
            let partitions: Vec<i32> = assigned.elements().iter().map(|e| e.partition()).collect();
            tracing::info!(reader = %self.shared.spec.name, ?partitions, "partitions assigned");
            self.shared.health.assigned(&partitions);
            self.shared.processor().assigned(&partitions);
            if self.shared.paused.load(Ordering::Relaxed) {
                if let Err(err) = consumer.pause(assigned) {
                    tracing::warn!("pausing newly assigned partitions: {err}");
                }
            }
        }
    }

    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        offsets: &TopicPartitionList,
    ) {
        match result {
            Ok(()) => {
                let mut book = self.shared.offsets();
                for e in offsets.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        // Only partitions still ours (a revoke forgets them).
                        if book.desired.contains_key(&e.partition()) {
                            let c = book.committed.entry(e.partition()).or_insert(o);
                            *c = (*c).max(o);
                        }
                    }
                }
                self.shared.health.progressed();
            }
            Err(err) => {
                self.shared.metrics.commit_failures.increment(1);
                tracing::warn!(reader = %self.shared.spec.name, "offset commit failed (sent again later): {err}");
            }
        }
    }
}

fn offset_list(
    topic: &str,
    offsets: &[(i32, i64)],
) -> rdkafka::error::KafkaResult<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o))?;
    }
    Ok(tpl)
}

/// What the loop holds through an outage.
enum Held {
    /// A record not yet applied (or, if poison, not yet in the dead-letter topic).
    Record(OwnedMessage),
    /// The processor's periodic work.
    Tick,
}

struct Hold {
    what: Held,
    since: Instant,
    attempts: u32,
    retry_at: Instant,
}

impl<P: Processor> Core<P> {
    fn spec(&self) -> &ReaderSpec {
        &self.shared.spec
    }

    /// One record: decoded and applied, or dead-lettered. `Err` only for an outage.
    fn take(&mut self, message: &impl Message) -> Result<(), Failure> {
        let at = Position {
            partition: message.partition(),
            offset: message.offset(),
        };
        let result = P::Record::decode(message, &mut self.schemas)
            .and_then(|record| self.shared.processor().apply(at, record));
        match result {
            Ok(()) => {
                self.shared.metrics.records.increment(1);
                self.shared.health.progressed();
                Ok(())
            }
            Err(Failure::Poison(reason)) => self.dead_letter(message, &reason).map_err(|e| {
                // The record stays poison; only getting it into the DLQ is retried.
                Failure::Retriable(e.context(format!("dead-lettering ({reason})")))
            }),
            Err(retriable) => Err(retriable),
        }
    }

    /// Copies a poison record to the dead-letter topic (acknowledged) and moves past it.
    fn dead_letter(&mut self, message: &impl Message, reason: &str) -> anyhow::Result<()> {
        let spec = self.spec().clone();
        let at = Position {
            partition: message.partition(),
            offset: message.offset(),
        };
        match &spec.dead_letters {
            Some(dlq_topic) => {
                self.handle.block_on(crate::dead_letter::write(
                    &self.dlq, dlq_topic, message, reason,
                ))?;
                tracing::warn!(reader = %spec.name, partition = at.partition, offset = at.offset, error = reason, "bad record: to {dlq_topic}");
            }
            None => {
                tracing::warn!(reader = %spec.name, partition = at.partition, offset = at.offset, error = reason, "bad record: dropped");
            }
        }
        self.shared.metrics.dlq.increment(1);
        self.shared.processor().skip(at, message.key());
        self.shared.health.progressed();
        Ok(())
    }
}

/// One reader: a consumer, its processor, and the loop between them.
pub struct Reader<P: Processor> {
    consumer: BaseConsumer<ReaderContext<P>>,
    core: Core<P>,
    backoff: Backoff,
    hold: Option<Hold>,
    watch: FetchWatch,
    leaders: LeaderWatch,
}

/// Catches a consumer that stopped fetching. After a broker restart librdkafka can leave
/// a partition without a fetcher while everything else looks fine: no error, the client
/// statistics frozen at "no lag" (librdkafka#5153, rust-rdkafka#597; seen here on a
/// gateway's deliveries reader, whose pushes stopped until a restart). When nothing has
/// arrived for `readers.fetch_check_ms`, the reader asks the broker where each of its
/// partitions ends; a partition that ends past the reader's position has records nobody
/// fetches, and is fetched again from that position (a seek restarts its fetcher).
/// Until its records arrive, the reader counts as holding, so `/readyz` turns 503
/// after `stall_after_ms` instead of reporting a silent reader as ready.
struct FetchWatch {
    every: Duration,
    last_record: Instant,
    next_check: Instant,
    /// Records seen waiting at the last check (0: none).
    stuck: i64,
}

impl FetchWatch {
    fn new(every: Duration) -> Self {
        Self {
            every,
            last_record: Instant::now(),
            next_check: Instant::now() + every,
            stuck: 0,
        }
    }

    fn due(&self, now: Instant) -> bool {
        now >= self.next_check && now.duration_since(self.last_record) >= self.every
    }

    /// A record arrived: the partitions are being fetched.
    fn fetched(&mut self, health: &ReaderHealth, reader: &str) {
        self.last_record = Instant::now();
        health.broker_answered();
        if self.stuck > 0 {
            self.stuck = 0;
            health.release();
            tracing::info!(reader, "records arrive again");
        }
    }
}

/// How long one metadata request for the reader's topic may take.
const LEADER_QUERY_TIMEOUT: Duration = Duration::from_secs(1);

/// Catches partitions the client has lost the leader of. A broker that stops moves its
/// partitions to "no leader"; the client parks them and asks for their leaders again,
/// but after a restart that question can stay unasked for tens of seconds (a metadata
/// request lost with the old connection keeps newer ones back), and nothing is fetched
/// from those partitions meanwhile, even from a broker that is back and serving: a
/// restarted broker once left fanout pushing nothing for over 35 s. The client's own
/// statistics (every second) list an assigned partition without a leader; while any is
/// listed, the reader asks the broker for its topic's metadata itself, first after 1 s,
/// then at doubling intervals up to `readers.fetch_check_ms`.
struct LeaderWatch {
    first: Duration,
    most: Duration,
    wait: Duration,
    next_ask: Instant,
}

impl LeaderWatch {
    fn new(most: Duration) -> Self {
        let first = Duration::from_secs(1).min(most);
        Self {
            first,
            most,
            wait: first,
            next_ask: Instant::now() + first,
        }
    }

    /// Asked now: the next question waits twice as long (up to `most`).
    fn asked(&mut self, now: Instant) {
        self.next_ask = now + self.wait;
        self.wait = (self.wait * 2).min(self.most);
    }

    /// Every partition has a leader: the next loss is asked about after `first`.
    fn calm(&mut self) {
        self.wait = self.first;
        self.next_ask = Instant::now() + self.first;
    }
}

/// What processing a record takes, apart from the consumer it came from.
struct Core<P> {
    shared: Arc<Shared<P>>,
    schemas: WriterSchemas,
    dlq: FutureProducer,
    handle: tokio::runtime::Handle,
}

impl<P: Processor> Reader<P> {
    /// A reader of `spec.topic` for `processor`, its consumer configured from `config`
    /// (brokers and any client settings). Subscribes or assigns at once.
    pub fn new(
        spec: ReaderSpec,
        mut config: ClientConfig,
        processor: P,
        schemas: WriterSchemas,
        health: Arc<ReaderHealth>,
        handle: tokio::runtime::Handle,
    ) -> anyhow::Result<Self> {
        let brokers = config
            .get("bootstrap.servers")
            .context("the reader's client config names no bootstrap.servers")?
            .to_owned();
        let group = match &spec.source {
            Source::Group { group } => group.clone(),
            // librdkafka wants a group id; an assigned reader never joins or commits.
            Source::Assigned { .. } => format!("chatpipe-{}", spec.name),
        };
        if matches!(spec.source, Source::Group { .. }) {
            // KIP-848's consumer group protocol: the broker assigns partitions through
            // heartbeats, with no group-wide JoinGroup barrier. After a broker stall
            // the classic protocol left members rejoining for tens of seconds; this one
            // re-admits each member on its next heartbeat, and a member keeps fetching
            // while the coordinator is unreachable. Rebalances are incremental.
            config.set("group.protocol", "consumer");
        }
        config
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed");
        // Statistics every second (lag, leaderless partitions, the broker guard): the
        // default of chatpipe_core::kafka::create_with.
        let shared = Arc::new(Shared {
            processor: Mutex::new(processor),
            offsets: Mutex::default(),
            metrics: ReaderMetrics::new(spec.metric),
            spec,
            health,
            paused: AtomicBool::new(false),
            revoked: Mutex::default(),
            leaderless: Mutex::default(),
        });
        let consumer: BaseConsumer<ReaderContext<P>> =
            chatpipe_core::kafka::create_with(&config, |rebootstrap| ReaderContext {
                shared: shared.clone(),
                rebootstrap,
            })
            .with_context(|| format!("creating the consumer of {}", shared.spec.topic))?;
        // It reaches the cluster the way the consumer does (TLS, SASL).
        let dlq: FutureProducer = chatpipe_core::kafka::apply(
            chatpipe_core::kafka::producer_config(&brokers),
            &chatpipe_core::kafka::transport_of(&config),
        )
        .set(
            "message.timeout.ms",
            shared.spec.settings.dead_letter_timeout_ms.to_string(),
        )
        .create_guarded()
        .context("creating the dead-letter producer")?;
        let backoff = Backoff::new(&shared.spec.settings);
        let spec_fetch_check = shared.spec.settings.fetch_check();
        let reader = Self {
            consumer,
            core: Core {
                shared,
                schemas,
                dlq,
                handle,
            },
            backoff,
            hold: None,
            watch: FetchWatch::new(spec_fetch_check),
            leaders: LeaderWatch::new(spec_fetch_check),
        };
        reader.start()?;
        Ok(reader)
    }

    fn spec(&self) -> &ReaderSpec {
        &self.core.shared.spec
    }

    fn start(&self) -> anyhow::Result<()> {
        let spec = self.spec();
        match &spec.source {
            Source::Group { .. } => self
                .consumer
                .subscribe(&[&spec.topic])
                .with_context(|| format!("subscribing to {}", spec.topic)),
            Source::Assigned { partition, start } => {
                let partitions = match partition {
                    Some(p) => vec![*p],
                    None => self.partitions()?,
                };
                let mut tpl = TopicPartitionList::new();
                for p in &partitions {
                    // "From the end" means the end now, resolved before the reader
                    // counts as started: left to librdkafka, the end is looked up in the
                    // background, and records written meanwhile would be skipped.
                    let start = match start {
                        Offset::End => Offset::Offset(
                            self.consumer
                                .fetch_watermarks(&spec.topic, *p, Duration::from_secs(10))
                                .with_context(|| format!("the end of {}/{p}", spec.topic))?
                                .1,
                        ),
                        other => *other,
                    };
                    tpl.add_partition_offset(&spec.topic, *p, start)?;
                }
                self.consumer.assign(&tpl)?;
                self.core.shared.health.assigned(&partitions);
                self.core.shared.processor().assigned(&partitions);
                Ok(())
            }
        }
    }

    /// Every partition of the topic, from the broker's metadata.
    pub fn partitions(&self) -> anyhow::Result<Vec<i32>> {
        let topic = &self.spec().topic;
        let metadata = self
            .consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .with_context(|| format!("reading the metadata of {topic}"))?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        anyhow::ensure!(
            !partitions.is_empty(),
            "topic {topic} has no partitions (does it exist?)"
        );
        Ok(partitions)
    }

    /// The consumer, for what a processor needs of it at start (watermarks).
    pub fn consumer(&self) -> &BaseConsumer<ReaderContext<P>> {
        &self.consumer
    }

    /// Runs the processor with `f` (for state the caller shares, e.g. in tests).
    pub fn with_processor<T>(&self, f: impl FnOnce(&mut P) -> T) -> T {
        f(&mut self.core.shared.processor())
    }

    /// Reads until `stop` is set, then finishes the processor's open work and commits.
    pub fn run(mut self, stop: &AtomicBool) -> anyhow::Result<()> {
        let spec = self.spec().clone();
        tracing::info!(reader = %spec.name, topic = %spec.topic, "reader running");
        let mut next_commit = Instant::now() + spec.commit_every;
        while !stop.load(Ordering::Relaxed) {
            self.core.shared.health.polled();
            if self.hold.is_some() {
                self.retry_held();
                continue;
            }
            match self.consumer.poll(spec.max_poll) {
                Some(Ok(message)) => {
                    self.watch.fetched(&self.core.shared.health, &spec.name);
                    if let Err(failure) = self.core.take(&message) {
                        let message = message.detach();
                        self.hold_on(Held::Record(message), failure);
                        continue;
                    }
                }
                Some(Err(err)) => {
                    self.core.shared.metrics.consumer_errors.increment(1);
                    tracing::warn!(reader = %spec.name, "consumer: {err}");
                }
                None => {}
            }
            self.forget_revoked();
            let ticked = self.core.shared.processor().tick();
            if let Err(failure) = ticked {
                self.hold_on(Held::Tick, failure);
                continue;
            }
            self.release_offsets();
            if Instant::now() >= next_commit {
                self.commit(CommitMode::Async);
                next_commit = Instant::now() + spec.commit_every;
            }
            if self.watch.due(Instant::now()) {
                self.check_fetching();
            }
            self.watch_leaders();
        }
        self.finish();
        Ok(())
    }

    /// Nothing arrived for a while: is that because nothing is there? See [`FetchWatch`].
    fn check_fetching(&mut self) {
        self.watch.next_check = Instant::now() + self.watch.every;
        let (topic, name) = (self.spec().topic.clone(), self.spec().name.clone());
        let Ok(positions) = self.consumer.position() else {
            self.ask_whether_the_broker_answers(&topic);
            return;
        };
        let timeout = Duration::from_secs(2);
        let (mut asked, mut answered) = (0, 0);
        let mut waiting = 0;
        let mut refetched = Vec::new();
        let mut lost = Vec::new();
        for e in positions.elements_for_topic(&topic) {
            let Offset::Offset(position) = e.offset() else {
                continue;
            };
            asked += 1;
            let end = match self
                .consumer
                .fetch_watermarks(&topic, e.partition(), timeout)
            {
                Ok((_, end)) => end,
                // The client's metadata no longer has the partition: a broker that was
                // starting answered without it, and an assigned consumer does not ask
                // again. Nothing is fetched from it until it does.
                Err(KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownPartition)) => {
                    lost.push((e.partition(), position));
                    continue;
                }
                // No answer for this partition (its request may wait behind a fetch):
                // the others are still checked.
                Err(_) => continue,
            };
            answered += 1;
            if end > position {
                waiting += end - position;
                let seek =
                    self.consumer
                        .seek(&topic, e.partition(), Offset::Offset(position), timeout);
                if let Err(err) = seek {
                    tracing::warn!(reader = %name, partition = e.partition(), "seek to fetch again: {err}");
                }
                self.core.shared.metrics.refetches.increment(1);
                refetched.push(e.partition());
            }
        }
        if asked > 0 && answered == 0 && lost.is_empty() {
            // The broker does not answer: an outage, which the reader waits out, and
            // says so on /readyz once it lasts `stall_after_ms`.
            self.core.shared.health.broker_silent();
            return;
        }
        if answered > 0 {
            self.core.shared.health.broker_answered();
        } else if asked == 0 {
            // No position to ask about (nothing fetched yet since an assignment).
            self.ask_whether_the_broker_answers(&topic);
        }
        if !lost.is_empty() {
            self.core
                .shared
                .metrics
                .refetches
                .increment(lost.len() as u64);
            self.ask_for_leaders();
        }
        if waiting > 0 || !lost.is_empty() {
            tracing::warn!(
                reader = %name,
                refetched = ?refetched,
                records = waiting,
                unknown_to_the_client = ?lost.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
                "the consumer is not fetching some partitions: fetching them again"
            );
            self.core.shared.health.set_lag(waiting.max(1));
            self.core.shared.health.hold(format!(
                "partitions {refetched:?} have {waiting} records not fetched, partitions {:?} are unknown to the client; fetching again",
                lost.iter().map(|(p, _)| *p).collect::<Vec<_>>()
            ));
        }
        let stuck = waiting.max(i64::from(!lost.is_empty()));
        if stuck == 0 && self.watch.stuck > 0 {
            // Nothing waits any more (what waited was fetched, or is gone).
            self.core.shared.health.release();
        }
        self.watch.stuck = stuck;
    }

    /// Assigned partitions the client knows no leader for (its statistics say so every
    /// second): ask the broker for the topic's metadata, at most every
    /// [`LeaderWatch`]'s interval. See [`LeaderWatch`] for why.
    fn watch_leaders(&mut self) {
        let now = Instant::now();
        if now < self.leaders.next_ask {
            return;
        }
        let leaderless = self
            .core
            .shared
            .leaderless
            .lock()
            .expect("leaderless lock")
            .clone();
        if leaderless.is_empty() {
            if self.leaders.wait != self.leaders.first {
                tracing::info!(reader = %self.spec().name, "every partition has a leader again");
            }
            self.leaders.calm();
            return;
        }
        if self.leaders.wait == self.leaders.first {
            tracing::info!(reader = %self.spec().name, partitions = ?leaderless, "no leader known for these partitions: asking the broker");
        }
        self.leaders.asked(now);
        self.ask_for_leaders();
    }

    /// Whether the broker answers at all (a metadata request for the reader's topic),
    /// for /readyz: see [`ReaderHealth::broker_silent`].
    fn ask_whether_the_broker_answers(&self, topic: &str) {
        let health = &self.core.shared.health;
        match self
            .consumer
            .fetch_metadata(Some(topic), Duration::from_secs(2))
        {
            Ok(_) => health.broker_answered(),
            Err(_) => health.broker_silent(),
        }
    }

    /// Asks the broker for the topic's metadata (the client takes the leaders it
    /// learns) and, for a reader that assigns its partitions itself, assigns them again
    /// from where it stands (a group reader's partitions are the group's to give).
    fn ask_for_leaders(&mut self) {
        let topic = self.spec().topic.clone();
        self.core.shared.metrics.leader_queries.increment(1);
        if let Err(err) = self
            .consumer
            .fetch_metadata(Some(&topic), LEADER_QUERY_TIMEOUT)
        {
            tracing::warn!(reader = %self.spec().name, "asking for the metadata of {topic}: {err}");
            return;
        }
        if !matches!(self.spec().source, Source::Assigned { .. }) {
            return;
        }
        let (Ok(assignment), Ok(positions)) =
            (self.consumer.assignment(), self.consumer.position())
        else {
            return;
        };
        let mut tpl = TopicPartitionList::new();
        for e in assignment.elements_for_topic(&topic) {
            let p = e.partition();
            // Where the reader stands, or where it was assigned if it has read nothing.
            let offset = positions
                .find_partition(&topic, p)
                .map(|e| e.offset())
                .filter(|o| matches!(o, Offset::Offset(_)))
                .unwrap_or(e.offset());
            let _ = tpl.add_partition_offset(&topic, p, offset);
        }
        if let Err(err) = self.consumer.assign(&tpl) {
            tracing::warn!(reader = %self.spec().name, "assigning {topic} again: {err}");
        }
    }

    /// Holds `what` after a failure: pause the partitions and retry after a backoff.
    fn hold_on(&mut self, what: Held, failure: Failure) {
        let now = Instant::now();
        let wait = self.backoff.next_wait();
        tracing::warn!(reader = %self.spec().name, retry_in_ms = wait.as_millis() as u64, "holding its position and retrying: {failure}");
        self.hold = Some(Hold {
            what,
            since: now,
            attempts: 1,
            retry_at: now + wait,
        });
        self.core.shared.paused.store(true, Ordering::Relaxed);
        if let Err(err) = self
            .consumer
            .assignment()
            .and_then(|a| self.consumer.pause(&a))
        {
            tracing::warn!("pausing partitions: {err}");
        }
        self.core.shared.metrics.retrying.set(1.0);
        self.core.shared.metrics.retries.increment(1);
        self.core.shared.health.hold(failure.to_string());
    }

    /// While holding: wait (polling, partitions paused) until the next attempt is due,
    /// then try the held step again.
    fn retry_held(&mut self) {
        let retry_at = self.hold.as_ref().expect("holding").retry_at;
        let now = Instant::now();
        if now < retry_at {
            let wait = (retry_at - now).min(self.spec().max_poll.max(Duration::from_millis(100)));
            match self.consumer.poll(wait) {
                // Read before the pause took effect: it is read again after the resume.
                Some(Ok(m)) => {
                    let (p, o) = (m.partition(), m.offset());
                    if let Err(err) = self.consumer.seek(
                        &self.spec().topic,
                        p,
                        Offset::Offset(o),
                        Duration::from_secs(5),
                    ) {
                        tracing::warn!("seeking back to {p}/{o} while paused: {err}");
                    }
                }
                Some(Err(err)) => {
                    self.core.shared.metrics.consumer_errors.increment(1);
                    tracing::debug!("consumer while holding: {err}");
                }
                None => {}
            }
            self.forget_revoked();
            return;
        }
        let mut hold = self.hold.take().expect("holding");
        let result = match &hold.what {
            Held::Record(m) => self.core.take(m),
            Held::Tick => self.core.shared.processor().tick(),
        };
        match result {
            Ok(()) => self.recovered(&hold),
            Err(failure) => {
                let wait = self.backoff.next_wait();
                hold.attempts += 1;
                hold.retry_at = Instant::now() + wait;
                // Quiet while it lasts: a line for each of the first 5 attempts, then every 10th.
                if hold.attempts <= 5 || hold.attempts.is_multiple_of(10) {
                    tracing::warn!(reader = %self.spec().name, attempts = hold.attempts, retry_in_ms = wait.as_millis() as u64, "still failing: {failure}");
                }
                self.core.shared.metrics.retries.increment(1);
                self.core.shared.health.hold(failure.to_string());
                self.hold = Some(hold);
            }
        }
    }

    fn recovered(&mut self, hold: &Hold) {
        tracing::info!(
            reader = %self.spec().name,
            attempts = hold.attempts,
            held_ms = hold.since.elapsed().as_millis() as u64,
            "recovered: the held step went through"
        );
        self.backoff.reset();
        self.core.shared.paused.store(false, Ordering::Relaxed);
        if let Err(err) = self
            .consumer
            .assignment()
            .and_then(|a| self.consumer.resume(&a))
        {
            tracing::warn!("resuming partitions: {err}");
        }
        self.core.shared.metrics.retrying.set(0.0);
        self.core.shared.health.release();
        self.release_offsets();
    }

    /// A held record of a partition that was revoked is the next owner's now.
    fn forget_revoked(&mut self) {
        let revoked = std::mem::take(&mut *self.core.shared.revoked.lock().expect("revoked lock"));
        if revoked.is_empty() {
            return;
        }
        let held_partition = match self.hold.as_ref().map(|h| &h.what) {
            Some(Held::Record(m)) => Some(m.partition()),
            _ => None,
        };
        if held_partition.is_some_and(|p| revoked.contains(&p)) {
            tracing::info!(reader = %self.spec().name, "the held record's partition was revoked: its next owner reads it");
            let hold = self.hold.take().expect("holding");
            self.recovered(&hold);
        }
    }

    fn release_offsets(&mut self) {
        let released = self.core.shared.processor().committable();
        if !released.is_empty() {
            self.core.shared.offsets().merge(released);
        }
    }

    /// Commits what the processor released and the broker has not confirmed.
    fn commit(&self, mode: CommitMode) {
        if !matches!(self.spec().source, Source::Group { .. }) {
            return;
        }
        let pending = self.core.shared.offsets().pending(None);
        if pending.is_empty() {
            return;
        }
        let result = offset_list(&self.spec().topic, &pending)
            .and_then(|tpl| self.consumer.commit(&tpl, mode));
        match (result, mode) {
            (Ok(()), CommitMode::Sync) => {
                let mut offsets = self.core.shared.offsets();
                for (p, o) in pending {
                    offsets.committed.insert(p, o);
                }
            }
            (Ok(()), CommitMode::Async) => {}
            (Err(err), _) => {
                self.core.shared.metrics.commit_failures.increment(1);
                tracing::warn!(reader = %self.spec().name, "offset commit failed (sent again later): {err}");
            }
        }
    }

    /// Stopping: the processor finishes its open work (one attempt: if something is
    /// down, the records are read again after the restart), then a synchronous commit.
    fn finish(&mut self) {
        let finished = self.core.shared.processor().finish();
        if let Err(failure) = finished {
            tracing::warn!(reader = %self.spec().name, "finishing on stop: {failure}; its records are read again at the next start");
        }
        self.release_offsets();
        self.commit(CommitMode::Sync);
        if matches!(self.spec().source, Source::Group { .. }) {
            self.consumer.unsubscribe();
        }
        self.core.shared.health.finish();
        tracing::info!(reader = %self.spec().name, "reader stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(
        lo: i64,
        ls: i64,
        app: i64,
        committed: i64,
        next: i64,
    ) -> rdkafka::statistics::Partition {
        rdkafka::statistics::Partition {
            lo_offset: lo,
            ls_offset: ls,
            app_offset: app,
            committed_offset: committed,
            next_offset: next,
            ..Default::default()
        }
    }

    #[test]
    fn records_waiting_count_from_the_position_and_never_below_the_log_start() {
        const UNSET: i64 = -1001;
        // Processed up to 10 of 15.
        assert_eq!(waiting(&partition(0, 15, 10, 8, 15)), Some(5));
        // Nothing processed since the start: from the committed offset.
        assert_eq!(waiting(&partition(0, 15, UNSET, 12, 12)), Some(3));
        // Committed before retention deleted the records up to 16: none waits.
        assert_eq!(waiting(&partition(16, 16, UNSET, 0, 16)), Some(0));
        assert_eq!(waiting(&partition(16, 17, UNSET, 0, 16)), Some(1));
        // No end known yet.
        assert_eq!(waiting(&partition(UNSET, UNSET, UNSET, 0, 0)), None);
    }

    #[test]
    fn leaders_are_asked_for_after_a_second_then_at_doubling_intervals_up_to_the_cap() {
        let mut watch = LeaderWatch::new(Duration::from_secs(5));
        let start = Instant::now();
        assert!(watch.next_ask >= start + Duration::from_millis(900));
        let mut gaps = Vec::new();
        for _ in 0..5 {
            let now = watch.next_ask;
            watch.asked(now);
            gaps.push((watch.next_ask - now).as_secs());
        }
        assert_eq!(gaps, [1, 2, 4, 5, 5]);
        // Every partition led again: the next loss starts from a second.
        watch.calm();
        let now = Instant::now();
        watch.asked(now);
        assert_eq!((watch.next_ask - now).as_secs(), 1);
    }
}
