//! The monotone watermark moves (invariant 4). The read move lives once, in SQL
//! (`chat_advance_reads`, sql/functions/), for every writer of read state: ingest-api's
//! direct mode (one receipt per request, through `chat_mark_read`) and the receipts
//! processor's flush (a whole debounce window at once, through [`advance`]). The delivery
//! move has one writer, [`deliver`].
//!
//! A watermark moves only forwards and never past the conversation's `last_seq`; a row
//! that would not move is not touched. The statement returns exactly the rows that
//! moved, which are the ones that get a `read.updated` event. Replaying a batch changes
//! nothing, which is what makes at-least-once delivery of receipts harmless.
//!
//! A move also adds the deleted seqs it passes over to the member's `deleted_read`, which
//! keeps unread counts exact under deletes without counting rows at read time.

use chatpipe_schemas::{
    ChatEvent, ConversationId, DeliveryUpdated, ReadUpdated, Seq, UserId, Watermark,
};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::db;

/// One member's watermark after it moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advanced {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub last_read_seq: Watermark,
}

impl Advanced {
    /// The `read.updated` event that reports the move.
    pub fn event(&self, occurred_at: DateTime<Utc>) -> ChatEvent {
        ChatEvent::ReadUpdated(ReadUpdated {
            conversation_id: self.conversation_id,
            user_id: self.user_id,
            last_read_seq: self.last_read_seq,
            occurred_at,
        })
    }
}

/// Moves each `(conversation, user)` watermark to `LEAST(seq, last_seq)` if that is
/// further than it stands, in the caller's transaction, as one statement. Members that
/// do not exist are skipped. Returns the rows that moved, ordered by (conversation,
/// user). Callers pass batches sorted by key, so concurrent flushes lock rows in one
/// order.
pub async fn advance(
    conn: &mut PgConnection,
    marks: &[((ConversationId, UserId), Seq)],
) -> Result<Vec<Advanced>, sqlx::Error> {
    if marks.is_empty() {
        return Ok(Vec::new());
    }
    let conversations: Vec<i64> = marks.iter().map(|((c, _), _)| c.get()).collect();
    let users: Vec<i64> = marks.iter().map(|((_, u), _)| u.get()).collect();
    let seqs: Vec<i64> = marks.iter().map(|(_, s)| s.get()).collect();
    // chat_advance_reads (migrations/…000003) is the one home of the move: it takes the
    // conversations' delete locks (shared) first, then the guarded UPDATE.
    let mut moved: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT conversation_id, user_id, last_read_seq FROM chat_advance_reads($1, $2, $3)",
    )
    .bind(&conversations)
    .bind(&users)
    .bind(&seqs)
    .fetch_all(conn)
    .await?;
    moved.sort_unstable();
    moved
        .into_iter()
        .map(|(conversation_id, user_id, last_read_seq)| {
            Ok(Advanced {
                conversation_id: db::id(conversation_id)?,
                user_id: db::id(user_id)?,
                last_read_seq: db::id(last_read_seq)?,
            })
        })
        .collect()
}

/// One member's delivery watermark after it moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub last_delivered_seq: Watermark,
}

impl Delivered {
    /// The `delivery.updated` event that reports the move.
    pub fn event(&self, occurred_at: DateTime<Utc>) -> ChatEvent {
        ChatEvent::DeliveryUpdated(DeliveryUpdated {
            conversation_id: self.conversation_id,
            user_id: self.user_id,
            last_delivered_seq: self.last_delivered_seq,
            occurred_at,
        })
    }
}

/// What a batch of delivery acks did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Deliveries {
    /// The rows that moved, ordered by (conversation, user).
    pub moved: Vec<Delivered>,
    /// Acks for a conversation the user is not a member of: dropped.
    pub from_non_members: usize,
}

/// Moves each `(conversation, user)` delivery watermark to `LEAST(seq, last_seq)` if that
/// is further than it stands, as [`advance`] moves reads, in one statement. Reads move
/// it too (a trigger keeps `last_delivered_seq >= last_read_seq`, migration
/// 20261201000009); this is for acks, which say a device got the messages. Acks of
/// non-members change nothing and are counted.
pub async fn deliver(
    conn: &mut PgConnection,
    acks: &[((ConversationId, UserId), Seq)],
) -> Result<Deliveries, sqlx::Error> {
    if acks.is_empty() {
        return Ok(Deliveries::default());
    }
    let conversations: Vec<i64> = acks.iter().map(|((c, _), _)| c.get()).collect();
    let users: Vec<i64> = acks.iter().map(|((_, u), _)| u.get()).collect();
    let seqs: Vec<i64> = acks.iter().map(|(_, s)| s.get()).collect();
    let rows: Vec<(bool, i64, i64, i64)> = sqlx::query_as(
        "WITH b AS (
              SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[])
                         AS b(conversation_id, user_id, seq)),
              moved AS (
              UPDATE conversation_member m
                 SET last_delivered_seq = LEAST(b.seq, c.last_seq)
                FROM b JOIN conversation c ON c.id = b.conversation_id
               WHERE m.conversation_id = b.conversation_id
                 AND m.user_id = b.user_id
                 AND m.last_delivered_seq < LEAST(b.seq, c.last_seq)
           RETURNING m.conversation_id, m.user_id, m.last_delivered_seq)
         SELECT true, conversation_id, user_id, last_delivered_seq FROM moved
          UNION ALL
         SELECT false, b.conversation_id, b.user_id, b.seq FROM b
          WHERE NOT EXISTS (SELECT 1 FROM conversation_member m
                             WHERE m.conversation_id = b.conversation_id
                               AND m.user_id = b.user_id)",
    )
    .bind(&conversations)
    .bind(&users)
    .bind(&seqs)
    .fetch_all(conn)
    .await?;
    let mut out = Deliveries::default();
    for (moved, conversation_id, user_id, seq) in rows {
        if !moved {
            out.from_non_members += 1;
            continue;
        }
        out.moved.push(Delivered {
            conversation_id: db::id(conversation_id)?,
            user_id: db::id(user_id)?,
            last_delivered_seq: db::id(seq)?,
        });
    }
    out.moved
        .sort_unstable_by_key(|d| (d.conversation_id, d.user_id));
    Ok(out)
}
