//! A batch's statement: `chat_send_many` (migrations/; sql/functions/), or, for a batch
//! that names members or holds replies, `chat_send_annotated`, which wraps it with the
//! roots' check and the mentions' and threads' bookkeeping; each one statement in one
//! implicit transaction; and each sender's answer from its row.

use std::sync::Arc;

use chatpipe_schemas::{MessageNew, Seq, AGGREGATE_TYPE};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use super::{Pending, SendError, SendOutcome, SentMessage};
use crate::store::threads::BadRoot;
use crate::store::Outbox;

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
            "root_archived" => match p.thread_root {
                Some(root) => Err(SendError::RootArchived { root }),
                None => Err(unexpected("root_archived")),
            },
            "blocked" => Err(SendError::Blocked),
            other => Err(unexpected(other)),
        }
    }
}

/// The rows of `batch`: `chat_send_many`, or, for a batch of which a message names
/// members or replies in a thread, `chat_send_annotated`, which takes the conversations'
/// delete locks first, checks the replies' roots (a reply to no root gets its problem as
/// its row and is not sent), sends the others with `chat_send_many` and records their
/// mentions and replies. Either way one statement: one round trip, one implicit
/// transaction, one row per message in batch order.
pub(super) async fn write_rows(
    db: &mut PgConnection,
    outbox: &Outbox,
    batch: &[Pending],
) -> Result<Vec<Row>, sqlx::Error> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    let annotated = batch
        .iter()
        .any(|p| !p.mentions.is_empty() || p.thread_root.is_some());
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
    // Each event in its own request's trace (the `send` span's context; outbox.traceparent
    // and the EventRouter's header): NULL for the whole batch when no span is exported.
    let traces: Vec<Option<String>> = batch
        .iter()
        .map(|p| chatpipe_core::telemetry::traceparent(&p.span))
        .collect();
    let traces = traces.iter().any(Option::is_some).then_some(traces);
    let query = sqlx::query_as(if annotated {
        "SELECT outcome, seq, created_at
           FROM chat_send_annotated($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                                    $15)"
    } else {
        "SELECT outcome, seq, created_at
           FROM chat_send_many($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
    })
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
    .bind(&roots);
    if !annotated {
        return query.bind(&traces).fetch_all(db).await;
    }
    let cold_authors: Vec<Option<i64>> = batch
        .iter()
        .map(|p| p.cold_root_author.map(|u| u.get()))
        .collect();
    let (mut mention_at, mut mention_users) = (Vec::new(), Vec::new());
    for (i, p) in batch.iter().enumerate() {
        for user in &p.mentions {
            mention_at.push(i as i32 + 1);
            mention_users.push(user.get());
        }
    }
    let rows: Vec<Row> = query
        .bind(&cold_authors)
        .bind(&mention_at)
        .bind(&mention_users)
        .bind(&traces)
        .fetch_all(db)
        .await?;
    let created = |wanted: fn(&Pending) -> bool| {
        batch
            .iter()
            .zip(&rows)
            .filter(|(p, row)| row.outcome == "created" && wanted(p))
            .count() as u64
    };
    let (named, replies) = (
        created(|p| !p.mentions.is_empty()),
        created(|p| p.thread_root.is_some()),
    );
    if named > 0 {
        metrics::counter!("send_batches_with_mentions_total").increment(1);
    }
    metrics::counter!("thread_replies_total").increment(replies);
    Ok(rows)
}

/// An answer the statement should not give for the message: a protocol error, as a failed
/// batch.
fn unexpected(outcome: &str) -> SendError {
    SendError::Database(Arc::new(sqlx::Error::Protocol(format!(
        "chat_send_many answered {outcome:?}, not an outcome this message can have"
    ))))
}
