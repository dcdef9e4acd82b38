//! The receipts aggregator (`pipeline receipts`): consumes `chat.read-receipts` (reads)
//! and `chat.delivery-acks` (delivered ticks, [`Mark::Delivered`]; the same record, the
//! same window and flush, on readers of their own), keeps
//! the highest seq per (conversation, user) for one debounce window ([`window`]), then
//! flushes the window as one batched, monotone UPDATE plus `read.updated` outbox events
//! in one transaction ([`flush`]), and only after that COMMIT releases the Kafka offsets.
//! A crash between the two replays the window, which changes nothing. Revoked partitions
//! are flushed before they are given up.
//!
//! It runs on the processor runtime ([`chatpipe_runtime`]): undecodable receipts go to
//! `<topic>.dlq`; a flush that fails (PostgreSQL restarting) is kept and retried with
//! backoff while the reader holds its position, so no receipt answered 202 is lost.

pub mod flush;
pub mod window;

use chatpipe_runtime::CancellationToken;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use anyhow::Context;
use chatpipe_core::outbox::Outbox;
use chatpipe_schemas::receipt::Mark;
use chatpipe_schemas::receipt::ReadReceipt;
use sqlx::PgPool;
use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::settings::Settings;
use chatpipe_runtime::{
    Failure, Position, Processor, ReaderHealth, ReaderSpec, Readiness, Supervisor,
};
use window::{Batch, Window};

/// The aggregator's state and side effect: the open window, the batch being flushed,
/// and the offsets its flushes made safe to commit.
pub struct Receipts {
    mark: Mark,
    handle: Handle,
    pool: PgPool,
    outbox: Outbox,
    window: Window,
    /// Taken from the window, not yet committed to PostgreSQL (a flush failed).
    pending: Option<Batch>,
    released: Vec<(i32, i64)>,
    kill_after_db_commit: bool,
}

impl Receipts {
    /// Flushes the pending batch. On failure it stays pending: nothing is committed and
    /// the reader retries.
    fn flush_pending(&mut self) -> Result<(), Failure> {
        let Some(batch) = &self.pending else {
            return Ok(());
        };
        let started = StdInstant::now();
        let flushed = self
            .handle
            .block_on(flush::flush(&self.pool, &self.outbox, self.mark, batch))
            .context("flushing receipts")
            .map_err(Failure::Retriable)?;
        let keys = batch.watermarks.len();
        let mark = self.mark.label();
        metrics::counter!("receipts_flushes_total", "mark" => mark).increment(1);
        metrics::histogram!("receipts_flush_keys", "mark" => mark).record(keys as f64);
        metrics::counter!("receipts_rows_advanced_total", "mark" => mark)
            .increment(flushed.advanced as u64);
        metrics::counter!("receipts_dropped_non_member_total", "mark" => mark)
            .increment(flushed.from_non_members as u64);
        metrics::histogram!("receipts_flush_duration_seconds", "mark" => mark)
            .record(started.elapsed().as_secs_f64());
        if keys > 0 {
            metrics::gauge!("receipts_collapse_ratio", "mark" => mark)
                .set(batch.receipts as f64 / keys as f64);
        }
        if self.kill_after_db_commit {
            // A fault drill (fault.kill_after_db_commit): die between the two commits.
            tracing::warn!("fault.kill_after_db_commit: SIGKILL after the database commit");
            // SAFETY: raise(3) with a valid signal number has no memory-safety preconditions.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        tracing::debug!(
            keys,
            receipts = batch.receipts,
            advanced = flushed.advanced,
            "flushed"
        );
        let batch = self.pending.take().expect("checked above");
        self.released.extend(batch.offsets);
        Ok(())
    }

    /// Moves `batch` into the pending one.
    fn add_pending(&mut self, batch: Batch) {
        if batch.is_empty() {
            return;
        }
        match &mut self.pending {
            Some(pending) => pending.merge(batch),
            None => self.pending = Some(batch),
        }
    }
}

impl Processor for Receipts {
    type Record = ReadReceipt;

    fn apply(&mut self, at: Position, r: ReadReceipt) -> Result<(), Failure> {
        metrics::counter!("receipts_in_total", "mark" => self.mark.label()).increment(1);
        self.window.add(
            at.partition,
            at.offset,
            (r.conversation_id, r.user_id),
            r.seq,
            Instant::now(),
        );
        Ok(())
    }

    fn skip(&mut self, at: Position, _key: Option<&[u8]>) {
        self.window.skip(at.partition, at.offset, Instant::now());
    }

    fn tick(&mut self) -> Result<(), Failure> {
        if self.pending.is_none() {
            if let Some(due) = self.window.due(Instant::now()) {
                metrics::counter!("receipts_windows_total", "mark" => self.mark.label(), "reason" => due.label())
                    .increment(1);
                self.pending = Some(self.window.take_all());
            }
        }
        self.flush_pending()
    }

    fn committable(&mut self) -> Vec<(i32, i64)> {
        std::mem::take(&mut self.released)
    }

    fn revoke(&mut self, partitions: &[i32]) {
        let revoked = self.window.take(partitions);
        tracing::info!(
            ?partitions,
            keys = revoked.watermarks.len(),
            "flushing revoked partitions"
        );
        self.add_pending(revoked);
        if let Err(failure) = self.flush_pending() {
            // Not committed: the next owner reads these records again. The watermarks
            // stay in the pending batch (applying them later is harmless, the UPDATE is
            // monotone), but their offsets are no longer ours to commit.
            tracing::warn!("flush on revoke failed: {failure}");
            if let Some(pending) = &mut self.pending {
                pending.offsets.retain(|(p, _)| !partitions.contains(p));
            }
        }
    }

    fn finish(&mut self) -> Result<(), Failure> {
        let rest = self.window.take_all();
        self.add_pending(rest);
        self.flush_pending()
    }
}

/// Adds `settings.receipts.concurrency` readers of reads (one group) and as many of
/// delivery acks (another group) to `supervisor`, each on a thread of its own, reporting
/// to `readiness`.
pub fn spawn(settings: &Settings, supervisor: &mut Supervisor, readiness: &Readiness) {
    for mark in [Mark::Read, Mark::Delivered] {
        for i in 0..settings.receipts.concurrency {
            let name = match mark {
                Mark::Read => format!("receipts-{i}"),
                Mark::Delivered => format!("acks-{i}"),
            };
            let health = readiness.reader(&name, "receipts", settings.readers.stall_after());
            let settings = settings.clone();
            supervisor.spawn_thread(name.clone(), move |stop| {
                run_one(&settings, mark, &name, &stop, health)
            });
        }
    }
}

/// Runs the receipts readers until `stop` is cancelled. Blocking: call it from a thread.
pub fn run(settings: &Settings, stop: CancellationToken) -> anyhow::Result<()> {
    run_with(settings, stop, &Readiness::default())
}

/// The same, reporting to `readiness`.
pub fn run_with(
    settings: &Settings,
    stop: CancellationToken,
    readiness: &Readiness,
) -> anyhow::Result<()> {
    let mut supervisor = Supervisor::new(stop);
    spawn(settings, &mut supervisor, readiness);
    supervisor.wait_blocking()
}

fn run_one(
    settings: &Settings,
    mark: Mark,
    name: &str,
    stop: &CancellationToken,
    health: Arc<ReaderHealth>,
) -> anyhow::Result<()> {
    let cfg = &settings.receipts;
    let client = settings
        .kafka
        .client()
        .set("fetch.min.bytes", cfg.fetch_min_bytes.to_string())
        .set("fetch.wait.max.ms", cfg.fetch_wait_max_ms.to_string())
        .clone();
    let thread = settings.reader_thread_with(client, health)?;
    let Some((codec, pool)) = thread.start(stop, name, || async {
        let codec = thread
            .registry()
            .event_codec_for(&settings.registry.events_subject)
            .await?;
        let pool = settings.database.connect().await?;
        anyhow::Ok((codec, pool))
    }) else {
        return Ok(());
    };
    let processor = Receipts {
        mark,
        handle: thread.handle(),
        pool,
        outbox: Outbox::new(codec, settings.outbox.retain_until_confirmed),
        window: Window::new(
            Duration::from_millis(cfg.debounce_window_ms),
            cfg.max_batch_keys,
        )
        .with_quiet(Duration::from_millis(cfg.quiet_flush_ms)),
        pending: None,
        released: Vec::new(),
        kill_after_db_commit: settings.fault.kill_after_db_commit,
    };
    let (topic, group) = match mark {
        Mark::Read => (&cfg.topic, &cfg.group),
        Mark::Delivered => (&cfg.acks_topic, &cfg.acks_group),
    };
    let spec = ReaderSpec::group(
        name,
        "receipts",
        topic,
        group,
        cfg.max_poll_ms,
        &settings.readers,
    );
    thread.run(spec, processor, stop)
}
