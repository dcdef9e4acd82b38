//! The archiver (`pipeline archive`): consumes `chat.events` and writes every message
//! change (`message.new`, `.edited`, `.deleted`) to the cold tier in Cassandra
//! ([`chatpipe_core::cold`]), then records in PostgreSQL's `message_archive` how far each
//! conversation's messages are archived, and only then releases the records' offsets.
//!
//! Changes are gathered for `archive.linger_ms` or `archive.max_batch` changes
//! ([`batch`]) and written with `archive.write_concurrency` requests in flight, the
//! changes of one Cassandra partition in one request (an unlogged single-partition
//! batch of at most `archive.rows_per_write`). Each write carries the change's own time
//! as its Cassandra write timestamp, so the order in which they land does not matter,
//! and a batch written twice (a retry, a replay after a crash, a rebalance) leaves the
//! archive as it was.
//!
//! Cassandra or PostgreSQL down or slow is an outage, never a reason to skip: the batch
//! stays, the reader holds its position and retries with backoff (the runtime's hold).
//! Undecodable records go to `chat.events.dlq`, as for every processor.

pub mod batch;
pub mod retention;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::cold::{Change, Cold, ColdTier, Schema};
use chatpipe_runtime::CancellationToken;
use chatpipe_runtime::{
    Failure, Position, Processor, ReaderHealth, ReaderSpec, Readiness, Supervisor,
};
use chatpipe_schemas::ChatEvent;
use futures::stream::{self, StreamExt, TryStreamExt};
use sqlx::PgPool;
use tokio::runtime::Handle;

use crate::settings::{ArchiveSettings, Settings};
use batch::Batch;

/// Records, per conversation, the highest seq whose message is in Cassandra (it never
/// moves back: a replayed batch records what was recorded before), and, if nothing was
/// waiting to leave PostgreSQL, when the first of these may (`createdAt` + $4 seconds).
pub const PROGRESS_SQL: &str =
    "INSERT INTO message_archive AS a (conversation_id, archived_seq, next_due_at)
     SELECT c, s, to_timestamp(f / 1e6) + make_interval(secs => $4)
       FROM unnest($1::BIGINT[], $2::BIGINT[], $3::BIGINT[]) AS t(c, s, f)
     ON CONFLICT (conversation_id) DO UPDATE
        SET archived_seq = greatest(a.archived_seq, excluded.archived_seq),
            archived_at = now(),
            next_due_at = coalesce(a.next_due_at, excluded.next_due_at)";

pub struct Archiver {
    handle: Handle,
    cold: Cold,
    pool: PgPool,
    cfg: ArchiveSettings,
    batch: Batch,
    released: Vec<(i32, i64)>,
}

impl Archiver {
    /// Writes the batch: Cassandra, then the progress in PostgreSQL. On failure the batch
    /// stays as it is, to be written again.
    fn write(&mut self) -> Result<(), Failure> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let changes = self.batch.changes.len();
        self.handle
            .block_on(write_batch(&self.cold, &self.pool, &self.batch, &self.cfg))
            .map_err(|e| {
                metrics::counter!("archive_write_failures_total").increment(1);
                Failure::Retriable(e)
            })?;
        metrics::counter!("archive_batches_total").increment(1);
        metrics::histogram!("archive_batch_changes").record(changes as f64);
        metrics::histogram!("archive_batch_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        for change in &self.batch.changes {
            metrics::counter!("archive_changes_total", "kind" => change.kind()).increment(1);
        }
        self.released.extend(self.batch.done());
        Ok(())
    }
}

async fn write_batch(
    cold: &Cold,
    pool: &PgPool,
    batch: &Batch,
    cfg: &ArchiveSettings,
) -> anyhow::Result<()> {
    let hot_retention_s = cold.settings().hot_retention_s;
    let requests = batch::requests(
        &batch.changes,
        |change| cold.partition_of(change),
        cfg.rows_per_write,
    );
    for request in &requests {
        metrics::histogram!("archive_write_rows").record(request.len() as f64);
    }
    stream::iter(requests.iter().map(|rows| cold.write_partition(rows)))
        .buffer_unordered(cfg.write_concurrency.max(1))
        .try_collect::<()>()
        .await
        .context("writing to Cassandra")?;
    if batch.archived.is_empty() {
        return Ok(());
    }
    let mut conversations = Vec::with_capacity(batch.archived.len());
    let (mut seqs, mut firsts) = (conversations.clone(), conversations.clone());
    for (&conversation, &(seq, first)) in &batch.archived {
        conversations.push(conversation);
        seqs.push(seq);
        firsts.push(first);
    }
    sqlx::query(PROGRESS_SQL)
        .bind(conversations)
        .bind(seqs)
        .bind(firsts)
        .bind(hot_retention_s as f64)
        .execute(pool)
        .await
        .context("recording the archive's progress in PostgreSQL")?;
    Ok(())
}

impl Processor for Archiver {
    type Record = ChatEvent;

    fn apply(&mut self, at: Position, event: ChatEvent) -> Result<(), Failure> {
        self.batch
            .add(at.partition, at.offset, Change::of(&event), Instant::now());
        Ok(())
    }

    fn skip(&mut self, at: Position, _key: Option<&[u8]>) {
        self.batch
            .add(at.partition, at.offset, None, Instant::now());
    }

    fn tick(&mut self) -> Result<(), Failure> {
        let linger = Duration::from_millis(self.cfg.linger_ms);
        if self.batch.due(Instant::now(), linger, self.cfg.max_batch) {
            self.write()?;
        }
        Ok(())
    }

    fn committable(&mut self) -> Vec<(i32, i64)> {
        std::mem::take(&mut self.released)
    }

    fn revoke(&mut self, partitions: &[i32]) {
        if let Err(failure) = self.write() {
            // The next owner reads these records again; writing them twice is harmless.
            tracing::warn!(?partitions, "archiving on revoke failed: {failure}");
            self.batch.forget_offsets(partitions);
        }
    }

    fn finish(&mut self) -> Result<(), Failure> {
        self.write()
    }
}

/// Adds `archive.concurrency` readers of chat.events (one group) and the retention
/// step to `supervisor`.
pub fn spawn(
    settings: &Settings,
    supervisor: &mut Supervisor,
    readiness: &Readiness,
) -> anyhow::Result<()> {
    let pool = settings.database.connect_lazy()?;
    // The readers make the schema; a conversation is due only once one of them archived.
    let cold = ColdTier::new(&settings.storage, Schema::Expect);
    supervisor.spawn_async(
        "archive-retention",
        retention::run(pool, cold, settings.archive.clone(), supervisor.stop()),
    );
    for i in 0..settings.archive.concurrency {
        let name = format!("archive-{i}");
        let health = readiness.reader(&name, "archive", settings.readers.stall_after());
        let settings = settings.clone();
        supervisor.spawn_thread(name.clone(), move |stop| {
            run_one(&settings, &name, &stop, health)
        });
    }
    Ok(())
}

fn run_one(
    settings: &Settings,
    name: &str,
    stop: &CancellationToken,
    health: Arc<ReaderHealth>,
) -> anyhow::Result<()> {
    let cfg = &settings.archive;
    let thread = settings.reader_thread(health)?;
    let Some((cold, pool)) = thread.start(stop, name, || async {
        let cold = Cold::open(&settings.storage, Schema::Make).await?;
        let pool = settings.database.connect().await?;
        anyhow::Ok((cold, pool))
    }) else {
        return Ok(());
    };
    let archiver = Archiver {
        handle: thread.handle(),
        cold,
        pool,
        cfg: cfg.clone(),
        batch: Batch::default(),
        released: Vec::new(),
    };
    let spec = ReaderSpec::group(
        name,
        "archive",
        &cfg.events_topic,
        &cfg.group,
        cfg.max_poll_ms,
        &settings.readers,
    );
    thread.run(spec, archiver, stop)
}
