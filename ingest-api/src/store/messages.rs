//! The send path (DESIGN.md "Sending") and history paging.

use chatpipe_core::{db, ConversationId, UserId};
use chatpipe_schemas::{ChatEvent, MessageNew};
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{now, Store};
use crate::domain::MessageBody;
use crate::error::ApiError;

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct SentMessage {
    pub conversation_id: i64,
    pub seq: i64,
    pub client_msg_id: Uuid,
    pub sender_id: i64,
    pub created_at: DateTime<Utc>,
}

pub enum SendOutcome {
    /// A new message, committed with its seq.
    Created(SentMessage),
    /// A retry of a message already committed: the original, unchanged.
    Replayed(SentMessage),
}

#[derive(sqlx::FromRow)]
struct Existing {
    seq: i64,
    sender_id: i64,
    body: String,
    created_at: DateTime<Utc>,
}

/// Sends one message in one transaction: lock the conversation (as a member), check
/// the client id under the lock, take `last_seq + 1`, then insert the message, move
/// `last_seq`, advance the sender's watermark and write `message.new` to the outbox
/// in one statement. The caller learns the seq only after COMMIT.
pub async fn send(
    db: &Store,
    conversation: ConversationId,
    sender: UserId,
    client_msg_id: Uuid,
    body: &MessageBody,
) -> Result<SendOutcome, ApiError> {
    let mut tx = db.pool.begin().await?;
    let last_seq: i64 = sqlx::query_scalar(
        "SELECT c.last_seq FROM conversation c
          WHERE c.id = $1
            AND EXISTS (SELECT 1 FROM conversation_member m WHERE m.conversation_id = c.id AND m.user_id = $2)
            FOR UPDATE",
    )
    .bind(conversation.get())
    .bind(sender.get())
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(ApiError::conversation_not_found)?;

    // After the lock: a concurrent retry of the same id waits above and then sees ours.
    let existing: Option<Existing> = sqlx::query_as(
        "SELECT seq, sender_id, body, created_at FROM message WHERE conversation_id = $1 AND client_msg_id = $2",
    )
    .bind(conversation.get())
    .bind(client_msg_id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(original) = existing {
        if original.sender_id != sender.get() || original.body != body.as_str() {
            return Err(ApiError::conflict(
                "client-msg-id-reused",
                format!(
                    "clientMsgId {client_msg_id} already names message {} with a different content",
                    original.seq
                ),
            ));
        }
        metrics::counter!("message_replays_total").increment(1);
        return Ok(SendOutcome::Replayed(SentMessage {
            conversation_id: conversation.get(),
            seq: original.seq,
            client_msg_id,
            sender_id: original.sender_id,
            created_at: original.created_at,
        }));
    }

    let seq = last_seq + 1;
    let created_at = now();
    let event = ChatEvent::MessageNew(MessageNew {
        conversation_id: conversation,
        seq: db::id(seq)?,
        sender_id: sender,
        client_msg_id,
        body: body.as_str().to_owned(),
        created_at,
    });
    let event_id = Uuid::new_v4();
    sqlx::query(
        "WITH new_message AS (
             INSERT INTO message (conversation_id, seq, sender_id, client_msg_id, body, created_at)
             VALUES ($1, $2, $3, $4, $5, $6)
         ), moved AS (
             UPDATE conversation SET last_seq = $2, last_message_at = $6, last_activity_at = $6 WHERE id = $1
         ), sender_read AS (
             UPDATE conversation_member SET last_read_seq = GREATEST(last_read_seq, $2)
              WHERE conversation_id = $1 AND user_id = $3
         )
         INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($7, $8, $9, $10, $11)",
    )
    .bind(conversation.get())
    .bind(seq)
    .bind(sender.get())
    .bind(client_msg_id)
    .bind(body.as_str())
    .bind(created_at)
    .bind(event_id)
    .bind(chatpipe_schemas::AGGREGATE_TYPE)
    .bind(conversation.to_string())
    .bind(event.event_type())
    .bind(db.outbox.codec().encode(&event))
    .execute(&mut *tx)
    .await?;
    db.outbox.clear(&mut tx, &[event_id]).await?;
    tx.commit().await?;
    metrics::counter!("messages_sent_total").increment(1);
    metrics::counter!("outbox_events_written_total", "type" => event.event_type()).increment(1);
    Ok(SendOutcome::Created(SentMessage {
        conversation_id: conversation.get(),
        seq,
        client_msg_id,
        sender_id: sender.get(),
        created_at,
    }))
}

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
) -> Result<HistoryPage, ApiError> {
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
