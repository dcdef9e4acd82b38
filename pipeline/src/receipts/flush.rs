//! One flush = one transaction: the whole batch in one set-based, monotone UPDATE
//! (the article's guarded statement over arrays, clamped to last_seq), `read.updated`
//! outbox events for exactly the rows that advanced, COMMIT. Replaying a batch changes
//! nothing and emits nothing, because the UPDATE only ever moves a watermark forwards.

use chatpipe_core::outbox::{now, Outbox};
use chatpipe_schemas::{ChatEvent, ReadUpdated};
use sqlx::PgPool;

use super::window::Batch;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Flushed {
    /// Members whose watermark moved (and got a read.updated event).
    pub advanced: usize,
}

pub async fn flush(pool: &PgPool, outbox: &Outbox, batch: &Batch) -> Result<Flushed, sqlx::Error> {
    if batch.watermarks.is_empty() {
        return Ok(Flushed::default());
    }
    let conversations: Vec<i64> = batch.watermarks.iter().map(|((c, _), _)| *c).collect();
    let users: Vec<i64> = batch.watermarks.iter().map(|((_, u), _)| *u).collect();
    let seqs: Vec<i64> = batch.watermarks.iter().map(|(_, s)| *s).collect();
    let mut tx = pool.begin().await?;
    let advanced: Vec<(i64, i64, i64)> = sqlx::query_as(
        "UPDATE conversation_member m
            SET last_read_seq = LEAST(b.seq, c.last_seq)
           FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS b(conversation_id, user_id, seq)
           JOIN conversation c ON c.id = b.conversation_id
          WHERE m.conversation_id = b.conversation_id
            AND m.user_id = b.user_id
            AND m.last_read_seq < LEAST(b.seq, c.last_seq)
      RETURNING m.conversation_id, m.user_id, m.last_read_seq",
    )
    .bind(&conversations)
    .bind(&users)
    .bind(&seqs)
    .fetch_all(&mut *tx)
    .await?;
    let at = now();
    let mut events: Vec<ChatEvent> = advanced
        .iter()
        .map(|&(conversation_id, user_id, last_read_seq)| {
            ChatEvent::ReadUpdated(ReadUpdated {
                conversation_id,
                user_id,
                last_read_seq,
                occurred_at: at,
            })
        })
        .collect();
    // Per conversation in one order, so each conversation's events are in one place.
    events.sort_by_key(|e| match e {
        ChatEvent::ReadUpdated(r) => (r.conversation_id, r.user_id),
        _ => (0, 0),
    });
    outbox.write(&mut tx, &events).await?;
    tx.commit().await?;
    Ok(Flushed {
        advanced: advanced.len(),
    })
}
