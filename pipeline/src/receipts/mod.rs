//! The receipts aggregator (`pipeline receipts`): consumes `chat.read-receipts`, keeps
//! the highest seq per (conversation, user) for one debounce window, then flushes the
//! window as one batched, monotone UPDATE plus `read.updated` outbox events in one
//! transaction, and only after that COMMIT commits the Kafka offsets. A crash between
//! the two replays the window, which changes nothing. Revoked partitions are flushed
//! before they are given up. Undecodable records go to `<topic>.dlq` with the error in
//! headers; the partition keeps flowing.

pub mod flush;
pub mod window;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as StdInstant};

use anyhow::Context;
use chatpipe_core::outbox::Outbox;
use chatpipe_schemas::receipt::ReadReceipt;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::FutureProducer;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use sqlx::PgPool;
use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::settings::Settings;
use crate::streams::{processor_runtime, record_lag, WriterSchemas};
use window::{Batch, Window};

/// What a flush needs, shared by the poll loop and the rebalance callback.
struct Flusher {
    handle: Handle,
    pool: PgPool,
    outbox: Outbox,
    topic: String,
    window: Mutex<Window>,
    kill_after_db_commit: bool,
}

impl Flusher {
    /// Flushes `batch`, then commits its offsets. On a database error nothing is
    /// committed: the records are read again (by this member or the partitions' next
    /// owner) and applied then.
    fn flush_and_commit<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        batch: Batch,
    ) -> anyhow::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let started = StdInstant::now();
        let flushed = self
            .handle
            .block_on(flush::flush(&self.pool, &self.outbox, &batch))
            .context("flushing receipts")?;
        let keys = batch.watermarks.len();
        metrics::counter!("receipts_flushes_total").increment(1);
        metrics::histogram!("receipts_flush_keys").record(keys as f64);
        metrics::counter!("receipts_rows_advanced_total").increment(flushed.advanced as u64);
        metrics::histogram!("receipts_flush_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        if keys > 0 {
            metrics::gauge!("receipts_collapse_ratio").set(batch.receipts as f64 / keys as f64);
        }
        if self.kill_after_db_commit {
            // A fault drill (fault.kill_after_db_commit): die between the two commits.
            tracing::warn!("fault.kill_after_db_commit: SIGKILL after the database commit");
            // SAFETY: raise(3) with a valid signal number has no memory-safety preconditions.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        let mut offsets = TopicPartitionList::new();
        for (partition, offset) in &batch.offsets {
            offsets.add_partition_offset(&self.topic, *partition, Offset::Offset(*offset))?;
        }
        consumer
            .commit(&offsets, CommitMode::Sync)
            .context("committing offsets")?;
        tracing::debug!(
            keys,
            receipts = batch.receipts,
            advanced = flushed.advanced,
            "flushed"
        );
        Ok(())
    }
}

struct ReceiptsContext {
    flusher: Arc<Flusher>,
}

impl ClientContext for ReceiptsContext {
    /// Consumer lag per partition, from librdkafka's statistics (no broker round trip:
    /// a watermark query would queue behind the long-poll fetch and stall the loop).
    fn stats(&self, statistics: rdkafka::Statistics) {
        record_lag(&statistics, &self.flusher.topic, "receipts_consumer_lag");
    }
}

impl ConsumerContext for ReceiptsContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(revoked) = rebalance {
            let partitions: Vec<i32> = revoked.elements().iter().map(|e| e.partition()).collect();
            let batch = self
                .flusher
                .window
                .lock()
                .expect("window lock")
                .take(&partitions);
            tracing::info!(
                ?partitions,
                keys = batch.watermarks.len(),
                "partitions revoked: flushing them first"
            );
            if let Err(err) = self.flusher.flush_and_commit(consumer, batch) {
                // Not committed: the next owner reads these records again.
                tracing::error!("flush on revoke failed: {err:#}");
            }
        }
    }
}

/// Runs `settings.receipts.concurrency` consumers of one group until `stop` is set.
/// Blocking: call it from a thread of its own.
pub fn run(settings: &Settings, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let threads: Vec<_> = (0..settings.receipts.concurrency)
        .map(|i| {
            let (settings, stop) = (settings.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("receipts-{i}"))
                .spawn(move || run_one(&settings, stop))
                .expect("spawning a consumer thread")
        })
        .collect();
    let mut result = Ok(());
    for t in threads {
        let r = t
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("a receipts consumer panicked")));
        if let Err(err) = &r {
            tracing::error!("a receipts consumer stopped: {err:#}");
            stop.store(true, Ordering::Relaxed);
            result = r;
        }
    }
    result
}

fn run_one(settings: &Settings, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let cfg = &settings.receipts;
    // The rebalance callback block_ons a flush from inside poll: see processor_runtime.
    let (rt, registry) = processor_runtime(settings)?;
    let (codec, pool) = rt.block_on(async {
        let codec = registry
            .event_codec_for(&settings.registry.events_subject)
            .await?;
        let pool = settings.database.connect().await?;
        anyhow::Ok((codec, pool))
    })?;
    let decoder = registry.event_decoder();
    let flusher = Arc::new(Flusher {
        handle: rt.handle().clone(),
        pool,
        outbox: Outbox::new(codec, settings.outbox.delete_after_write),
        topic: cfg.topic.clone(),
        window: Mutex::new(Window::new(
            Duration::from_millis(cfg.debounce_window_ms),
            cfg.max_batch_keys,
        )),
        kill_after_db_commit: settings.fault.kill_after_db_commit,
    });
    let consumer: BaseConsumer<ReceiptsContext> =
        chatpipe_core::kafka::consumer_config(&settings.kafka.brokers, &cfg.group)
            .set("statistics.interval.ms", "5000")
            .set("max.poll.interval.ms", "60000")
            .create_with_context(ReceiptsContext {
                flusher: flusher.clone(),
            })
            .context("creating the receipts consumer")?;
    consumer.subscribe(&[&cfg.topic]).context("subscribing")?;
    let dlq: FutureProducer = chatpipe_core::kafka::producer_config(&settings.kafka.brokers)
        .create()
        .context("creating the DLQ producer")?;
    let dlq_topic = format!("{}.dlq", cfg.topic);
    tracing::info!(topic = %cfg.topic, group = %cfg.group, "receipts aggregator running");

    let poll = Duration::from_millis(cfg.max_poll_ms);
    let mut schemas = WriterSchemas::new(decoder, rt.handle().clone());
    while !stop.load(Ordering::Relaxed) {
        match consumer.poll(poll) {
            Some(Ok(message)) => take_in(&message, &mut schemas, &rt, &flusher, &dlq, &dlq_topic)?,
            // Consumer errors (a broker restarting, a partition moving) are transient: the
            // client retries by itself; we report and keep polling.
            Some(Err(err)) => {
                metrics::counter!("receipts_consumer_errors_total").increment(1);
                tracing::warn!("consumer: {err}");
            }
            None => {}
        }
        let due = flusher
            .window
            .lock()
            .expect("window lock")
            .due(Instant::now());
        if due {
            let batch = flusher.window.lock().expect("window lock").take_all();
            flusher.flush_and_commit(&consumer, batch)?;
        }
    }
    // Leaving: flush what we hold, so nothing waits for a rebalance to be applied.
    let batch = flusher.window.lock().expect("window lock").take_all();
    flusher.flush_and_commit(&consumer, batch)?;
    consumer.unsubscribe();
    Ok(())
}

/// One record into the window, or into the dead-letter topic.
fn take_in(
    message: &BorrowedMessage<'_>,
    schemas: &mut WriterSchemas,
    rt: &tokio::runtime::Runtime,
    flusher: &Flusher,
    dlq: &FutureProducer,
    dlq_topic: &str,
) -> anyhow::Result<()> {
    let (partition, offset) = (message.partition(), message.offset());
    let decoded = match message.payload() {
        Some(bytes) => schemas
            .of(bytes)
            .and_then(|w| ReadReceipt::decode_with(w, bytes).map_err(|e| e.to_string())),
        None => Err("record without a value".to_owned()),
    };
    let now = Instant::now();
    match decoded {
        Ok(r) if r.conversation_id > 0 && r.user_id > 0 && r.seq > 0 => {
            metrics::counter!("receipts_in_total").increment(1);
            flusher.window.lock().expect("window lock").add(
                partition,
                offset,
                (r.conversation_id, r.user_id),
                r.seq,
                now,
            );
        }
        Ok(r) => dead_letter(
            message,
            &format!("receipt out of range: {r:?}"),
            rt,
            dlq,
            dlq_topic,
            flusher,
            now,
        )?,
        Err(error) => dead_letter(message, &error, rt, dlq, dlq_topic, flusher, now)?,
    }
    Ok(())
}

fn dead_letter(
    message: &BorrowedMessage<'_>,
    error: &str,
    rt: &tokio::runtime::Runtime,
    dlq: &FutureProducer,
    dlq_topic: &str,
    flusher: &Flusher,
    now: Instant,
) -> anyhow::Result<()> {
    let (partition, offset) = (message.partition(), message.offset());
    tracing::warn!(
        partition,
        offset,
        error,
        "undecodable receipt: to {dlq_topic}"
    );
    // The record must be in the DLQ (acks=all) before its offset can be committed; if it
    // cannot get there, the processor stops rather than drop it.
    rt.block_on(chatpipe_core::kafka::dead_letter(
        dlq, dlq_topic, message, error,
    ))?;
    metrics::counter!("receipts_dlq_total").increment(1);
    flusher
        .window
        .lock()
        .expect("window lock")
        .skip(partition, offset, now);
    Ok(())
}
