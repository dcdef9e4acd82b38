//! The outbox, confirmed: with `outbox.retain_until_confirmed` the services keep every
//! outbox row, and the auditor deletes a row once it has read the row's event on
//! `chat.events` (the EventRouter's `id` header is the row's id). What stays in the table
//! is then exactly what the topic may lack, and `scripts/stack republish-outbox`
//! publishes it again through a Debezium incremental snapshot when the WAL that carried
//! it is lost (docs/operations.md, "Re-publishing the outbox").
//!
//! - [`Confirmer`]: the events reader's side effect. Ids are deleted in batches
//!   (`audit.outbox_confirm_batch` ids, or every `audit.outbox_confirm_interval_ms`), and
//!   a record's offset is committed only after its row's DELETE committed: a crash
//!   reads the records again and deletes nothing twice that matters.
//! - [`Backlog`]: the checker's look at what is left. `outbox_unconfirmed` fires when the
//!   oldest row is older than `audit.outbox_unconfirmed_alert_ms`: its event never
//!   reached the topic (the slot lost it), or nothing confirms (no auditor reads).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::message::Message;
use serde::Serialize;
use sqlx::PgPool;
use tokio::runtime::Handle;
use uuid::Uuid;

use super::alarm;
use super::alarms::Alarms;
use crate::settings::AuditSettings;
use chatpipe_runtime::schemas::header_text;
use chatpipe_runtime::Failure;

/// The outbox row a `chat.events` record came from: the EventRouter's `id` header.
pub fn row_id(message: &impl Message) -> Option<Uuid> {
    header_text(message, "id").and_then(|v| Uuid::parse_str(v).ok())
}

/// Deletes the rows of the events read, in batches, and releases their offsets after.
pub struct Confirmer {
    pool: PgPool,
    handle: Handle,
    batch: usize,
    interval: Duration,
    ids: Vec<Uuid>,
    /// The next offset per partition once `ids` are deleted.
    held: HashMap<i32, i64>,
    since: Option<Instant>,
}

impl Confirmer {
    pub fn new(cfg: &AuditSettings, pool: PgPool, handle: Handle) -> Self {
        Self {
            pool,
            handle,
            batch: cfg.outbox_confirm_batch.max(1),
            interval: Duration::from_millis(cfg.outbox_confirm_interval_ms),
            ids: Vec::new(),
            held: HashMap::new(),
            since: None,
        }
    }

    /// A record was read: its row (if it names one) is to be deleted before `next` is
    /// committed on `partition`.
    pub fn add(&mut self, partition: i32, next: i64, id: Option<Uuid>) {
        self.ids.extend(id);
        let held = self.held.entry(partition).or_insert(next);
        *held = (*held).max(next);
        self.since.get_or_insert_with(Instant::now);
        metrics::gauge!("audit_outbox_confirm_pending").set(self.ids.len() as f64);
    }

    /// A batch is full or has waited its interval.
    pub fn due(&self) -> bool {
        self.ids.len() >= self.batch || self.since.is_some_and(|t| t.elapsed() >= self.interval)
    }

    /// Deletes the pending ids (in statements of at most `batch`) and returns the offsets
    /// that may now be committed. On failure nothing is released and all stays pending.
    pub fn flush(&mut self) -> Result<Vec<(i32, i64)>, Failure> {
        let started = Instant::now();
        let mut deleted = 0u64;
        for chunk in self.ids.chunks(self.batch) {
            deleted += self
                .handle
                .block_on(
                    sqlx::query("DELETE FROM outbox WHERE id = ANY($1)")
                        .bind(chunk)
                        .execute(&self.pool),
                )
                .context("deleting confirmed outbox rows")
                .map_err(Failure::Retriable)?
                .rows_affected();
            metrics::counter!("audit_outbox_confirm_statements_total").increment(1);
        }
        // Rows already gone (a record read twice, a row deleted by its writer) count as
        // seen, not deleted.
        metrics::counter!("audit_outbox_confirmed_total").increment(deleted);
        metrics::counter!("audit_outbox_seen_total").increment(self.ids.len() as u64);
        metrics::histogram!("audit_outbox_confirm_seconds").record(started.elapsed().as_secs_f64());
        self.ids.clear();
        self.since = None;
        metrics::gauge!("audit_outbox_confirm_pending").set(0.0);
        Ok(self.held.drain().collect())
    }

    /// Partitions given away without a flush: their records are read again by the next
    /// owner, which deletes their rows.
    pub fn forget(&mut self, partitions: &[i32]) {
        self.held.retain(|p, _| !partitions.contains(p));
    }
}

/// What is left in the outbox: rows whose events the auditor has not seen.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Backlog {
    /// Rows at most (the span of their positions; deleted rows inside it count).
    pub rows_at_most: i64,
    /// Age of the oldest row, 0 when the table is empty.
    pub oldest_ms: u64,
}

impl Backlog {
    /// Two index lookups, whatever the table's size.
    pub async fn read(pool: &PgPool) -> Result<Self, sqlx::Error> {
        let row: (Option<i64>, Option<f64>) = sqlx::query_as(
            "SELECT max(position) - min(position) + 1,
                    (SELECT extract(epoch FROM clock_timestamp() - created_at)::float8
                       FROM outbox ORDER BY position LIMIT 1)
               FROM outbox",
        )
        .fetch_one(pool)
        .await?;
        Ok(Self {
            rows_at_most: row.0.unwrap_or(0),
            oldest_ms: row.1.map_or(0, |s| (s.max(0.0) * 1e3) as u64),
        })
    }

    /// `outbox_unconfirmed` and the gauges.
    pub fn judge(&self, cfg: &AuditSettings, alarms: &mut Alarms, now: tokio::time::Instant) {
        alarms.condition(
            alarm::OUTBOX_UNCONFIRMED,
            self.oldest_ms >= cfg.outbox_unconfirmed_alert_ms,
            Duration::ZERO,
            format!(
                "the oldest outbox row is {} ms old ({} rows at most): its event is not on \
                 chat.events; scripts/stack republish-outbox (docs/operations.md)",
                self.oldest_ms, self.rows_at_most
            ),
            now,
        );
        metrics::gauge!("audit_outbox_oldest_seconds").set(self.oldest_ms as f64 / 1e3);
        metrics::gauge!("audit_outbox_rows_at_most").set(self.rows_at_most as f64);
    }
}
