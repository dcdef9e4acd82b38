//! A batch's statement: `chat_send_many` (migrations/; sql/functions/), one statement in
//! one implicit transaction, or, for a batch that names members, the same inside a
//! transaction with the mentions' ([`super::super::mentions`]); and each sender's answer
//! from its row.

use std::sync::Arc;

use chatpipe_schemas::{MessageNew, Seq, AGGREGATE_TYPE};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use super::{Pending, SendError, SendOutcome, SentMessage};
use crate::store::{mentions, Outbox};

/// One row of `chat_send_many`'s answer.
#[derive(sqlx::FromRow)]
pub(super) struct Row {
    outcome: String,
    seq: Option<i64>,
    created_at: Option<DateTime<Utc>>,
}

impl Row {
    pub(super) fn answer(self, p: &Pending) -> Result<SendOutcome, SendError> {
        let sent = |seq: Option<i64>, created_at: Option<DateTime<Utc>>| SentMessage {
            conversation_id: p.conversation.get(),
            seq: seq.unwrap_or_default(),
            client_msg_id: p.client_msg_id,
            sender_id: p.sender.get(),
            created_at: created_at.unwrap_or(p.created_at),
        };
        match self.outcome.as_str() {
            "created" => {
                metrics::counter!("messages_sent_total").increment(1);
                metrics::counter!("outbox_events_written_total", "type" => "message.new")
                    .increment(1);
                Ok(SendOutcome::Created(sent(self.seq, self.created_at)))
            }
            "replayed" => {
                metrics::counter!("message_replays_total").increment(1);
                Ok(SendOutcome::Replayed(sent(self.seq, self.created_at)))
            }
            "conflict" => Err(SendError::ClientIdReused {
                client_msg_id: p.client_msg_id,
                seq: self.seq.unwrap_or_default(),
            }),
            "not_member" => Err(SendError::NotFound),
            "blocked" => Err(SendError::Blocked),
            other => Err(SendError::Database(Arc::new(sqlx::Error::Protocol(
                format!("chat_send_many answered an unknown outcome {other:?}"),
            )))),
        }
    }
}

/// The rows of `batch`: [`chat_send_many`] alone, or, for a batch of which a message
/// names members, in a transaction that takes the named conversations' delete locks
/// first (the order deletes take them in) and records the mentions after the send
/// ([`super::mentions`]). A batch without mentions stays one statement.
pub(super) async fn write_rows(
    db: &mut PgConnection,
    outbox: &Outbox,
    batch: &[Pending],
) -> Result<Vec<Row>, sqlx::Error> {
    use sqlx::Connection;
    let naming: Vec<i64> = batch
        .iter()
        .filter(|p| !p.mentions.is_empty())
        .map(|p| p.conversation.get())
        .collect();
    if naming.is_empty() {
        return chat_send_many(db, outbox, batch).await;
    }
    let mut tx = db.begin().await?;
    mentions::lock(&mut tx, &naming).await?;
    let rows = chat_send_many(&mut tx, outbox, batch).await?;
    let sent: Vec<mentions::Sent<'_>> = batch
        .iter()
        .zip(&rows)
        .filter(|(p, row)| row.outcome == "created" && !p.mentions.is_empty())
        .filter_map(|(p, row)| {
            Some(mentions::Sent {
                conversation: p.conversation,
                seq: row.seq?,
                sender: p.sender,
                created_at: row.created_at?,
                mentions: &p.mentions,
            })
        })
        .collect();
    mentions::record(&mut tx, &sent).await?;
    tx.commit().await?;
    metrics::counter!("send_batches_with_mentions_total").increment(1);
    Ok(rows)
}

/// `SELECT * FROM chat_send_many(...)` for `batch`: one round trip, one row per message
/// in batch order.
async fn chat_send_many(
    db: &mut PgConnection,
    outbox: &Outbox,
    batch: &[Pending],
) -> Result<Vec<Row>, sqlx::Error> {
    let codec = outbox.codec();
    let (mut heads, mut tails) = (Vec::new(), Vec::new());
    for p in batch {
        let splice = codec.message_new_around_seq(MessageNew {
            conversation_id: p.conversation,
            // Taken by the statement under the lock; spliced into the bytes there.
            seq: Seq::of(1),
            sender_id: p.sender,
            client_msg_id: p.client_msg_id,
            body: p.body.clone(),
            mentions: p.mentions.clone(),
            created_at: p.created_at,
        });
        heads.push(splice.head);
        tails.push(splice.tail);
    }
    let conversations: Vec<i64> = batch.iter().map(|p| p.conversation.get()).collect();
    let senders: Vec<i64> = batch.iter().map(|p| p.sender.get()).collect();
    let client_ids: Vec<Uuid> = batch.iter().map(|p| p.client_msg_id).collect();
    let bodies: Vec<&str> = batch.iter().map(|p| p.body.as_str()).collect();
    let created_at: Vec<DateTime<Utc>> = batch.iter().map(|p| p.created_at).collect();
    let event_ids: Vec<Uuid> = batch.iter().map(|_| Uuid::new_v4()).collect();
    sqlx::query_as(
        "SELECT outcome, seq, created_at
           FROM chat_send_many($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(&conversations)
    .bind(&senders)
    .bind(&client_ids)
    .bind(&bodies)
    .bind(&created_at)
    .bind(&event_ids)
    .bind(&heads)
    .bind(&tails)
    .bind(AGGREGATE_TYPE)
    .bind(outbox.deletes_after_write())
    .fetch_all(db)
    .await
}
