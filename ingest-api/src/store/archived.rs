//! Edits and deletes of archived messages. A message that has left PostgreSQL (its seq
//! at or below the conversation's `message_archive.cold_through`) is brought back first:
//! its row is read from Cassandra and inserted again, inside the edit's or delete's
//! transaction, under the conversation's lock. The edit or delete then runs as on any
//! row, with the same checks, answers and event, and the version times stay ordered
//! (the row carries its last version's times). The row stays until the retention step
//! finds Cassandra holding its change, then leaves again; meanwhile history reads it
//! from PostgreSQL, whose row wins over Cassandra's copy.
//!
//! Only a row absent from PostgreSQL is read from Cassandra, and the retention step
//! removes a row only once Cassandra holds its latest version, so that copy is current.

use chatpipe_core::ConversationId;

use super::{Store, StoreError};

const COLD_THROUGH_SQL: &str =
    "SELECT cold_through FROM message_archive WHERE conversation_id = $1";

const RESTORE_SQL: &str = "INSERT INTO message (conversation_id, seq, sender_id, client_msg_id,
        body, created_at, edited_at, deleted_at, deleted_by, thread_root_seq)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// The retention step looks at the conversation again at once: the row leaves as soon
/// as Cassandra has its change.
const DUE_NOW_SQL: &str = "UPDATE message_archive
        SET next_due_at = least(coalesce(next_due_at, 'infinity'), now())
      WHERE conversation_id = $1";

/// Brings message `seq` back into PostgreSQL if it is archived and gone from there.
/// `false`: it is not archived (no such message). Call it under the conversation's lock.
pub async fn restore(
    db: &Store,
    conn: &mut sqlx::PgConnection,
    conversation: ConversationId,
    seq: i64,
) -> Result<bool, StoreError> {
    let cold_through: Option<i64> = sqlx::query_scalar(COLD_THROUGH_SQL)
        .bind(conversation.get())
        .fetch_optional(&mut *conn)
        .await?;
    if cold_through.is_none_or(|through| seq > through) {
        return Ok(false);
    }
    let rows = db
        .cold
        .get()
        .await
        .map_err(StoreError::ColdUnavailable)?
        .range(conversation.get(), seq, seq)
        .await
        .map_err(StoreError::ColdUnavailable)?;
    let Some(row) = rows.into_iter().next() else {
        return Ok(false);
    };
    let message = super::history::cold_message(row.clone()).ok_or_else(|| {
        StoreError::corrupt(format!(
            "archived message {seq} of conversation {conversation} lacks columns"
        ))
    })?;
    sqlx::query(RESTORE_SQL)
        .bind(conversation.get())
        .bind(seq)
        .bind(message.sender_id)
        .bind(message.client_msg_id)
        .bind(message.body)
        .bind(message.created_at)
        .bind(message.edited_at)
        .bind(message.deleted_at)
        .bind(row.7)
        .bind(message.thread_root_seq)
        .execute(&mut *conn)
        .await?;
    sqlx::query(DUE_NOW_SQL)
        .bind(conversation.get())
        .execute(&mut *conn)
        .await?;
    metrics::counter!("archived_messages_restored_total").increment(1);
    Ok(true)
}
