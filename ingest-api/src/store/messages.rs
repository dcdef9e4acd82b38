//! History paging. Sending is in [`super::send`].

use chatpipe_core::{ConversationId, UserId};
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{Store, StoreError};

#[derive(Debug, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct HistoryMessage {
    pub seq: i64,
    pub sender_id: i64,
    pub client_msg_id: Uuid,
    pub body: String,
    pub created_at: DateTime<Utc>,
}

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

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryPage {
    /// Always in ascending seq order.
    pub messages: Vec<HistoryMessage>,
    /// More messages exist in the direction of the page: older ones for `Newest` and
    /// `Before`, newer ones for `After`.
    pub has_more: bool,
    pub last_seq: i64,
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
        Page::Newest => (DESCENDING, i64::MAX),
        Page::Before(seq) => (DESCENDING, seq),
        Page::After(seq) => (ASCENDING, seq),
    };
    let mut messages: Vec<HistoryMessage> = sqlx::query_as(sql)
        .bind(conversation.get())
        .bind(bound)
        .bind(limit + 1)
        .fetch_all(&db.pool)
        .await?;
    let has_more = messages.len() as i64 > limit;
    messages.truncate(limit as usize);
    if !matches!(page, Page::After(_)) {
        messages.reverse();
    }
    Ok(HistoryPage {
        messages,
        has_more,
        last_seq,
    })
}

const DESCENDING: &str = "SELECT seq, sender_id, client_msg_id, body, created_at FROM message
                           WHERE conversation_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3";
const ASCENDING: &str = "SELECT seq, sender_id, client_msg_id, body, created_at FROM message
                          WHERE conversation_id = $1 AND seq > $2 ORDER BY seq ASC LIMIT $3";
