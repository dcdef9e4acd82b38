//! History paging and edits. Sending is in [`super::send`].

use chatpipe_core::{ConversationId, Seq, UserId};
use chatpipe_schemas::{ChatEvent, MessageEdited};
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
    /// When the body was last replaced; absent if never.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edited_at: Option<DateTime<Utc>>,
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

const DESCENDING: &str =
    "SELECT seq, sender_id, client_msg_id, body, created_at, edited_at FROM message
                           WHERE conversation_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3";
const ASCENDING: &str =
    "SELECT seq, sender_id, client_msg_id, body, created_at, edited_at FROM message
                          WHERE conversation_id = $1 AND seq > $2 ORDER BY seq ASC LIMIT $3";

/// An edited message, as the edit answers it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Edited {
    pub conversation_id: ConversationId,
    #[serde(flatten)]
    pub message: HistoryMessage,
}

/// Replaces the body of message `seq` of `conversation`: only its sender may (403 for
/// another member; 404 for a non-member, as everywhere, and for a seq with no message).
/// Writes `message.edited` in the same transaction.
pub async fn edit(
    db: &Store,
    conversation: ConversationId,
    caller: UserId,
    seq: Seq,
    body: &str,
) -> Result<Edited, StoreError> {
    let mut tx = db.pool.begin().await?;
    // The message row first, locked: concurrent edits of one message apply in turn.
    let sender: Option<i64> = sqlx::query_scalar(
        "SELECT sender_id FROM message WHERE conversation_id = $1 AND seq = $2 FOR UPDATE",
    )
    .bind(conversation.get())
    .bind(seq.get())
    .fetch_optional(&mut *tx)
    .await?;
    // Membership asked after the lock (a fresh snapshot): a sender removed meanwhile
    // edits nothing.
    let member: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM conversation_member
                         WHERE conversation_id = $1 AND user_id = $2)",
    )
    .bind(conversation.get())
    .bind(caller.get())
    .fetch_one(&mut *tx)
    .await?;
    if !member {
        return Err(StoreError::conversation_not_found());
    }
    match sender {
        None => return Err(StoreError::NotFound { what: "message" }),
        Some(sender) if sender != caller.get() => {
            return Err(StoreError::Forbidden {
                detail: "only a message's sender may edit it".into(),
            })
        }
        Some(_) => {}
    }
    let message: HistoryMessage = sqlx::query_as(
        "UPDATE message SET body = $3, edited_at = now()
          WHERE conversation_id = $1 AND seq = $2
          RETURNING seq, sender_id, client_msg_id, body, created_at, edited_at",
    )
    .bind(conversation.get())
    .bind(seq.get())
    .bind(body)
    .fetch_one(&mut *tx)
    .await?;
    let event = ChatEvent::MessageEdited(MessageEdited {
        conversation_id: conversation,
        seq,
        sender_id: caller,
        body: message.body.clone(),
        edited_at: message.edited_at.unwrap_or(message.created_at),
    });
    db.outbox.write(&mut tx, &[event]).await?;
    tx.commit().await?;
    Ok(Edited {
        conversation_id: conversation,
        message,
    })
}
