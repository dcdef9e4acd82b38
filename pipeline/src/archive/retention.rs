//! The retention step: moves archived messages older than `storage.hot_retention_s` out
//! of PostgreSQL. It runs in `pipeline archive`, every `archive.retention_interval_ms`,
//! on the conversations `message_archive` says are due.
//!
//! A row leaves only after it was compared with Cassandra's copy, every column, and
//! found equal: it is deleted together with its `changed_xid`, so a row changed after the
//! comparison stays (the DELETE then removes fewer rows than planned, and the whole
//! sweep of that conversation is rolled back). Rows leave as a contiguous run from
//! `cold_through + 1`, and `cold_through` moves in the same transaction, so PostgreSQL
//! always holds exactly the messages after it (plus rows an edit or delete brought
//! back, which leave the same way once Cassandra has their change). A row the archiver
//! has not written, or not in its latest version, never leaves.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::cold::{ColdRow, ColdTier};
use chatpipe_runtime::CancellationToken;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::settings::ArchiveSettings;

/// A message row as PostgreSQL holds it, times in µs.
#[derive(Debug, Clone, PartialEq)]
pub struct HotRow {
    pub seq: i64,
    pub sender: i64,
    pub client_msg_id: uuid::Uuid,
    pub body: Option<String>,
    pub created_at: i64,
    pub edited_at: Option<i64>,
    pub deleted_at: Option<i64>,
    pub deleted_by: Option<i64>,
    pub thread_root: Option<i64>,
    /// Old enough to leave: its latest version (created, edited or deleted) is older than
    /// the hot retention. A change stays in PostgreSQL that long, so `/sync` (whose
    /// changes are read there) reports it to a client whose cursor is younger.
    pub old_enough: bool,
    /// The transaction that last changed it, as text.
    pub changed_xid: String,
}

impl HotRow {
    /// The time of its latest version (µs).
    pub fn changed_at(&self) -> i64 {
        self.deleted_at
            .or(self.edited_at)
            .unwrap_or(self.created_at)
    }

    /// Cassandra's copy holds exactly this version.
    pub fn equals(&self, cold: &ColdRow) -> bool {
        let (
            seq,
            sender,
            client_msg_id,
            body,
            created_at,
            edited_at,
            deleted_at,
            deleted_by,
            thread_root,
        ) = cold;
        *seq == self.seq
            && *sender == Some(self.sender)
            && *client_msg_id == Some(self.client_msg_id)
            && *body == self.body
            && *created_at == Some(self.created_at)
            && *edited_at == self.edited_at
            && *deleted_at == self.deleted_at
            && *deleted_by == self.deleted_by
            && *thread_root == self.thread_root
    }
}

/// When to look at a conversation again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing archived is left in PostgreSQL: when the archiver writes more.
    Idle,
    /// A row becomes old enough at this time (µs).
    At(i64),
    /// A row differs from Cassandra's copy (its change is not archived yet): soon.
    Retry,
    /// The sweep stopped at its batch size: at once.
    Now,
}

impl Next {
    /// The sooner of two (a retry counts as sooner than a row's time: it looks again
    /// within `archive.retention_retry_ms` and finds that row then).
    fn sooner(self, other: Self) -> Self {
        use Next::*;
        match (self, other) {
            (Now, _) | (_, Now) => Now,
            (Retry, _) | (_, Retry) => Retry,
            (At(a), At(b)) => At(a.min(b)),
            (At(a), Idle) | (Idle, At(a)) => At(a),
            (Idle, Idle) => Idle,
        }
    }
}

/// What one sweep of one conversation does.
#[derive(Debug, PartialEq)]
pub struct Sweep {
    /// (seq, changed_xid) of the rows to delete.
    pub delete: Vec<(i64, String)>,
    pub cold_through: i64,
    pub next: Next,
    /// Rows kept because Cassandra's copy differs.
    pub differs: usize,
}

/// Plans a sweep: `rows` are the conversation's rows with seq up to its archived seq,
/// ascending (`batch_full`: there may be more), `cold` Cassandra's rows by seq.
pub fn plan(
    cold_through: i64,
    rows: &[HotRow],
    cold: &HashMap<i64, ColdRow>,
    hot_retention_us: i64,
    batch_full: bool,
) -> Sweep {
    let mut sweep = Sweep {
        delete: Vec::new(),
        cold_through,
        next: if batch_full { Next::Now } else { Next::Idle },
        differs: 0,
    };
    let same = |row: &HotRow| cold.get(&row.seq).is_some_and(|c| row.equals(c));
    let young = |row: &HotRow| Next::At(row.changed_at() + hot_retention_us);
    // Rows an edit or delete brought back: they leave once their change is old enough
    // and Cassandra has it.
    for row in rows.iter().filter(|r| r.seq <= cold_through) {
        if !row.old_enough {
            sweep.next = sweep.next.sooner(young(row));
        } else if same(row) {
            sweep.delete.push((row.seq, row.changed_xid.clone()));
        } else {
            sweep.differs += 1;
            sweep.next = sweep.next.sooner(Next::Retry);
        }
    }
    let mut waiting = rows.iter().filter(|r| r.seq > cold_through).peekable();
    while let Some(row) = waiting.next_if(|r| r.seq == sweep.cold_through + 1) {
        if !row.old_enough {
            sweep.next = sweep.next.sooner(young(row));
            return sweep;
        }
        if !same(row) {
            sweep.differs += 1;
            sweep.next = sweep.next.sooner(Next::Retry);
            return sweep;
        }
        sweep.delete.push((row.seq, row.changed_xid.clone()));
        sweep.cold_through = row.seq;
    }
    if waiting.peek().is_some() {
        // A seq missing between cold_through and the archived seq: not ours to judge.
        sweep.next = sweep.next.sooner(Next::Retry);
    }
    sweep
}

const DUE_SQL: &str = "SELECT conversation_id FROM message_archive
      WHERE next_due_at <= now() ORDER BY next_due_at LIMIT $1";

const LOCK_SQL: &str = "SELECT cold_through, archived_seq FROM message_archive
      WHERE conversation_id = $1 AND next_due_at <= now() FOR UPDATE SKIP LOCKED";

const ROWS_SQL: &str = "SELECT seq, sender_id, client_msg_id, body, created_at, edited_at,
            deleted_at, deleted_by, thread_root_seq,
            coalesce(deleted_at, edited_at, created_at) < now() - make_interval(secs => $3)
              AS old_enough,
            changed_xid::text AS changed_xid
       FROM message WHERE conversation_id = $1 AND seq <= $2 ORDER BY seq LIMIT $4";

/// Deletes the rows `$2` (at their changed_xid `$3`), keeping which of them were replies
/// of which thread (`archived_reply`: thread pages find their archived replies there);
/// answers how many rows it deleted.
const DELETE_SQL: &str = "WITH gone AS (
        DELETE FROM message WHERE conversation_id = $1
           AND (seq, changed_xid::text) IN (SELECT * FROM unnest($2::BIGINT[], $3::TEXT[]))
        RETURNING conversation_id, seq, thread_root_seq),
     replies AS (
        INSERT INTO archived_reply (conversation_id, root_seq, seq)
        SELECT conversation_id, thread_root_seq, seq FROM gone WHERE thread_root_seq IS NOT NULL
        ON CONFLICT DO NOTHING)
     SELECT count(*) FROM gone";

/// Also records the newest change moved out (`$4`, a changed_xid), for `/sync`.
const MOVE_SQL: &str = "UPDATE message_archive SET cold_through = $2, next_due_at = $3,
            moved_xid = greatest(moved_xid, $4::text::xid8)
      WHERE conversation_id = $1";

type RowTuple = (
    i64,
    i64,
    uuid::Uuid,
    Option<String>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<i64>,
    Option<i64>,
    bool,
    String,
);

fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

/// Runs rounds every `archive.retention_interval_ms` until `stop`. A round that fails
/// (PostgreSQL or Cassandra down) is counted and tried again at the next interval.
pub async fn run(
    pool: PgPool,
    cold: ColdTier,
    cfg: ArchiveSettings,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let interval = Duration::from_millis(cfg.retention_interval_ms);
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(interval) => {}
        }
        let started = Instant::now();
        match round(&pool, &cold, &cfg).await {
            Ok(moved) => {
                metrics::counter!("archive_retention_moved_total").increment(moved as u64);
                metrics::histogram!("archive_retention_round_seconds")
                    .record(started.elapsed().as_secs_f64());
            }
            Err(e) => {
                metrics::counter!("archive_retention_failures_total").increment(1);
                tracing::warn!("retention round failed (tried again in {interval:?}): {e:#}");
            }
        }
    }
}

/// One round over the due conversations (at most `archive.retention_conversations`).
/// Returns the rows moved out of PostgreSQL.
pub async fn round(pool: &PgPool, cold: &ColdTier, cfg: &ArchiveSettings) -> anyhow::Result<usize> {
    let due: Vec<i64> = sqlx::query_scalar(DUE_SQL)
        .bind(cfg.retention_conversations as i64)
        .fetch_all(pool)
        .await
        .context("reading the conversations due")?;
    let mut moved = 0;
    for conversation in due {
        moved += sweep(pool, cold, cfg, conversation).await?;
    }
    Ok(moved)
}

/// Sweeps one conversation in one transaction.
async fn sweep(
    pool: &PgPool,
    cold: &ColdTier,
    cfg: &ArchiveSettings,
    conversation: i64,
) -> anyhow::Result<usize> {
    let mut tx = pool.begin().await?;
    let Some((cold_through, archived_seq)): Option<(i64, i64)> = sqlx::query_as(LOCK_SQL)
        .bind(conversation)
        .fetch_optional(&mut *tx)
        .await?
    else {
        return Ok(0); // another sweeper has it, or it is no longer due
    };
    let hot_retention_s = cold.settings().hot_retention_s;
    let rows: Vec<RowTuple> = sqlx::query_as(ROWS_SQL)
        .bind(conversation)
        .bind(archived_seq)
        .bind(hot_retention_s as f64)
        .bind(cfg.retention_batch as i64)
        .fetch_all(&mut *tx)
        .await?;
    let rows: Vec<HotRow> = rows.into_iter().map(hot_row).collect();
    let copies = match (rows.first(), rows.last()) {
        (Some(first), Some(last)) => cold
            .get()
            .await?
            .range(conversation, first.seq, last.seq)
            .await
            .context("reading Cassandra's copies")?,
        _ => Vec::new(),
    };
    let copies: HashMap<i64, ColdRow> = copies.into_iter().map(|c| (c.0, c)).collect();
    let batch_full = rows.len() >= cfg.retention_batch;
    let hot_retention_us = i64::try_from(hot_retention_s)
        .unwrap_or(i64::MAX / 2_000_000)
        .saturating_mul(1_000_000);
    let sweep = plan(cold_through, &rows, &copies, hot_retention_us, batch_full);
    if sweep.differs > 0 {
        metrics::counter!("archive_retention_kept_total", "reason" => "differs")
            .increment(sweep.differs as u64);
    }
    let (seqs, xids): (Vec<i64>, Vec<String>) = sweep.delete.iter().cloned().unzip();
    let deleted: i64 = sqlx::query_scalar(DELETE_SQL)
        .bind(conversation)
        .bind(&seqs)
        .bind(&xids)
        .fetch_one(&mut *tx)
        .await?;
    let deleted = deleted as usize;
    if deleted != seqs.len() {
        // A row changed since it was compared: nothing of this sweep happens.
        metrics::counter!("archive_retention_kept_total", "reason" => "changed")
            .increment(seqs.len() as u64);
        tx.rollback().await?;
        return Ok(0);
    }
    let next_due: Option<DateTime<Utc>> = match sweep.next {
        Next::Idle => None,
        Next::Now => Some(Utc::now()),
        Next::Retry => Some(Utc::now() + Duration::from_millis(cfg.retention_retry_ms)),
        Next::At(us) => DateTime::from_timestamp_micros(us),
    };
    let newest_moved = xids.iter().filter_map(|x| x.parse::<u64>().ok()).max();
    sqlx::query(MOVE_SQL)
        .bind(conversation)
        .bind(sweep.cold_through)
        .bind(next_due)
        .bind(newest_moved.map(|x| x.to_string()))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(deleted)
}

fn hot_row(r: RowTuple) -> HotRow {
    HotRow {
        seq: r.0,
        sender: r.1,
        client_msg_id: r.2,
        body: r.3,
        created_at: micros(r.4),
        edited_at: r.5.map(micros),
        deleted_at: r.6.map(micros),
        deleted_by: r.7,
        thread_root: r.8,
        old_enough: r.9,
        changed_xid: r.10,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hot(seq: i64, old_enough: bool) -> HotRow {
        HotRow {
            seq,
            sender: 1,
            client_msg_id: uuid::Uuid::nil(),
            body: Some(format!("m{seq}")),
            created_at: seq * 10,
            edited_at: None,
            deleted_at: None,
            deleted_by: None,
            thread_root: None,
            old_enough,
            changed_xid: format!("x{seq}"),
        }
    }

    fn copy(row: &HotRow) -> ColdRow {
        (
            row.seq,
            Some(row.sender),
            Some(row.client_msg_id),
            row.body.clone(),
            Some(row.created_at),
            row.edited_at,
            row.deleted_at,
            row.deleted_by,
            row.thread_root,
        )
    }

    fn copies(rows: &[HotRow]) -> HashMap<i64, ColdRow> {
        rows.iter().map(|r| (r.seq, copy(r))).collect()
    }

    #[test]
    fn a_contiguous_run_of_old_equal_rows_leaves_and_the_first_young_one_sets_the_time() {
        let rows = vec![hot(4, true), hot(5, true), hot(6, false), hot(7, false)];
        let sweep = plan(3, &rows, &copies(&rows), 100, false);
        assert_eq!(sweep.delete, vec![(4, "x4".into()), (5, "x5".into())]);
        assert_eq!(sweep.cold_through, 5);
        assert_eq!(sweep.next, Next::At(60 + 100));
    }

    #[test]
    fn a_row_whose_change_cassandra_lacks_stops_the_run_and_is_retried() {
        let rows = vec![hot(1, true), hot(2, true), hot(3, true)];
        let mut cold = copies(&rows);
        cold.get_mut(&2).unwrap().3 = Some("before the edit".into());
        let sweep = plan(0, &rows, &cold, 100, false);
        assert_eq!(sweep.delete, vec![(1, "x1".into())]);
        assert_eq!(
            (sweep.cold_through, sweep.next, sweep.differs),
            (1, Next::Retry, 1)
        );
        // A row Cassandra does not hold at all: the same.
        cold.remove(&1);
        let sweep = plan(0, &rows, &cold, 100, false);
        assert_eq!((sweep.delete.len(), sweep.cold_through), (0, 0));
    }

    #[test]
    fn a_row_brought_back_leaves_once_equal_and_a_full_batch_comes_back_at_once() {
        let mut rows = vec![hot(2, true), hot(9, true), hot(10, true)];
        let sweep = plan(8, &rows, &copies(&rows), 100, true);
        assert_eq!(sweep.delete.len(), 3);
        assert_eq!((sweep.cold_through, sweep.next), (10, Next::Now));
        let cold = copies(&rows);
        // Seq 2 deleted since: its delete is not archived yet.
        (rows[0].body, rows[0].deleted_at, rows[0].deleted_by) = (None, Some(25), Some(1));
        let sweep = plan(8, &rows, &cold, 100, false);
        assert_eq!(sweep.delete.len(), 2);
        assert_eq!((sweep.cold_through, sweep.next), (10, Next::Retry));
    }

    #[test]
    fn a_row_brought_back_stays_while_its_change_is_young() {
        let mut rows = vec![hot(2, false), hot(9, true)];
        rows[0].edited_at = Some(500);
        let sweep = plan(8, &rows, &copies(&rows), 100, false);
        assert_eq!(sweep.delete, vec![(9, "x9".into())]);
        assert_eq!((sweep.cold_through, sweep.next), (9, Next::At(600)));
    }

    #[test]
    fn a_gap_after_cold_through_moves_nothing() {
        let rows = vec![hot(5, true)];
        let sweep = plan(3, &rows, &copies(&rows), 100, false);
        assert!(sweep.delete.is_empty());
        assert_eq!((sweep.cold_through, sweep.next), (3, Next::Retry));
    }
}
