//! One flush = one transaction: the whole batch in one set-based, monotone UPDATE of the
//! read watermarks or, for delivery acks, of the delivery watermarks
//! ([`chatpipe_core::watermark::advance`], the original design's guarded statement over arrays), `read.updated`
//! outbox events for exactly the rows that advanced, COMMIT. Replaying a batch changes
//! nothing and emits nothing, because the UPDATE only ever moves a watermark forwards.

use chatpipe_core::outbox::{now, Outbox};
use chatpipe_core::watermark;
use chatpipe_schemas::ChatEvent;
use sqlx::PgPool;

use super::window::Batch;
use super::Mark;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Flushed {
    /// Members whose watermark moved (and got a read.updated or delivery.updated event).
    pub advanced: usize,
    /// Acks from users who are not members of the conversation: dropped.
    pub from_non_members: usize,
}

pub async fn flush(
    pool: &PgPool,
    outbox: &Outbox,
    mark: Mark,
    batch: &Batch,
) -> Result<Flushed, sqlx::Error> {
    if batch.watermarks.is_empty() {
        return Ok(Flushed::default());
    }
    let mut tx = pool.begin().await?;
    let at = now();
    // Per conversation in one order, so each conversation's events are in one place.
    let (events, from_non_members): (Vec<ChatEvent>, usize) = match mark {
        Mark::Read => {
            let advanced = watermark::advance(&mut tx, &batch.watermarks).await?;
            (advanced.iter().map(|a| a.event(at)).collect(), 0)
        }
        Mark::Delivered => {
            let d = watermark::deliver(&mut tx, &batch.watermarks).await?;
            (
                d.moved.iter().map(|a| a.event(at)).collect(),
                d.from_non_members,
            )
        }
    };
    outbox.write(&mut tx, &events).await?;
    tx.commit().await?;
    Ok(Flushed {
        advanced: events.len(),
        from_non_members,
    })
}
