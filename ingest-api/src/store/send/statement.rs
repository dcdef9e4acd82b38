//! A batch's statement: `chat_send_many` (migrations/; sql/functions/), one statement in
//! one implicit transaction, or, for a batch that names members or holds replies, the
//! same inside a transaction with the mentions' ([`super::super::mentions`]) and the
//! threads' ([`super::super::threads`]); and each sender's answer from its row.

use std::sync::Arc;

use chatpipe_schemas::{MessageNew, Seq, AGGREGATE_TYPE};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use super::{Pending, SendError, SendOutcome, SentMessage};
use crate::store::threads::{self, BadRoot};
use crate::store::{mentions, Outbox};

/// One row of `chat_send_many`'s answer.
#[derive(sqlx::FromRow)]
pub(super) struct Row {
    outcome: String,
    seq: Option<i64>,
    created_at: Option<DateTime<Utc>>,
}

impl Row {
    /// The row of a reply whose root the batch refused.
    fn refused(problem: BadRoot) -> Self {
        let outcome = match problem {
            BadRoot::Unknown => "root_unknown",
            BadRoot::Reply => "root_reply",
            BadRoot::Deleted => "root_deleted",
        };
        Self {
            outcome: outcome.into(),
            seq: None,
            created_at: None,
        }
    }

    pub(super) fn answer(self, p: &Pending) -> Result<SendOutcome, SendError> {
        let sent = |seq: Option<i64>, created_at: Option<DateTime<Utc>>| SentMessage {
            conversation_id: p.conversation.get(),
            seq: seq.unwrap_or_default(),
            client_msg_id: p.client_msg_id,
            sender_id: p.sender.get(),
            created_at: created_at.unwrap_or(p.created_at),
            thread_root_seq: p.thread_root.map(|r| r.get()),
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
            "root_unknown" | "root_reply" | "root_deleted" => Err(SendError::BadThreadRoot {
                root: p.thread_root.map_or(0, |r| r.get()),
                problem: match self.outcome.as_str() {
                    "root_unknown" => BadRoot::Unknown,
                    "root_reply" => BadRoot::Reply,
                    _ => BadRoot::Deleted,
                },
            }),
            "blocked" => Err(SendError::Blocked),
            other => Err(SendError::Database(Arc::new(sqlx::Error::Protocol(
                format!("chat_send_many answered an unknown outcome {other:?}"),
            )))),
        }
    }
}

/// The rows of `batch`: [`chat_send_many`] alone, or, for a batch of which a message
/// names members or replies in a thread, in a transaction that takes the conversations'
/// delete locks first (the order deletes take them in), checks the replies' roots (a
/// reply to no root gets its problem as its row and is not sent), and records the
/// mentions and the replies after the send. A batch of neither stays one statement.
pub(super) async fn write_rows(
    db: &mut PgConnection,
    outbox: &Outbox,
    batch: &[Pending],
) -> Result<Vec<Row>, sqlx::Error> {
    use sqlx::Connection;
    let locking: Vec<i64> = batch
        .iter()
        .filter(|p| !p.mentions.is_empty() || p.thread_root.is_some())
        .map(|p| p.conversation.get())
        .collect();
    if locking.is_empty() {
        let all: Vec<&Pending> = batch.iter().collect();
        return chat_send_many(db, outbox, &all).await;
    }
    let mut tx = db.begin().await?;
    mentions::lock(&mut tx, &locking).await?;
    let roots: Vec<Option<(i64, i64)>> = batch
        .iter()
        .map(|p| p.thread_root.map(|r| (p.conversation.get(), r.get())))
        .collect();
    let problems = threads::check_roots(&mut tx, &roots).await?;
    let sendable: Vec<&Pending> = batch
        .iter()
        .zip(&problems)
        .filter(|(_, problem)| problem.is_none())
        .map(|(p, _)| p)
        .collect();
    let mut sent = chat_send_many(&mut tx, outbox, &sendable)
        .await?
        .into_iter();
    let rows: Vec<Row> = problems
        .iter()
        .map(|problem| match problem {
            None => sent.next().expect("a row per message sent"),
            Some(problem) => Row::refused(*problem),
        })
        .collect();
    let created = || {
        batch
            .iter()
            .zip(&rows)
            .filter(|(_, row)| row.outcome == "created")
            .filter_map(|(p, row)| Some((p, row.seq?, row.created_at?)))
    };
    let named: Vec<mentions::Sent<'_>> = created()
        .filter(|(p, _, _)| !p.mentions.is_empty())
        .map(|(p, seq, created_at)| mentions::Sent {
            conversation: p.conversation,
            seq,
            sender: p.sender,
            created_at,
            mentions: &p.mentions,
        })
        .collect();
    mentions::record(&mut tx, &named).await?;
    let replies: Vec<threads::Replied> = created()
        .filter_map(|(p, seq, created_at)| {
            Some(threads::Replied {
                conversation: p.conversation,
                seq,
                root: p.thread_root?.get(),
                sender: p.sender,
                created_at,
            })
        })
        .collect();
    threads::record(&mut tx, &replies).await?;
    tx.commit().await?;
    if !named.is_empty() {
        metrics::counter!("send_batches_with_mentions_total").increment(1);
    }
    Ok(rows)
}

/// `SELECT * FROM chat_send_many(...)` for `batch`: one round trip, one row per message
/// in batch order.
async fn chat_send_many(
    db: &mut PgConnection,
    outbox: &Outbox,
    batch: &[&Pending],
) -> Result<Vec<Row>, sqlx::Error> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
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
            thread_root_seq: p.thread_root,
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
    let roots: Vec<Option<i64>> = batch
        .iter()
        .map(|p| p.thread_root.map(|r| r.get()))
        .collect();
    sqlx::query_as(
        "SELECT outcome, seq, created_at
           FROM chat_send_many($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
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
    .bind(&roots)
    .fetch_all(db)
    .await
}
