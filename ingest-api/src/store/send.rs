//! The send path (DESIGN.md "Sending"): one statement per send, and group commit for a
//! conversation many people write into at once.
//!
//! `chat_send` (migrations/) does in one statement, in one implicit transaction, what
//! used to take six round trips: lock the conversation, check the sender is a member,
//! answer replays and conflicts, take the seqs, insert the messages, move `last_seq` and
//! the senders' watermarks, and write each `message.new` to the outbox. It takes a batch.
//!
//! Sends to one conversation queue in a lane. The first send into an empty lane starts
//! a writer task at once (no added wait when nothing contends); sends that arrive while
//! it writes wait in the lane, and the writer takes up to `sends.max_batch` of them into
//! its next statement: one lock, one commit, one fsync for all. Each caller gets its own
//! answer, and seqs are gapless in lane order. A batch that fails wrote nothing (one
//! statement) and every caller in it gets 503. Other ingest-api processes queue behind
//! the same row lock, so several processes stay gapless too. The writer is a task of its
//! own: a client that hangs up does not cancel the batch of the others.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use chatpipe_core::{ConversationId, UserId};
use chatpipe_schemas::{MessageNew, Seq, AGGREGATE_TYPE};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::{now, Store};
use crate::domain::MessageBody;
use crate::error::ApiError;

/// `[sends]` in the config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendSettings {
    /// Most messages one statement writes into one conversation.
    pub max_batch: usize,
    /// Most sends waiting in one conversation's lane; more answer 503.
    pub max_queued: usize,
}

/// A message committed, as the sender learns it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SentMessage {
    pub conversation_id: i64,
    pub seq: i64,
    pub client_msg_id: Uuid,
    pub sender_id: i64,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug)]
pub enum SendOutcome {
    /// A new message, committed with its seq.
    Created(SentMessage),
    /// A retry of a message already committed: the original, unchanged.
    Replayed(SentMessage),
}

/// Why a send wrote nothing. Turned into an [`ApiError`] at the route edge.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("conversation not found")]
    NotFound,
    #[error("clientMsgId {client_msg_id} already names message {seq} with a different content")]
    ClientIdReused { client_msg_id: Uuid, seq: i64 },
    #[error("{queued} sends already wait for this conversation")]
    Busy { queued: usize },
    /// The statement of this send's batch failed: nothing of the batch was written.
    #[error("the send's batch failed: {0}")]
    Database(Arc<sqlx::Error>),
}

impl From<SendError> for ApiError {
    fn from(err: SendError) -> Self {
        match err {
            SendError::NotFound => ApiError::conversation_not_found(),
            SendError::ClientIdReused { .. } => {
                ApiError::conflict("client-msg-id-reused", err.to_string())
            }
            SendError::Busy { .. } | SendError::Database(_) => {
                ApiError::SendUnavailable(err.to_string())
            }
        }
    }
}

struct Pending {
    sender: UserId,
    client_msg_id: Uuid,
    body: String,
    created_at: DateTime<Utc>,
    reply: oneshot::Sender<Result<SendOutcome, SendError>>,
}

/// The lanes of one process: see the module docs.
#[derive(Clone)]
pub struct SendQueue {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    settings: SendSettings,
    /// A lane exists while its writer runs; the writer removes it when it is empty.
    lanes: Mutex<HashMap<ConversationId, VecDeque<Pending>>>,
}

impl SendQueue {
    pub fn new(store: Store, settings: SendSettings) -> Self {
        assert!(settings.max_batch >= 1, "sends.max_batch is at least 1");
        Self {
            inner: Arc::new(Inner {
                store,
                settings,
                lanes: Mutex::default(),
            }),
        }
    }

    /// Sends one message and waits for its batch's answer.
    pub async fn send(
        &self,
        conversation: ConversationId,
        sender: UserId,
        client_msg_id: Uuid,
        body: &MessageBody,
    ) -> Result<SendOutcome, SendError> {
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            sender,
            client_msg_id,
            body: body.as_str().to_owned(),
            created_at: now(),
            reply,
        };
        {
            let mut lanes = self.inner.lanes.lock().expect("lanes lock");
            match lanes.get_mut(&conversation) {
                Some(lane) if lane.len() >= self.inner.settings.max_queued => {
                    metrics::counter!("send_queue_rejections_total").increment(1);
                    return Err(SendError::Busy { queued: lane.len() });
                }
                Some(lane) => lane.push_back(pending),
                None => {
                    lanes.insert(conversation, VecDeque::from([pending]));
                    tokio::spawn(self.clone().write_lane(conversation));
                }
            }
        }
        answer
            .await
            .expect("a lane's writer answers every send it takes")
    }

    /// The lane's writer: batches until the lane is empty, then removes it.
    async fn write_lane(self, conversation: ConversationId) {
        loop {
            let batch: Vec<Pending> = {
                let mut lanes = self.inner.lanes.lock().expect("lanes lock");
                let lane = lanes.get_mut(&conversation).expect("a writer's lane");
                if lane.is_empty() {
                    lanes.remove(&conversation);
                    return;
                }
                let n = lane.len().min(self.inner.settings.max_batch);
                lane.drain(..n).collect()
            };
            self.write_batch(conversation, batch).await;
        }
    }

    /// One statement for `batch`; every caller gets its answer.
    async fn write_batch(&self, conversation: ConversationId, batch: Vec<Pending>) {
        metrics::histogram!("send_batch_messages").record(batch.len() as f64);
        let result = chat_send(&self.inner.store, conversation, &batch).await;
        let rows = match result {
            Ok(rows) if rows.len() == batch.len() => rows,
            Ok(rows) => {
                let err = sqlx::Error::Protocol(format!(
                    "chat_send answered {} rows for {} messages",
                    rows.len(),
                    batch.len()
                ));
                return fail(batch, err);
            }
            Err(err) => return fail(batch, err),
        };
        for (p, row) in batch.into_iter().zip(rows) {
            let answer = row.answer(conversation, &p);
            let _ = p.reply.send(answer);
        }
    }
}

fn fail(batch: Vec<Pending>, err: sqlx::Error) {
    metrics::counter!("send_batch_failures_total").increment(1);
    let err = Arc::new(err);
    for p in batch {
        let _ = p.reply.send(Err(SendError::Database(err.clone())));
    }
}

/// One row of `chat_send`'s answer.
#[derive(sqlx::FromRow)]
struct Row {
    outcome: String,
    seq: Option<i64>,
    created_at: Option<DateTime<Utc>>,
}

impl Row {
    fn answer(self, conversation: ConversationId, p: &Pending) -> Result<SendOutcome, SendError> {
        let sent = |seq: Option<i64>, created_at: Option<DateTime<Utc>>| SentMessage {
            conversation_id: conversation.get(),
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
            other => Err(SendError::Database(Arc::new(sqlx::Error::Protocol(
                format!("chat_send answered an unknown outcome {other:?}"),
            )))),
        }
    }
}

/// `SELECT * FROM chat_send(...)` for `batch`: one round trip.
async fn chat_send(
    store: &Store,
    conversation: ConversationId,
    batch: &[Pending],
) -> Result<Vec<Row>, sqlx::Error> {
    let codec = store.outbox.codec();
    let (mut heads, mut tails) = (Vec::new(), Vec::new());
    for p in batch {
        let splice = codec.message_new_around_seq(MessageNew {
            conversation_id: conversation,
            // Taken by the statement under the lock; spliced into the bytes there.
            seq: Seq::of(1),
            sender_id: p.sender,
            client_msg_id: p.client_msg_id,
            body: p.body.clone(),
            created_at: p.created_at,
        });
        heads.push(splice.head);
        tails.push(splice.tail);
    }
    let senders: Vec<i64> = batch.iter().map(|p| p.sender.get()).collect();
    let client_ids: Vec<Uuid> = batch.iter().map(|p| p.client_msg_id).collect();
    let bodies: Vec<&str> = batch.iter().map(|p| p.body.as_str()).collect();
    let created_at: Vec<DateTime<Utc>> = batch.iter().map(|p| p.created_at).collect();
    let event_ids: Vec<Uuid> = batch.iter().map(|_| Uuid::new_v4()).collect();
    sqlx::query_as(
        "SELECT outcome, seq, created_at FROM chat_send($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(conversation.get())
    .bind(&senders)
    .bind(&client_ids)
    .bind(&bodies)
    .bind(&created_at)
    .bind(&event_ids)
    .bind(&heads)
    .bind(&tails)
    .bind(AGGREGATE_TYPE)
    .bind(store.outbox.deletes_after_write())
    .fetch_all(&store.pool)
    .await
}
