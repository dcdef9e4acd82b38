//! The fanout processor (`pipeline fanout`): consumes chat.events, joins each event with
//! the conversation's members ([`members`], kept from the membership events) and with
//! the presence table ([`online`], fed by [`presence`] from the compacted chat.presence),
//! and produces fanout lists to chat.deliveries, one record per gateway on that
//! gateway's partition ([`plan`], [`events`]).
//!
//! Two readers on the processor runtime ([`chatpipe_runtime`]), each on its own thread:
//! `fanout-presence` (every partition of chat.presence, from the beginning) and
//! `fanout-events` (chat.events, shared by the group). Offsets are committed once the
//! lists and changelog writes of the records before them are acknowledged ([`commits`]);
//! on assignment the membership of a partition's conversations is restored from the
//! store's compacted changelog ([`changelog`]), and at most
//! `fanout.max_cached_conversations` of them, with `fanout.max_cached_members` member ids
//! in all, are kept in memory ([`members`]).
//!
//! Pushes are a shortcut, never the only copy: clients catch up over REST. So the
//! guarantees are at least once while the processor runs, and events older than
//! `max_age_ms` are not pushed at all (a new group, or a long outage, does not flood
//! clients with history). Undecodable events go to `<topic>.dlq`, and their conversation
//! is reloaded from PostgreSQL; an outage is waited out, never dead-lettered.

pub mod changelog;
pub mod coalesce;
pub mod commits;
pub mod events;
pub mod members;
pub mod online;
pub mod plan;
pub mod presence;
pub mod state;
pub mod typing;

use chatpipe_runtime::CancellationToken;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::kafka::CreateGuarded;
use chatpipe_schemas::{ChatEvent, ConversationId, UserId};
use rdkafka::consumer::Consumer;
use rdkafka::producer::ThreadedProducer;
use rdkafka::Offset;

use crate::settings::Settings;
use changelog::Changelog;
use chatpipe_runtime::schemas::header_text;
use chatpipe_runtime::{
    retry_until, Decode, Failure, ReaderHealth, ReaderSpec, Readiness, Source, Supervisor,
    WriterSchemas,
};
use commits::{ChangelogWrites, DeliveryReport, Unacked};
use events::{Fanout, Outputs};
use online::Online;
use presence::PresenceTable;

/// A chat.events record as fanout reads it: the event, and the membership version its
/// transaction saw (the EventRouter's `membershipVersion` header, from
/// `outbox.membership_version`; `None` on records written before versions existed), and
/// the trace it belongs to (the `traceparent` header, from `outbox.traceparent`; `None`
/// when its writer exported no spans).
pub struct Versioned {
    pub event: ChatEvent,
    pub membership_version: Option<i64>,
    pub traceparent: Option<String>,
}

impl Decode for Versioned {
    fn decode(
        message: &impl rdkafka::Message,
        schemas: &mut WriterSchemas,
    ) -> Result<Self, Failure> {
        Ok(Self {
            event: ChatEvent::decode(message, schemas)?,
            membership_version: header_text(message, MEMBERSHIP_VERSION_HEADER)
                .and_then(|v| v.parse().ok()),
            traceparent: header_text(message, chatpipe_core::telemetry::TRACEPARENT)
                .map(str::to_owned),
        })
    }
}

/// The header of chat.events records that carries `outbox.membership_version`
/// (`transforms.outbox.table.fields.additional.placement` of the connector).
pub const MEMBERSHIP_VERSION_HEADER: &str = "membershipVersion";

/// What the processor knows, for tests and operators: the presence table it joins with.
#[derive(Debug, Default)]
pub struct Status {
    online: Mutex<Online>,
    /// How far the presence table has read chat.presence: partition -> next offset.
    presence_next: Mutex<HashMap<i32, i64>>,
    /// The chat.events partitions this member joins now, and how many there are.
    joins: Mutex<(std::collections::BTreeSet<i32>, i32)>,
    restored_records: AtomicU64,
    membership_loads: AtomicU64,
    events: AtomicU64,
}

impl Status {
    /// chat.events records processed since start.
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    /// Changelog records read to restore membership since start.
    pub fn restored_records(&self) -> u64 {
        self.restored_records.load(Ordering::Relaxed)
    }

    /// Conversations whose members were loaded from PostgreSQL since start.
    pub fn membership_loads(&self) -> u64 {
        self.membership_loads.load(Ordering::Relaxed)
    }

    /// Whether `user` holds a session on a gateway now (an unexpired lease).
    pub fn is_online(&self, user: UserId, now_ms: i64) -> bool {
        let online = self.online.lock().expect("presence lock");
        online.is_online(user, now_ms)
    }

    /// The presence table has read the record at `at`.
    fn presence_read(&self, at: chatpipe_runtime::Position) {
        let mut next = self.presence_next.lock().expect("presence offsets lock");
        let n = next.entry(at.partition).or_insert(0);
        *n = (*n).max(at.offset + 1);
    }

    /// (chat.presence partition, next offset to apply), by partition.
    fn presence_applied(&self) -> Vec<(i32, i64)> {
        let next = self.presence_next.lock().expect("presence offsets lock");
        let mut applied: Vec<_> = next.iter().map(|(p, o)| (*p, *o)).collect();
        applied.sort_unstable();
        applied
    }

    /// Whether the presence table has read up to `ends` (partition -> end offset).
    fn presence_reached(&self, ends: &HashMap<i32, i64>) -> bool {
        let next = self.presence_next.lock().expect("presence offsets lock");
        ends.iter()
            .all(|(p, end)| next.get(p).is_some_and(|n| n >= end))
    }

    /// The chat.events partitions joined now, and how many chat.events has.
    fn joins(&self) -> (Vec<i32>, i32) {
        let joins = self.joins.lock().expect("joins lock");
        (joins.0.iter().copied().collect(), joins.1)
    }

    fn joined(&self, partitions: &[i32]) {
        self.joins.lock().expect("joins lock").0.extend(partitions);
    }

    fn left(&self, partitions: &[i32]) {
        let mut joins = self.joins.lock().expect("joins lock");
        for p in partitions {
            joins.0.remove(p);
        }
    }

    /// How many of `users` the processor sees online now.
    pub fn online_among(&self, users: &[UserId]) -> usize {
        let now = now_ms();
        let online = self.online.lock().expect("presence lock");
        users.iter().filter(|u| online.is_online(**u, now)).count()
    }
}

/// The conversation a chat.events or changelog key names (a decimal string).
pub fn key_conversation(key: Option<&[u8]>) -> Option<ConversationId> {
    std::str::from_utf8(key?).ok()?.parse().ok()
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Adds fanout's two readers to `supervisor`.
pub fn spawn(
    settings: &Settings,
    supervisor: &mut Supervisor,
    readiness: &Readiness,
    status: Arc<Status>,
) {
    let caught_up = Arc::new(AtomicBool::new(false));
    let stall_after = settings.readers.stall_after();
    {
        let health = readiness.reader("fanout-presence", "fanout_presence", stall_after);
        let (settings, status, caught_up) = (settings.clone(), status.clone(), caught_up.clone());
        supervisor.spawn_thread("fanout-presence", move |stop| {
            run_presence(
                &settings,
                (&stop, health),
                ("fanout-presence", "fanout_presence"),
                (status, caught_up),
                true,
            )
        });
    }
    {
        let health = readiness.reader("fanout-typing", "fanout_typing", stall_after);
        let (settings, status) = (settings.clone(), status.clone());
        supervisor.spawn_thread("fanout-typing", move |stop| {
            run_typing(&settings, &stop, health, status)
        });
    }
    let health = readiness.reader("fanout-events", "fanout", stall_after);
    let settings = settings.clone();
    supervisor.spawn_thread("fanout-events", move |stop| {
        run_events(&settings, &stop, health, status, caught_up)
    });
}

/// The typing reader ([`typing`]): chat.ephemeral, a group of its own.
fn run_typing(
    settings: &Settings,
    stop: &CancellationToken,
    health: Arc<ReaderHealth>,
    status: Arc<Status>,
) -> anyhow::Result<()> {
    let cfg = settings.fanout.clone();
    let thread = settings.reader_thread(health)?;
    let started = thread.start(stop, "fanout-typing: starting", || async {
        let codec = thread
            .registry()
            .delivery_codec_for(&format!("{}-value", cfg.deliveries_topic))
            .await?;
        let pool = settings.database.connect().await?;
        anyhow::Ok((codec, pool))
    });
    let Some((codec, pool)) = started else {
        return Ok(());
    };
    let producer: chatpipe_core::kafka::BaseProducer = settings
        .kafka
        .producer()
        .set("linger.ms", "1")
        // A typing list not delivered within its expiry is worth nothing.
        .set("message.timeout.ms", cfg.typing_expiry_ms.to_string())
        .create_guarded()
        .context("creating the typing producer")?;
    let processor = typing::Typing {
        handle: thread.handle(),
        pool,
        codec,
        producer,
        status,
        members: HashMap::new(),
        pushed: HashMap::new(),
        read: HashMap::new(),
        next_sweep: Instant::now(),
        loads: typing::load_budget(cfg.typing_member_loads_per_sec),
        cfg: cfg.clone(),
    };
    let spec = ReaderSpec::group(
        "fanout-typing",
        "fanout_typing",
        &cfg.ephemeral_topic,
        &cfg.typing_group,
        cfg.max_poll_ms,
        &settings.readers,
    );
    thread.run(spec, processor, stop)
}

/// Runs the fanout processor until `stop` is set. Blocking: call it from a thread.
pub fn run(
    settings: &Settings,
    stop: CancellationToken,
    status: Arc<Status>,
) -> anyhow::Result<()> {
    run_with(settings, stop, status, &Readiness::default())
}

/// The same, reporting to `readiness`.
pub fn run_with(
    settings: &Settings,
    stop: CancellationToken,
    status: Arc<Status>,
    readiness: &Readiness,
) -> anyhow::Result<()> {
    let mut supervisor = Supervisor::new(stop);
    spawn(settings, &mut supervisor, readiness, status);
    supervisor.wait_blocking()
}

/// A reader of all of chat.presence, from the beginning, into `status`'s presence table
/// (named `name`, its metrics `metric`); `caught_up` once it has read what the topic
/// held at start. Fanout's (`acks`: telling the gateways how far it has read), and the
/// notifications processor's.
pub(crate) fn run_presence(
    settings: &Settings,
    (stop, health): (&CancellationToken, Arc<ReaderHealth>),
    (name, metric): (&str, &'static str),
    (status, caught_up): (Arc<Status>, Arc<AtomicBool>),
    acks: bool,
) -> anyhow::Result<()> {
    let cfg = &settings.fanout;
    let thread = settings.reader_thread(health)?;
    let codec = if acks {
        let starting = format!("{name}: the deliveries schema");
        let Some(codec) = thread.start(stop, &starting, || async {
            Ok(thread
                .registry()
                .delivery_codec_for(&format!("{}-value", cfg.deliveries_topic))
                .await?)
        }) else {
            return Ok(());
        };
        Some(codec)
    } else {
        None
    };
    let member = format!("fanout-{}", uuid::Uuid::new_v4());
    let spec = ReaderSpec {
        name: name.into(),
        metric,
        topic: cfg.presence_topic.clone(),
        source: Source::Assigned {
            partition: None,
            start: Offset::Beginning,
        },
        // Every fanout member reads every record: a bad one is counted, not copied.
        dead_letters: None,
        max_poll: Duration::from_millis(cfg.max_poll_ms.max(100)),
        commit_every: settings.readers.commit_interval(),
        settings: settings.readers.clone(),
    };
    let starting = format!("{name}: starting");
    let Some(reader) = retry_until(stop, &settings.readers, &starting, || {
        let acks = match &codec {
            Some(codec) => Some(presence::Acks {
                producer: settings
                    .kafka
                    .producer()
                    .set("linger.ms", "1")
                    .create_guarded()
                    .context("creating the presence.applied producer")?,
                codec: codec.clone(),
                topic: cfg.deliveries_topic.clone(),
                member: member.clone(),
                owed: HashMap::new(),
                known: HashMap::new(),
                told_joins: Vec::new(),
            }),
            None => None,
        };
        let table = PresenceTable {
            status: status.clone(),
            ends: HashMap::new(),
            caught_up: caught_up.clone(),
            acks,
        };
        let reader = thread.reader(spec.clone(), table)?;
        // The table is "caught up" once it has read what the topic held at start.
        let mut ends = HashMap::new();
        for p in reader.partitions()? {
            let (low, high) = reader
                .consumer()
                .fetch_watermarks(&cfg.presence_topic, p, Duration::from_secs(10))
                .with_context(|| format!("watermarks of {}/{p}", cfg.presence_topic))?;
            if high > low {
                ends.insert(p, high);
            }
        }
        reader.with_processor(|t| {
            t.ends = ends;
            t.check_caught_up();
        });
        Ok(reader)
    }) else {
        return Ok(());
    };
    reader.run(stop)
}

/// Waits until the presence table has read what chat.presence held at start (the
/// reader staying healthy meanwhile); `false`: stopped first.
pub(crate) fn wait_caught_up(
    thread: &chatpipe_runtime::ReaderThread,
    stop: &CancellationToken,
    caught_up: &AtomicBool,
) -> bool {
    while !caught_up.load(Ordering::Relaxed) {
        if stop.is_cancelled() {
            return false;
        }
        thread.health().polled();
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The changelog must have a partition for every partition of chat.events (an entry
/// lives on the partition of its conversation's events). Answers how many there are.
fn check_copartitioned(
    kafka: &chatpipe_core::config::KafkaSettings,
    events: &str,
    changelog: &str,
) -> anyhow::Result<usize> {
    let client: chatpipe_core::kafka::BaseConsumer = kafka
        .client()
        .create_guarded()
        .context("creating a metadata client")?;
    let count = |topic: &str| -> anyhow::Result<usize> {
        let metadata = client
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .with_context(|| format!("reading the metadata of {topic}"))?;
        Ok(metadata
            .topics()
            .first()
            .map_or(0, |t| t.partitions().len()))
    };
    let (e, c) = (count(events)?, count(changelog)?);
    anyhow::ensure!(
        e > 0 && c == e,
        "{changelog} has {c} partitions and {events} {e}: they must be equal (create {changelog} compacted with {e})"
    );
    Ok(e)
}

fn run_events(
    settings: &Settings,
    stop: &CancellationToken,
    health: Arc<ReaderHealth>,
    status: Arc<Status>,
    caught_up: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let cfg = settings.fanout.clone();
    let thread = settings.reader_thread(health)?;
    let started = thread.start(stop, "fanout-events: starting", || {
        // Asked of the broker outside the runtime (librdkafka blocks).
        let copartitioned =
            check_copartitioned(&settings.kafka, &cfg.events_topic, &cfg.changelog_topic);
        async {
            let partitions = copartitioned?;
            status.joins.lock().expect("joins lock").1 = i32::try_from(partitions)?;
            let registry = thread.registry();
            let codec = registry
                .delivery_codec_for(&format!("{}-value", cfg.deliveries_topic))
                .await?;
            let changelog = registry
                .fanout_members_codec_for(&format!("{}-value", cfg.changelog_topic))
                .await?;
            let pool = settings.database.connect().await?;
            anyhow::Ok((codec, changelog, pool))
        }
    });
    let Some((codec, changelog_codec, pool)) = started else {
        return Ok(());
    };
    // Join only with a presence table that has read what chat.presence holds.
    if !wait_caught_up(&thread, stop, &caught_up) {
        return Ok(());
    }
    let unacked = Arc::new(Unacked::default());
    let changelog_writes = Arc::new(ChangelogWrites::default());
    let producer: ThreadedProducer<DeliveryReport> = chatpipe_core::kafka::create_with(
        settings.kafka.producer().set("linger.ms", "1").set(
            "queue.buffering.max.messages",
            cfg.produce_queue_max.to_string(),
        ),
        |rebootstrap| DeliveryReport {
            unacked: unacked.clone(),
            changelog: changelog_writes.clone(),
            rebootstrap,
        },
    )
    .context("creating the deliveries producer")?;
    let out = Outputs {
        handle: thread.handle(),
        schemas: WriterSchemas::new(thread.registry().clone(), thread.handle()),
        pool,
        codec,
        producer,
        unacked,
        status,
        kafka: settings.kafka.clone(),
        changelog: Changelog {
            topic: cfg.changelog_topic.clone(),
            codec: changelog_codec,
        },
        changelog_writes,
    };
    let fanout = Fanout::new(out, cfg.clone());
    let spec = ReaderSpec::group(
        "fanout-events",
        "fanout",
        &cfg.events_topic,
        &cfg.group,
        cfg.max_poll_ms,
        &settings.readers,
    );
    tracing::info!(topic = %cfg.events_topic, group = %cfg.group, "fanout running");
    thread.run(spec, fanout, stop)
}
