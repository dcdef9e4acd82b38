//! The send path (docs/architecture.md, "Sending"): one statement per batch of sends, and group
//! commit for everything that arrives while a statement is being written.
//!
//! `chat_send_many` (migrations/) does in one statement, in one implicit transaction,
//! what the design's send takes six round trips for, for a batch of messages into one or
//! several conversations: lock each conversation (in id order), check the sender is a
//! member, answer replays and conflicts, take the seqs, insert the messages, move
//! `last_seq` and the senders' watermarks, and write each `message.new` to the outbox.
//!
//! Sends to one conversation queue in its lane, and a lane has at most one batch in
//! flight, so seqs are gapless in lane order. Up to `sends.max_writers` writer tasks
//! write batches. A send that finds a writer free is written at once (no added wait when
//! nothing contends); sends that arrive while every writer is busy wait, and the next
//! free writer takes up to `sends.max_batch` of them, from the lanes in the order they
//! became ready, into one statement: one commit, one WAL flush for all. A conversation
//! many people write into at once gets up to `max_batch` messages per lock; sends spread
//! over many conversations share a commit. Each caller gets its own answer. A batch that
//! fails wrote nothing (one statement) and every caller in it gets 503. Other ingest-api
//! processes queue behind the same row locks, taken in the same order, so several
//! processes stay gapless too. Writers are tasks of their own: a client that hangs up
//! does not cancel the batch of the others.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use chatpipe_core::{ConversationId, Seq, UserId};
use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use tracing::Instrument;
use uuid::Uuid;

use sqlx::pool::PoolConnection;
use sqlx::Postgres;

mod statement;

use statement::write_rows;

use super::{now, Store};
use crate::configuration::SendSettings;
use crate::domain::MessageBody;

/// What a sender sends: the body, the members it names (ascending, validated by the
/// route) and, for a reply, its thread's root.
#[derive(Clone)]
pub struct Outgoing<'a> {
    pub body: &'a MessageBody,
    pub mentions: Vec<UserId>,
    pub thread_root: Option<Seq>,
    /// The root has left PostgreSQL and was found in the cold tier, a top-level message
    /// not deleted there, sent by this member (after the send answered
    /// [`SendError::RootArchived`]).
    pub cold_root_author: Option<UserId>,
}

/// A message committed, as the sender learns it.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SentMessage {
    pub conversation_id: i64,
    pub seq: i64,
    pub client_msg_id: Uuid,
    pub sender_id: i64,
    pub created_at: DateTime<Utc>,
    /// A reply: its thread's root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread_root_seq: Option<i64>,
}

#[derive(Debug)]
pub enum SendOutcome {
    /// A new message, committed with its seq.
    Created(SentMessage),
    /// A retry of a message already committed: the original, unchanged.
    Replayed(SentMessage),
}

/// Why a send wrote nothing. Turned into an `ApiError` at the route edge.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("conversation not found")]
    NotFound,
    /// A DIRECT conversation with a block either way (store/blocks.rs).
    #[error("a block stands in this DIRECT conversation")]
    Blocked,
    #[error("clientMsgId {client_msg_id} already names message {seq} with a different content")]
    ClientIdReused { client_msg_id: Uuid, seq: i64 },
    #[error("{queued} sends already wait for this conversation")]
    Busy { queued: usize },
    /// `threadRootSeq` names no message a reply can hang under.
    #[error("{}", .problem.detail(*.root))]
    BadThreadRoot {
        root: i64,
        problem: super::threads::BadRoot,
    },
    /// `threadRootSeq` names a message that has left PostgreSQL for the cold tier: the
    /// caller looks it up there and sends again (`Outgoing::cold_root_author`).
    #[error("thread root {root} is in the cold tier")]
    RootArchived { root: Seq },
    /// The statement of this send's batch failed: nothing of the batch was written.
    #[error("the send's batch failed: {0}")]
    Database(Arc<sqlx::Error>),
}

struct Pending {
    conversation: ConversationId,
    sender: UserId,
    client_msg_id: Uuid,
    body: String,
    /// The members it names, ascending (validated by the route).
    mentions: Vec<UserId>,
    /// A reply: its thread's root (checked by the batch, under the delete lock).
    thread_root: Option<Seq>,
    cold_root_author: Option<UserId>,
    created_at: DateTime<Utc>,
    reply: oneshot::Sender<Result<SendOutcome, SendError>>,
    /// The request's `send` span: its batch's span links to it, and its event carries
    /// its trace context (`outbox.traceparent`).
    span: tracing::Span,
}

/// The lanes and writers of one process: see the module docs.
#[derive(Clone)]
pub struct SendQueue {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    settings: SendSettings,
    state: Mutex<Lanes>,
}

#[derive(Default)]
struct Lanes {
    /// A lane exists while it has sends waiting or a batch in flight.
    lanes: HashMap<ConversationId, Lane>,
    /// The lanes with sends waiting and no batch in flight, in the order they became so.
    ready: VecDeque<ConversationId>,
    /// Writer tasks running; each exits when it finds nothing ready.
    writers: usize,
    /// Sends waiting in all lanes (not in a batch yet).
    waiting: usize,
}

impl Lanes {
    fn count_waiting(&mut self, change: isize) {
        self.waiting = self
            .waiting
            .checked_add_signed(change)
            .expect("waiting >= 0");
        metrics::gauge!("send_queue_waiting").set(self.waiting as f64);
    }
}

#[derive(Default)]
struct Lane {
    waiting: VecDeque<Pending>,
    in_flight: bool,
}

impl SendQueue {
    pub fn new(store: Store, settings: SendSettings) -> Self {
        assert!(settings.max_batch >= 1, "sends.max_batch is at least 1");
        assert!(settings.max_writers >= 1, "sends.max_writers is at least 1");
        assert!(settings.max_queued >= 1, "sends.max_queued is at least 1");
        Self {
            inner: Arc::new(Inner {
                store,
                settings,
                state: Mutex::default(),
            }),
        }
    }

    /// Sends one message and waits for its batch's answer (span `send`; the batch that
    /// writes it has a span of its own, `send.batch`, linked to this one).
    #[tracing::instrument(name = "send", skip_all, fields(conversation_id = %conversation))]
    pub async fn send(
        &self,
        conversation: ConversationId,
        sender: UserId,
        client_msg_id: Uuid,
        message: Outgoing<'_>,
    ) -> Result<SendOutcome, SendError> {
        // A non-member gets no lane (store/members.rs); the statement checks again.
        let store = &self.inner.store;
        match store
            .members
            .require(&store.pool, conversation, sender)
            .await
        {
            Ok(()) => {}
            Err(super::StoreError::Database(e)) => return Err(SendError::Database(Arc::new(e))),
            Err(_) => return Err(SendError::NotFound),
        }
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            conversation,
            sender,
            client_msg_id,
            body: message.body.as_str().to_owned(),
            mentions: message.mentions,
            thread_root: message.thread_root,
            cold_root_author: message.cold_root_author,
            created_at: now(),
            reply,
            span: tracing::Span::current(),
        };
        {
            let mut state = self.inner.state.lock().expect("lanes lock");
            let state = &mut *state;
            let lane = state.lanes.entry(conversation).or_default();
            if lane.waiting.len() >= self.inner.settings.max_queued {
                metrics::counter!("send_queue_rejections_total").increment(1);
                return Err(SendError::Busy {
                    queued: lane.waiting.len(),
                });
            }
            lane.waiting.push_back(pending);
            if !lane.in_flight && lane.waiting.len() == 1 {
                state.ready.push_back(conversation);
            }
            state.count_waiting(1);
            if state.writers < self.inner.settings.max_writers {
                state.writers += 1;
                metrics::gauge!("send_writers_busy").set(state.writers as f64);
                tokio::spawn(self.clone().write());
            }
        }
        answer.await.expect("a writer answers every send it takes")
    }

    /// Sends waiting for a writer in this process.
    pub fn waiting(&self) -> usize {
        self.inner.state.lock().expect("lanes lock").waiting
    }

    /// A writer: takes batches from the ready lanes until none is ready, on one pooled
    /// connection (taken once, not per batch: each acquire pings the server).
    async fn write(self) {
        let mut conn = None;
        while let Some(batch) = self.take_batch() {
            let mut lanes: Vec<ConversationId> = batch.iter().map(|p| p.conversation).collect();
            lanes.dedup();
            self.write_batch(&mut conn, batch).await;
            let mut state = self.inner.state.lock().expect("lanes lock");
            for conversation in lanes {
                let lane = state.lanes.get_mut(&conversation).expect("a batch's lane");
                lane.in_flight = false;
                if lane.waiting.is_empty() {
                    state.lanes.remove(&conversation);
                } else {
                    state.ready.push_back(conversation);
                }
            }
        }
    }

    /// Up to `max_batch` waiting sends from the ready lanes, in the order they became
    /// ready, each lane's in its order; their lanes marked in flight. `None`, and the writer counted out, when nothing is ready.
    fn take_batch(&self) -> Option<Vec<Pending>> {
        let mut state = self.inner.state.lock().expect("lanes lock");
        let state = &mut *state;
        let max = self.inner.settings.max_batch;
        let mut batch = Vec::new();
        while batch.len() < max {
            let Some(conversation) = state.ready.pop_front() else {
                break;
            };
            let lane = state.lanes.get_mut(&conversation).expect("a ready lane");
            lane.in_flight = true;
            let n = lane.waiting.len().min(max - batch.len());
            batch.extend(lane.waiting.drain(..n));
            state.count_waiting(-(n as isize));
        }
        if batch.is_empty() {
            state.writers -= 1;
            metrics::gauge!("send_writers_busy").set(state.writers as f64);
            return None;
        }
        Some(batch)
    }

    /// One statement for `batch`; every caller gets its answer. A failed statement
    /// gives its connection back to the pool, which tests it before its next use.
    async fn write_batch(&self, conn: &mut Option<PoolConnection<Postgres>>, batch: Vec<Pending>) {
        let span = tracing::info_span!(parent: None, "send.batch", messages = batch.len());
        for p in &batch {
            chatpipe_core::telemetry::link(&span, &p.span);
        }
        self.write_batch_in(conn, batch).instrument(span).await
    }

    async fn write_batch_in(
        &self,
        conn: &mut Option<PoolConnection<Postgres>>,
        batch: Vec<Pending>,
    ) {
        metrics::histogram!("send_batch_messages").record(batch.len() as f64);
        let db = match conn {
            Some(db) => db,
            None => match self.inner.store.pool.acquire().await {
                Ok(db) => conn.insert(db),
                Err(err) => return fail(batch, err),
            },
        };
        let result = write_rows(db, &self.inner.store.outbox, &batch).await;
        let rows = match result {
            Ok(rows) if rows.len() == batch.len() => rows,
            Ok(rows) => {
                let err = sqlx::Error::Protocol(format!(
                    "chat_send_many answered {} rows for {} messages",
                    rows.len(),
                    batch.len()
                ));
                *conn = None;
                return fail(batch, err);
            }
            Err(err) => {
                *conn = None;
                return fail(batch, err);
            }
        };
        for (p, row) in batch.into_iter().zip(rows) {
            let answer = row.answer(&p);
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
