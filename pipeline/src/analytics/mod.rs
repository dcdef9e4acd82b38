//! The analytics processor (`pipeline analytics`): chat.events as flat records for SQL
//! engines, one record type per topic (docs/topics.md, "Analytics topics"):
//! `chat.analytics.messages` (every version of every message, compacted by
//! `conversationId:seq`), `chat.analytics.reads` and `.deliveries` (each watermark move)
//! and `chat.analytics.membership` (joins, leaves, role changes).
//!
//! It reads chat.events in a group of its own and gathers rows for `analytics.linger_ms`
//! or `analytics.max_batch` rows ([`rows`]). A batch's edits and deletes get their
//! message's `createdAt` and `threadRootSeq` from PostgreSQL in one statement; then every
//! row is produced, every acknowledgement awaited, and only then are the records'
//! offsets released. At least once: a failure, crash or rebalance writes a batch again;
//! each topic's dedupe key is in its schema's doc. PostgreSQL or Kafka down holds the
//! batch and the reader's position, and is retried (the runtime's hold).

pub mod rows;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::kafka::{CreateGuarded, FutureProducer};
use chatpipe_runtime::{
    CancellationToken, Failure, Position, Processor, ReaderHealth, ReaderSpec, Readiness,
    Supervisor,
};
use chatpipe_schemas::analytics::{member_key, AnalyticsCodecs, AnalyticsIds};
use chatpipe_schemas::contract::{ANALYTICS_MEMBERSHIP, ANALYTICS_MESSAGES, ANALYTICS_READS};
use chatpipe_schemas::ChatEvent;
use chrono::{DateTime, Utc};
use rdkafka::producer::FutureRecord;
use sqlx::PgPool;
use tokio::runtime::Handle;

use crate::settings::{AnalyticsSettings, Settings};
use rows::{Row, Watermarks};

/// What only a message's first version says, for its edits and deletes: from the row
/// PostgreSQL keeps (a deleted message keeps it, without body).
const FIRST_VERSION_SQL: &str = "SELECT m.conversation_id, m.seq, m.created_at, m.thread_root_seq,
        m.edited_at
   FROM unnest($1::bigint[], $2::bigint[]) AS k(c, s)
   JOIN message m ON m.conversation_id = k.c AND m.seq = k.s";

pub struct Analytics {
    handle: Handle,
    pool: PgPool,
    producer: FutureProducer,
    codecs: AnalyticsCodecs,
    cfg: AnalyticsSettings,
    rows: Vec<Row>,
    /// The next offset per partition of the records the batch covers.
    offsets: BTreeMap<i32, i64>,
    /// When the batch's first record came.
    since: Option<Instant>,
    released: Vec<(i32, i64)>,
    watermarks: Watermarks,
}

impl Analytics {
    fn add(&mut self, at: Position, row: Option<Row>) {
        self.rows.extend(row);
        self.offsets.insert(at.partition, at.offset + 1);
        self.since.get_or_insert_with(Instant::now);
    }

    fn due(&self) -> bool {
        self.rows.len() >= self.cfg.max_batch
            || self
                .since
                .is_some_and(|s| s.elapsed() >= Duration::from_millis(self.cfg.linger_ms))
    }

    /// Completes, produces and awaits the batch, then releases its offsets. On failure
    /// the batch stays, to be written again.
    fn write(&mut self) -> Result<(), Failure> {
        if self.offsets.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let rows = std::mem::take(&mut self.rows);
        let written = self.handle.block_on(self.produce(rows));
        let rows = match written {
            Ok(rows) => rows,
            Err((rows, err)) => {
                self.rows = rows;
                metrics::counter!("analytics_write_failures_total").increment(1);
                return Err(Failure::Retriable(err));
            }
        };
        metrics::histogram!("analytics_batch_rows").record(rows as f64);
        metrics::histogram!("analytics_batch_seconds").record(started.elapsed().as_secs_f64());
        self.released.extend(std::mem::take(&mut self.offsets));
        self.since = None;
        Ok(())
    }

    /// The rows, completed and acknowledged by the broker; how many. On failure, the
    /// rows back (completed as far as they got) with the error.
    async fn produce(&self, mut rows: Vec<Row>) -> Result<usize, (Vec<Row>, anyhow::Error)> {
        if let Err(err) = self.complete(&mut rows).await {
            return Err((rows, err));
        }
        let records: Vec<(&str, String, Vec<u8>, &'static str)> = rows
            .iter()
            .map(|row| match row {
                Row::Message(m) => (
                    self.cfg.messages_topic.as_str(),
                    m.key(),
                    self.codecs.message(m),
                    "messages",
                ),
                Row::Read(w) => (
                    self.cfg.reads_topic.as_str(),
                    member_key(w.conversation_id, w.user_id),
                    self.codecs.watermark(w, false),
                    "reads",
                ),
                Row::Delivered(w) => (
                    self.cfg.deliveries_topic.as_str(),
                    member_key(w.conversation_id, w.user_id),
                    self.codecs.watermark(w, true),
                    "deliveries",
                ),
                Row::Membership(m) => (
                    self.cfg.membership_topic.as_str(),
                    member_key(m.conversation_id, m.user_id),
                    self.codecs.membership(m),
                    "membership",
                ),
            })
            .collect();
        let acks = records.iter().map(|(topic, key, payload, _)| {
            self.producer.send(
                FutureRecord::to(topic).key(key).payload(payload),
                Duration::ZERO,
            )
        });
        for ack in futures::future::join_all(acks).await {
            if let Err((e, _)) = ack {
                return Err((rows, anyhow::anyhow!("producing an analytics row: {e}")));
            }
        }
        for (_, _, _, topic) in &records {
            metrics::counter!("analytics_rows_total", "topic" => *topic).increment(1);
        }
        Ok(records.len())
    }

    /// Fills the edits' and deletes' `createdAt` and `threadRootSeq` (and a delete's
    /// `editedAt`) from PostgreSQL; a message it no longer holds keeps them null.
    async fn complete(&self, rows: &mut [Row]) -> anyhow::Result<()> {
        let (mut conversations, mut seqs) = (Vec::new(), Vec::new());
        for row in rows.iter() {
            if let (true, Row::Message(m)) = (row.needs_lookup(), row) {
                conversations.push(m.conversation_id);
                seqs.push(m.seq);
            }
        }
        if conversations.is_empty() {
            return Ok(());
        }
        type First = (i64, i64, DateTime<Utc>, Option<i64>, Option<DateTime<Utc>>);
        let found: Vec<First> = sqlx::query_as(FIRST_VERSION_SQL)
            .bind(&conversations)
            .bind(&seqs)
            .fetch_all(&self.pool)
            .await
            .context("reading the first versions of edited and deleted messages")?;
        let found: BTreeMap<(i64, i64), First> =
            found.into_iter().map(|f| ((f.0, f.1), f)).collect();
        for row in rows.iter_mut() {
            if !row.needs_lookup() {
                continue;
            }
            let Row::Message(m) = row else { continue };
            let Some(&(_, _, created, root, edited)) = found.get(&(m.conversation_id, m.seq))
            else {
                metrics::counter!("analytics_first_version_missing_total").increment(1);
                continue;
            };
            m.created_at = Some(created.timestamp_micros());
            m.thread_root_seq = root;
            if m.deleted_at.is_some() {
                m.edited_at = edited.map(|e| e.timestamp_micros());
            }
        }
        Ok(())
    }
}

impl Processor for Analytics {
    type Record = ChatEvent;

    fn apply(&mut self, at: Position, event: ChatEvent) -> Result<(), Failure> {
        let row = rows::of(&event, at.partition, &mut self.watermarks);
        self.add(at, row);
        Ok(())
    }

    fn skip(&mut self, at: Position, _key: Option<&[u8]>) {
        self.add(at, None);
    }

    fn tick(&mut self) -> Result<(), Failure> {
        if self.due() {
            self.write()?;
        }
        Ok(())
    }

    fn committable(&mut self) -> Vec<(i32, i64)> {
        std::mem::take(&mut self.released)
    }

    fn revoke(&mut self, partitions: &[i32]) {
        if let Err(failure) = self.write() {
            // The next owner reads these records again: rows are written at least once.
            tracing::warn!(
                ?partitions,
                "writing analytics rows on revoke failed: {failure}"
            );
            self.rows.clear();
            self.offsets.clear();
            self.since = None;
        }
        self.watermarks.forget(partitions);
    }

    fn finish(&mut self) -> Result<(), Failure> {
        self.write()
    }
}

/// Runs the analytics processor until `stop` is set. Blocking: call it from a thread.
pub fn run_with(
    settings: &Settings,
    stop: CancellationToken,
    readiness: &Readiness,
) -> anyhow::Result<()> {
    let mut supervisor = Supervisor::new(stop);
    spawn(settings, &mut supervisor, readiness);
    supervisor.wait_blocking()
}

/// Adds the analytics reader to `supervisor`.
pub fn spawn(settings: &Settings, supervisor: &mut Supervisor, readiness: &Readiness) {
    let health = readiness.reader("analytics", "analytics", settings.readers.stall_after());
    let settings = settings.clone();
    supervisor.spawn_thread("analytics", move |stop| run(&settings, &stop, health));
}

fn run(
    settings: &Settings,
    stop: &CancellationToken,
    health: std::sync::Arc<ReaderHealth>,
) -> anyhow::Result<()> {
    let cfg = settings.analytics.clone();
    let thread = settings.reader_thread(health)?;
    let started = thread.start(stop, "analytics: starting", || async {
        let registry = thread.registry();
        let subject = |topic: &str| format!("{topic}-value");
        let messages = registry
            .register_as(&subject(&cfg.messages_topic), &ANALYTICS_MESSAGES)
            .await?;
        let reads = registry
            .register_as(&subject(&cfg.reads_topic), &ANALYTICS_READS)
            .await?;
        let deliveries = registry
            .register_as(&subject(&cfg.deliveries_topic), &ANALYTICS_READS)
            .await?;
        let membership = registry
            .register_as(&subject(&cfg.membership_topic), &ANALYTICS_MEMBERSHIP)
            .await?;
        let pool = settings.database.connect().await?;
        let ids = AnalyticsIds {
            messages,
            reads,
            deliveries,
            membership,
        };
        anyhow::Ok((AnalyticsCodecs::new(ids), pool))
    });
    let Some((codecs, pool)) = started else {
        return Ok(());
    };
    let producer: FutureProducer = settings
        .kafka
        .producer()
        .set("linger.ms", "5")
        .create_guarded()
        .context("creating the analytics producer")?;
    let analytics = Analytics {
        handle: thread.handle(),
        pool,
        producer,
        codecs,
        watermarks: Watermarks::new(cfg.max_tracked_watermarks),
        cfg: cfg.clone(),
        rows: Vec::new(),
        offsets: BTreeMap::new(),
        since: None,
        released: Vec::new(),
    };
    let spec = ReaderSpec::group(
        "analytics",
        "analytics",
        &cfg.events_topic,
        &cfg.group,
        cfg.max_poll_ms,
        &settings.readers,
    );
    tracing::info!(group = %cfg.group, "analytics running");
    thread.run(spec, analytics, stop)
}
