//! Read state: the monotone watermark and "read by N".

use chatpipe_core::{ConversationId, Seq, UserId, Watermark};
use chatpipe_schemas::{ReadUpdated, AGGREGATE_TYPE};
use serde::Serialize;
use uuid::Uuid;

use super::{now, Store, StoreError};

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadOutcome {
    pub last_read_seq: i64,
    /// False when the watermark was already at or past the (clamped) seq.
    pub advanced: bool,
}

/// The guarded UPDATE of the original design (docs/architecture.md, "Reading"): the watermark moves only forwards and never past
/// `last_seq`. `read.updated` goes to the outbox only when it moved, in the same
/// transaction. One round trip: `chat_mark_read` (migrations/) splices the watermark
/// where it landed into the event's bytes.
pub async fn mark_read(
    db: &Store,
    conversation: ConversationId,
    reader: UserId,
    seq: Seq,
) -> Result<ReadOutcome, StoreError> {
    let splice = db
        .outbox
        .codec()
        .read_updated_around_watermark(ReadUpdated {
            conversation_id: conversation,
            user_id: reader,
            // Where it lands is the statement's to say; spliced into the bytes there.
            last_read_seq: Watermark::ZERO,
            occurred_at: now(),
        });
    let (last_read_seq, advanced): (i64, bool) = sqlx::query_as(
        "SELECT last_read_seq, advanced FROM chat_mark_read($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(conversation.get())
    .bind(reader.get())
    .bind(seq.get())
    .bind(Uuid::new_v4())
    .bind(&splice.head)
    .bind(&splice.tail)
    .bind(AGGREGATE_TYPE)
    .bind(db.outbox.deletes_after_write())
    .fetch_optional(&db.pool)
    .await?
    .ok_or_else(StoreError::conversation_not_found)?;
    if advanced {
        metrics::counter!("read_watermark_advances_total").increment(1);
        metrics::counter!("outbox_events_written_total", "type" => "read.updated").increment(1);
    }
    Ok(ReadOutcome {
        last_read_seq,
        advanced,
    })
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveredOutcome {
    pub last_delivered_seq: i64,
    /// False when the delivery watermark was already at or past the (clamped) seq.
    pub advanced: bool,
}

/// Direct mode's delivery ack: the delivery watermark moves forwards only, never past
/// `last_seq`; `delivery.updated` goes to the outbox in the same transaction when it
/// moved. 404 for a non-member.
pub async fn mark_delivered(
    db: &Store,
    conversation: ConversationId,
    user: UserId,
    seq: Seq,
) -> Result<DeliveredOutcome, StoreError> {
    let mut tx = db.pool.begin().await?;
    let done = chatpipe_core::watermark::deliver(&mut tx, &[((conversation, user), seq)]).await?;
    if done.from_non_members > 0 {
        return Err(StoreError::conversation_not_found());
    }
    let events: Vec<_> = done.moved.iter().map(|d| d.event(now())).collect();
    db.outbox.write(&mut tx, &events).await?;
    let last_delivered_seq: i64 = sqlx::query_scalar(
        "SELECT last_delivered_seq FROM conversation_member
          WHERE conversation_id = $1 AND user_id = $2",
    )
    .bind(conversation.get())
    .bind(user.get())
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(DeliveredOutcome {
        last_delivered_seq,
        advanced: !events.is_empty(),
    })
}

/// Receipts of one message: "read by N" for a group, "read" for a DIRECT chat.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", untagged)]
pub enum Receipts {
    #[serde(rename_all = "camelCase")]
    Group {
        conversation_id: i64,
        seq: i64,
        /// Members other than the sender whose watermark is at or past `seq`.
        read_by: i64,
        /// Members other than the sender whose devices got it (readers included).
        delivered_to: i64,
        /// All members, the sender included.
        member_count: i32,
    },
    #[serde(rename_all = "camelCase")]
    Direct {
        conversation_id: i64,
        seq: i64,
        read: bool,
        delivered: bool,
    },
}

/// How many members other than its sender have read and have received message `$1`, `$2`.
pub const RECEIPTS_SQL: &str = "SELECT (SELECT count(*) FROM conversation_member r
                  WHERE r.conversation_id = msg.conversation_id
                    AND r.last_read_seq >= msg.seq
                    AND r.user_id <> msg.sender_id),
                (SELECT count(*) FROM conversation_member r
                  WHERE r.conversation_id = msg.conversation_id
                    AND r.last_delivered_seq >= msg.seq
                    AND r.user_id <> msg.sender_id)
           FROM message msg
          WHERE msg.conversation_id = $1 AND msg.seq = $2";

/// Counts members with `last_read_seq >= seq` (a range scan on the watermark index);
/// there are no per-message receipt rows.
pub async fn receipts(
    db: &Store,
    conversation: ConversationId,
    caller: UserId,
    seq: Seq,
) -> Result<Receipts, StoreError> {
    let super::MemberView {
        kind, member_count, ..
    } = super::as_member(db, conversation, caller).await?;

    let (read_by, delivered_to): (i64, i64) = sqlx::query_as(RECEIPTS_SQL)
        .bind(conversation.get())
        .bind(seq.get())
        .fetch_optional(&db.pool)
        .await?
        .ok_or(StoreError::NotFound { what: "message" })?;

    Ok(if kind == crate::domain::ConversationKind::Direct {
        Receipts::Direct {
            conversation_id: conversation.get(),
            seq: seq.get(),
            read: read_by > 0,
            delivered: delivered_to > 0,
        }
    } else {
        Receipts::Group {
            conversation_id: conversation.get(),
            seq: seq.get(),
            read_by,
            delivered_to,
            member_count,
        }
    })
}
