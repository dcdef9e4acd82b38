//! One flush = one transaction: the whole batch in one set-based, monotone UPDATE
//! ([`chatpipe_core::watermark::advance`], the article's guarded statement over arrays), `read.updated`
//! outbox events for exactly the rows that advanced, COMMIT. Replaying a batch changes
//! nothing and emits nothing, because the UPDATE only ever moves a watermark forwards.

use chatpipe_core::outbox::{now, Outbox};
use chatpipe_core::watermark;
use chatpipe_schemas::ChatEvent;
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
    let mut tx = pool.begin().await?;
    let advanced = watermark::advance(&mut tx, &batch.watermarks).await?;
    let at = now();
    // Per conversation in one order, so each conversation's events are in one place.
    let events: Vec<ChatEvent> = advanced.iter().map(|a| a.event(at)).collect();
    outbox.write(&mut tx, &events).await?;
    tx.commit().await?;
    Ok(Flushed {
        advanced: advanced.len(),
    })
}
