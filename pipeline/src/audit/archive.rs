//! The archiver's lag, as the auditor sees it from outside: per `chat.events` partition,
//! how many records the archiver's group (`audit.archive_group`) has not committed, and
//! how old the oldest of them is (the record at its committed offset, read by a consumer
//! of the auditor's own); and, from PostgreSQL, how many messages the conversations the
//! auditor streamed most recently have that `message_archive` does not count as archived,
//! the most per partition.
//! `archive_lagging` fires when a partition's oldest unarchived record is older than
//! `audit.archive_lag_alert_ms`: the retention step then holds more rows in PostgreSQL
//! than the hot window (nothing is lost; the archiver catches up).

use std::time::Duration;

use chatpipe_core::kafka::{BaseConsumer, CreateGuarded};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;
use sqlx::PgPool;

use super::alarm;
use super::alarms::Alarms;
use crate::settings::AuditSettings;

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveLag {
    pub partitions: Vec<PartitionLag>,
    /// Of the conversations sampled (the auditor's most recently streamed), those with
    /// messages not archived, and the most any one lacks.
    pub conversations_behind: usize,
    pub max_seq_behind: i64,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionLag {
    pub partition: i32,
    /// Records on `chat.events` after the archiver's committed offset.
    pub records: i64,
    /// Age of the oldest of them (0: none).
    pub oldest_ms: u64,
    /// The most messages one sampled conversation of this partition lacks in
    /// `message_archive` (its `last_seq` minus its archived seq).
    pub seq_behind: i64,
}

/// The two consumers the reading takes, made once.
pub struct Watch {
    /// With the archiver's group id, to read its committed offsets; it never subscribes,
    /// so it never joins the group.
    offsets: BaseConsumer,
    /// Of the auditor's own, to read the first record not committed.
    peek: BaseConsumer,
    topic: String,
}

impl Watch {
    pub fn new(client: &rdkafka::ClientConfig, cfg: &AuditSettings) -> anyhow::Result<Self> {
        let mut config = client.clone();
        config.set("enable.auto.commit", "false");
        Ok(Self {
            offsets: config
                .clone()
                .set("group.id", &cfg.archive_group)
                .create_guarded()?,
            peek: config
                .set("group.id", format!("{}-audit-peek", cfg.archive_group))
                .create_guarded()?,
            topic: cfg.events_topic.clone(),
        })
    }

    /// Per partition: the records after the group's committed offset and the age of the
    /// first of them. Blocking (librdkafka): call it off the runtime.
    pub fn read(&self, timeout: Duration) -> anyhow::Result<Vec<PartitionLag>> {
        let topic = self.topic.as_str();
        let metadata = self.offsets.fetch_metadata(Some(topic), timeout)?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        let mut tpl = TopicPartitionList::new();
        for &p in &partitions {
            tpl.add_partition(topic, p);
        }
        let committed = self.offsets.committed_offsets(tpl, timeout)?;
        let now_ms = chrono::Utc::now().timestamp_millis();
        let mut lags = Vec::with_capacity(partitions.len());
        for p in partitions {
            let (low, high) = self.offsets.fetch_watermarks(topic, p, timeout)?;
            let at = match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o.max(low),
                _ => low, // nothing committed yet: from the start of what is kept
            };
            let records = (high - at).max(0);
            let oldest_ms = if records > 0 {
                first_timestamp(&self.peek, topic, p, at, timeout)
                    .map_or(0, |ts| (now_ms - ts).max(0) as u64)
            } else {
                0
            };
            lags.push(PartitionLag {
                partition: p,
                records,
                oldest_ms,
                seq_behind: 0,
            });
        }
        Ok(lags)
    }
}

/// The timestamp (ms) of the record at `offset` of partition `p`.
fn first_timestamp(
    peek: &BaseConsumer,
    topic: &str,
    p: i32,
    offset: i64,
    timeout: Duration,
) -> Option<i64> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, p, Offset::Offset(offset))
        .ok()?;
    peek.assign(&tpl).ok()?;
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = peek.poll(Duration::from_millis(200)) {
            if m.partition() == p {
                return m.timestamp().to_millis();
            }
        }
    }
    None
}

/// The conversations among `conversations` (with their `last_seq` in PostgreSQL) that
/// have messages not archived, and how many each lacks.
pub async fn read_sample(
    pool: &PgPool,
    conversations: &[(i64, i64)],
) -> Result<Vec<(i64, i64)>, sqlx::Error> {
    let (ids, last): (Vec<i64>, Vec<i64>) = conversations.iter().copied().unzip();
    sqlx::query_as(
        "SELECT t.id, t.last - coalesce(a.archived_seq, 0)
           FROM unnest($1::BIGINT[], $2::BIGINT[]) AS t(id, last)
           LEFT JOIN message_archive a ON a.conversation_id = t.id
          WHERE t.last > coalesce(a.archived_seq, 0)",
    )
    .bind(ids)
    .bind(last)
    .fetch_all(pool)
    .await
}

impl ArchiveLag {
    /// The lag of `partitions`, with the sampled conversations' `behind` put on the
    /// partition of `chat.events` their records go to (the key's murmur2, as Debezium's
    /// producer partitions).
    pub fn of(mut partitions: Vec<PartitionLag>, behind: &[(i64, i64)]) -> Self {
        let n = partitions.len() as i32;
        for &(conversation, seqs) in behind {
            let p = chatpipe_core::kafka::partition_of(conversation.to_string().as_bytes(), n);
            if let Some(lag) = partitions.iter_mut().find(|l| l.partition == p) {
                lag.seq_behind = lag.seq_behind.max(seqs);
            }
        }
        Self {
            partitions,
            conversations_behind: behind.len(),
            max_seq_behind: behind.iter().map(|&(_, s)| s).max().unwrap_or(0),
        }
    }
}

impl ArchiveLag {
    /// `archive_lagging` and the gauges.
    pub fn judge(&self, cfg: &AuditSettings, alarms: &mut Alarms, now: tokio::time::Instant) {
        let worst = self.partitions.iter().max_by_key(|p| p.oldest_ms);
        let oldest_ms = worst.map_or(0, |p| p.oldest_ms);
        alarms.condition(
            alarm::ARCHIVE_LAGGING,
            oldest_ms >= cfg.archive_lag_alert_ms,
            Duration::ZERO,
            format!(
                "the archiver ({}) has not archived chat.events partition {} for {oldest_ms} ms \
                 ({} records): is `pipeline archive` running, and Cassandra answering?",
                cfg.archive_group,
                worst.map_or(-1, |p| p.partition),
                worst.map_or(0, |p| p.records),
            ),
            now,
        );
        for p in &self.partitions {
            let partition = p.partition.to_string();
            metrics::gauge!("audit_archive_lag_records", "partition" => partition.clone())
                .set(p.records as f64);
            metrics::gauge!("audit_archive_lag_seconds", "partition" => partition.clone())
                .set(p.oldest_ms as f64 / 1e3);
            metrics::gauge!("audit_archive_seq_behind", "partition" => partition)
                .set(p.seq_behind as f64);
        }
    }
}
