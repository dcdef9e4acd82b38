//! History pages across the two tiers. PostgreSQL holds a conversation's messages after
//! its `message_archive.cold_through` (and any older one an edit or delete brought
//! back); Cassandra holds every archived one ([`chatpipe_core::cold`]). One statement
//! reads PostgreSQL's rows of the page and `cold_through` in one snapshot; if the page
//! reaches at or below `cold_through`, Cassandra's rows of that range are read too, and
//! the two are merged by seq, PostgreSQL's row winning where both have one.
//!
//! Cassandra unreachable: a page that needs it fails with
//! [`StoreError::ColdUnavailable`] (503, `Retry-After`), never a short page; a page
//! that does not is served.

use std::collections::BTreeMap;

use chatpipe_core::cold::{ColdRow, Start};
use chatpipe_core::{ConversationId, UserId};
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::messages::{HistoryMessage, MESSAGE_COLUMNS};
use super::{Store, StoreError};

/// Where a history page starts.
#[derive(Debug, Clone, Copy)]
pub enum Page {
    /// The newest messages.
    Newest,
    /// Messages with seq < this, newest first (paging backwards).
    Before(i64),
    /// Messages with seq > this, oldest first (filling a gap).
    After(i64),
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryPage {
    /// Always in ascending seq order.
    pub messages: Vec<HistoryMessage>,
    /// More messages exist in the direction of the page: older ones for `Newest` and
    /// `Before`, newer ones for `After`.
    pub has_more: bool,
    pub last_seq: i64,
}

/// The page's rows in PostgreSQL before `$2` (newest first), with the conversation's
/// `cold_through` on every row (one row of NULLs when there is no message). Like every
/// statement on `message`, it names one conversation (`$1`), so it reads one partition
/// (tests/ingest_api/partitions.rs).
pub fn descending() -> String {
    page_sql("seq < $2 ORDER BY seq DESC")
}

/// The same after `$2` (oldest first).
pub fn ascending() -> String {
    page_sql("seq > $2 ORDER BY seq ASC")
}

fn page_sql(range: &str) -> String {
    format!(
        "SELECT a.cold_through, m.*
           FROM (SELECT coalesce((SELECT cold_through FROM message_archive
                                   WHERE conversation_id = $1), 0) AS cold_through) a
           LEFT JOIN LATERAL (SELECT {MESSAGE_COLUMNS} FROM message
                               WHERE conversation_id = $1 AND {range} LIMIT $3) m ON true"
    )
}

/// A row of [`descending`] or [`ascending`].
#[derive(sqlx::FromRow)]
struct PageRow {
    cold_through: i64,
    seq: Option<i64>,
    sender_id: Option<i64>,
    client_msg_id: Option<Uuid>,
    body: Option<String>,
    created_at: Option<DateTime<Utc>>,
    edited_at: Option<DateTime<Utc>>,
    deleted: Option<bool>,
    deleted_at: Option<DateTime<Utc>>,
    thread_root_seq: Option<i64>,
}

impl PageRow {
    fn message(self) -> Option<HistoryMessage> {
        Some(HistoryMessage {
            seq: self.seq?,
            sender_id: self.sender_id?,
            client_msg_id: self.client_msg_id?,
            body: self.body,
            created_at: self.created_at?,
            edited_at: self.edited_at,
            deleted: self.deleted.unwrap_or(false),
            deleted_at: self.deleted_at,
            thread_root_seq: self.thread_root_seq,
            ..Default::default()
        })
    }
}

/// An archived row as history answers it; `None` for a row missing a column (a change
/// archived whose `message.new` is not).
pub fn cold_message(row: ColdRow) -> Option<HistoryMessage> {
    let (seq, sender, client_msg_id, body, created_at, edited_at, deleted_at, _, thread_root) = row;
    let at = |us: i64| DateTime::from_timestamp_micros(us);
    Some(HistoryMessage {
        seq,
        sender_id: sender?,
        client_msg_id: client_msg_id?,
        body,
        created_at: at(created_at?)?,
        edited_at: edited_at.and_then(at),
        deleted: deleted_at.is_some(),
        deleted_at: deleted_at.and_then(at),
        thread_root_seq: thread_root,
        ..Default::default()
    })
}

pub async fn history(
    db: &Store,
    conversation: ConversationId,
    reader: UserId,
    page: Page,
    limit: i64,
) -> Result<HistoryPage, StoreError> {
    let last_seq = super::as_member(db, conversation, reader).await?.last_seq;

    // One more row than asked tells whether more exist. Both walk the primary key.
    let (sql, bound) = match page {
        Page::Newest => (descending(), i64::MAX),
        Page::Before(seq) => (descending(), seq),
        Page::After(seq) => (ascending(), seq),
    };
    let want = limit as usize + 1;
    let rows: Vec<PageRow> = sqlx::query_as(&sql)
        .bind(conversation.get())
        .bind(bound)
        .bind(want as i64)
        .fetch_all(&db.pool)
        .await?;
    let cold_through = rows.first().map_or(0, |r| r.cold_through);
    let hot: Vec<HistoryMessage> = rows.into_iter().filter_map(PageRow::message).collect();
    let ascending = matches!(page, Page::After(_));
    // The archived seqs the page may reach: [1, bound) or (bound, ∞), up to cold_through.
    let (from, to) = if ascending {
        (bound + 1, cold_through)
    } else {
        (1, (bound - 1).min(cold_through))
    };
    // Newest first, PostgreSQL's rows all above cold_through and as many as wanted: the
    // page ends before the archive.
    let hot_suffices = !ascending && hot.len() == want && hot[want - 1].seq > cold_through;
    let mut messages = if from > to || hot_suffices {
        hot
    } else {
        let start = if ascending {
            Start::Oldest
        } else {
            Start::Newest
        };
        let cold = db
            .cold
            .get()
            .await
            .map_err(StoreError::ColdUnavailable)?
            .page(conversation.get(), from, to, start, want)
            .await
            .map_err(StoreError::ColdUnavailable)?;
        metrics::counter!("history_cold_pages_total").increment(1);
        merge(hot, cold, ascending, want)
    };
    let has_more = messages.len() > limit as usize;
    messages.truncate(limit as usize);
    if !ascending {
        messages.reverse();
    }
    let mut conn = db.pool.acquire().await?;
    let shown = &mut [(conversation.get(), &mut messages[..])];
    super::messages::attach_all(&mut conn, reader, shown).await?;
    Ok(HistoryPage {
        messages,
        has_more,
        last_seq,
    })
}

/// The first `want` messages by seq (ascending, or descending), a PostgreSQL row winning
/// over Cassandra's copy of the same seq.
fn merge(
    hot: Vec<HistoryMessage>,
    cold: Vec<ColdRow>,
    ascending: bool,
    want: usize,
) -> Vec<HistoryMessage> {
    let mut by_seq: BTreeMap<i64, HistoryMessage> = cold
        .into_iter()
        .filter_map(cold_message)
        .map(|m| (m.seq, m))
        .collect();
    by_seq.extend(hot.into_iter().map(|m| (m.seq, m)));
    if ascending {
        by_seq.into_values().take(want).collect()
    } else {
        by_seq.into_values().rev().take(want).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(seq: i64, body: &str) -> HistoryMessage {
        HistoryMessage {
            seq,
            sender_id: 1,
            client_msg_id: Uuid::nil(),
            body: Some(body.into()),
            created_at: DateTime::from_timestamp_micros(seq).unwrap(),
            edited_at: None,
            deleted: false,
            deleted_at: None,
            ..Default::default()
        }
    }

    fn archived(seq: i64, body: &str) -> ColdRow {
        (
            seq,
            Some(1),
            Some(Uuid::nil()),
            Some(body.into()),
            Some(seq),
            None,
            None,
            None,
            None,
        )
    }

    fn seqs_and_bodies(page: &[HistoryMessage]) -> Vec<(i64, &str)> {
        page.iter()
            .map(|m| (m.seq, m.body.as_deref().unwrap_or("-")))
            .collect()
    }

    #[test]
    fn a_page_straddling_the_boundary_takes_each_seq_once_postgres_winning() {
        // cold_through 5; seq 4 was edited since its archive (brought back).
        let hot = vec![
            message(8, "h8"),
            message(7, "h7"),
            message(6, "h6"),
            message(4, "edited"),
        ];
        let cold = (1..=5).rev().map(|s| archived(s, "c")).collect();
        let page = merge(hot, cold, false, 5);
        assert_eq!(
            seqs_and_bodies(&page),
            vec![(8, "h8"), (7, "h7"), (6, "h6"), (5, "c"), (4, "edited")]
        );
        let hot = vec![message(4, "edited"), message(6, "h6")];
        let cold = (3..=5).map(|s| archived(s, "c")).collect();
        let page = merge(hot, cold, true, 3);
        assert_eq!(
            seqs_and_bodies(&page),
            vec![(3, "c"), (4, "edited"), (5, "c")]
        );
    }

    #[test]
    fn an_archived_delete_answers_as_a_hot_one() {
        let row = (
            3,
            Some(2),
            Some(Uuid::nil()),
            None,
            Some(10),
            Some(11),
            Some(12),
            Some(2),
            Some(1),
        );
        let m = cold_message(row).unwrap();
        assert!(m.deleted && m.body.is_none());
        assert_eq!(m.deleted_at.unwrap().timestamp_micros(), 12);
        assert_eq!(m.edited_at.unwrap().timestamp_micros(), 11);
        assert!(cold_message((4, None, None, None, None, None, None, None, None)).is_none());
    }
}
