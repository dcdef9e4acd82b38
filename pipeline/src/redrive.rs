//! `pipeline redrive --topic <source>.dlq`: puts dead letters back on the topic they
//! came from, once the cause is gone (a registry that lost schemas and has them again, a
//! bug fixed in a new release). Each record goes to its `source.topic` and
//! `source.partition` (the headers the readers write, `chatpipe_runtime::dead_letter`) with its
//! key and value unchanged and a `redriven.from` header; the processors' consumers are
//! idempotent (watermarks only move up, pushes carry their seq), so a record applied
//! twice changes nothing.
//!
//! The dead-letter topic is read by a consumer group of its own, `chatpipe-redrive`,
//! which commits after each record is acknowledged by the source topic's leader: a
//! second run redrives only what came since, and a run stopped halfway goes on where it
//! stopped. A run reads up to the ends the topic had when it began, then says how many
//! records it redrove.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Context};
use chatpipe_core::kafka::{BaseConsumer, CreateGuarded, FutureProducer};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};

use crate::settings::Settings;

/// The consumer group whose offsets say what was redriven.
pub const GROUP: &str = "chatpipe-redrive";

#[derive(clap::Args, Debug, Clone)]
pub struct RedriveArgs {
    /// The dead-letter topic, e.g. chat.read-receipts.dlq.
    #[arg(long)]
    pub topic: String,
}

/// Redrives what `args.topic` holds beyond the group's offsets; returns how many
/// records went back.
pub async fn run(settings: &Settings, args: &RedriveArgs) -> anyhow::Result<u64> {
    let dlq = args.topic.clone();
    let Some(default_source) = dlq.strip_suffix(".dlq").map(str::to_owned) else {
        bail!("--topic {dlq}: not a dead-letter topic (its name ends in .dlq)");
    };
    let consumer: BaseConsumer = settings
        .kafka
        .client()
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create_guarded()
        .context("creating the Kafka consumer")?;
    let producer: FutureProducer = settings
        .kafka
        .client()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create_guarded()
        .context("creating the Kafka producer")?;
    let ends = ends(&consumer, &dlq)?;
    let mut start = consumer
        .committed_offsets(from_the_start(&dlq, &ends)?, TIMEOUT)
        .context("reading the group's offsets")?;
    // A partition the group never committed starts at its beginning.
    let fresh: Vec<i32> = start
        .elements_for_topic(&dlq)
        .iter()
        .filter(|e| !matches!(e.offset(), Offset::Offset(_)))
        .map(|e| e.partition())
        .collect();
    for p in fresh {
        start.set_partition_offset(&dlq, p, Offset::Beginning)?;
    }
    consumer
        .assign(&start)
        .context("assigning the partitions")?;

    let mut left: HashMap<i32, i64> = ends.clone();
    for e in start.elements_for_topic(&dlq) {
        if let Offset::Offset(at) = e.offset() {
            if at >= ends[&e.partition()] {
                left.remove(&e.partition());
            }
        }
    }
    left.retain(|_, end| *end > 0);
    let mut redriven = 0u64;
    while !left.is_empty() {
        let message = match consumer.poll(TIMEOUT) {
            Some(m) => m.with_context(|| format!("reading {dlq}"))?,
            None => bail!("no record of {dlq} within {TIMEOUT:?}: is the broker up?"),
        };
        let (partition, offset) = (message.partition(), message.offset());
        let Some(&end) = left.get(&partition) else {
            continue;
        };
        if offset >= end {
            left.remove(&partition);
            continue;
        }
        send_back(&producer, &message, &default_source, &dlq).await?;
        let mut done = TopicPartitionList::new();
        done.add_partition_offset(&dlq, partition, Offset::Offset(offset + 1))?;
        consumer
            .commit(&done, CommitMode::Sync)
            .context("committing the redriven offset")?;
        redriven += 1;
        metrics::counter!("redriven_total").increment(1);
        if offset + 1 >= end {
            left.remove(&partition);
        }
    }
    Ok(redriven)
}

const TIMEOUT: Duration = Duration::from_secs(30);

/// The end offset of each partition of `topic`, as it is now.
fn ends(consumer: &BaseConsumer, topic: &str) -> anyhow::Result<HashMap<i32, i64>> {
    let metadata = consumer
        .fetch_metadata(Some(topic), TIMEOUT)
        .with_context(|| format!("the metadata of {topic}"))?;
    let partitions = metadata.topics().first().map(|t| t.partitions().len());
    let Some(n) = partitions.filter(|n| *n > 0) else {
        bail!("{topic} does not exist");
    };
    (0..n as i32)
        .map(|p| {
            let (_, high) = consumer
                .fetch_watermarks(topic, p, TIMEOUT)
                .with_context(|| format!("the end of {topic}/{p}"))?;
            Ok((p, high))
        })
        .collect()
}

/// Every partition of `topic` in `ends`, at its beginning.
fn from_the_start(topic: &str, ends: &HashMap<i32, i64>) -> anyhow::Result<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for p in ends.keys() {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
    }
    Ok(tpl)
}

/// Produces `message` to the topic and partition its headers name (the topic without
/// `.dlq`, its key's partition, when they are missing) and waits for the ack.
async fn send_back(
    producer: &FutureProducer,
    message: &impl Message,
    default_source: &str,
    dlq: &str,
) -> anyhow::Result<()> {
    // The headers the readers' dead-letter records carry (text; one that is not falls
    // back like a missing one).
    let header = |name: &str| chatpipe_runtime::schemas::header_text(message, name);
    let source = header("source.topic").unwrap_or(default_source);
    let from = format!("{dlq}/{}/{}", message.partition(), message.offset());
    let mut headers = OwnedHeaders::new().insert(Header {
        key: "redriven.from",
        value: Some(&from),
    });
    if let Some(origin) = header("source.offset") {
        headers = headers.insert(Header {
            key: "source.offset",
            value: Some(origin),
        });
    }
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(source).headers(headers);
    if let Some(p) = header("source.partition").and_then(|p| p.parse().ok()) {
        record = record.partition(p);
    }
    if let Some(key) = message.key() {
        record = record.key(key);
    }
    if let Some(payload) = message.payload() {
        record = record.payload(payload);
    }
    producer
        .send(record, Duration::ZERO)
        .await
        .map_err(|(e, _)| anyhow::anyhow!("producing to {source}: {e}"))?;
    Ok(())
}
