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
//!
//! Here: the spec, the processor's trait and the loop. Beside it: `context` (what the
//! consumer's callbacks see: rebalances, statistics, commits), `offsets`, `hold` (hold
//! and retry) and `watch` (records that stop arriving, partitions without a leader).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

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

mod context;
mod hold;
mod offsets;
mod watch;

pub use context::ReaderContext;
use context::{ReaderMetrics, Shared};
use hold::{Held, Hold};
use offsets::{offset_list, Offsets};
use watch::{FetchWatch, LeaderWatch};

/// How long a stopping reader waits for its group's revocation to be served before it
/// closes the consumer anyway.
const LEAVE_WAIT: Duration = Duration::from_secs(10);

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
    ) -> anyhow::Result<Self> {
        // The runtime the schemas block on serves the dead-letter writes too.
        let handle = schemas.handle().clone();
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
    pub fn run(mut self, stop: &CancellationToken) -> anyhow::Result<()> {
        let spec = self.spec().clone();
        tracing::info!(reader = %spec.name, topic = %spec.topic, "reader running");
        let mut next_commit = Instant::now() + spec.commit_every;
        while !stop.is_cancelled() {
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

    /// Leaves the group on this thread, serving the revocation here, before the consumer
    /// is closed: librdkafka aborts the process when a close finds an assignment still in
    /// progress (librdkafka#4792, `assert: !rd_kafka_assignment_in_progress`; seen once
    /// here, a fanout stopping while its test deleted the topics). Records polled meanwhile
    /// are not applied: their offsets are not committed, so the next owner reads them.
    fn leave_group(&mut self) {
        self.consumer.unsubscribe();
        let deadline = Instant::now() + LEAVE_WAIT;
        while Instant::now() < deadline
            && self
                .consumer
                .assignment()
                .is_ok_and(|assigned| assigned.count() > 0)
        {
            let _ = self.consumer.poll(Duration::from_millis(50));
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
            self.leave_group();
        }
        self.core.shared.health.finish();
        tracing::info!(reader = %self.spec().name, "reader stopped");
    }
}
