//! The transactional outbox: events written in the transaction of the change they
//! describe, for Debezium's outbox EventRouter to stream to `chat.events`. Every
//! service that changes state (ingest-api, the receipts processor) writes through this.

use chatpipe_schemas::avro::EventCodec;
use chatpipe_schemas::{ChatEvent, AGGREGATE_TYPE};
use sqlx::PgConnection;
use uuid::Uuid;

/// Writes events to the `outbox` table, Avro-encoded in the Confluent framing, for
/// Debezium's EventRouter to route to `chat.events`, keyed by conversation id.
#[derive(Clone)]
pub struct Outbox {
    codec: EventCodec,
    /// Delete each row in the transaction that wrote it (the WAL keeps the insert for
    /// Debezium), unless rows are kept until the auditor confirms them
    /// (`outbox.retain_until_confirmed`).
    delete_after_write: bool,
}

impl Outbox {
    pub fn new(codec: EventCodec, retain_until_confirmed: bool) -> Self {
        Self {
            codec,
            delete_after_write: !retain_until_confirmed,
        }
    }

    pub fn codec(&self) -> &EventCodec {
        &self.codec
    }

    /// Whether rows are deleted in the transaction that wrote them.
    pub fn deletes_after_write(&self) -> bool {
        self.delete_after_write
    }

    /// Writes events in the caller's transaction, in the given order.
    pub async fn write(
        &self,
        conn: &mut PgConnection,
        events: &[ChatEvent],
    ) -> Result<(), sqlx::Error> {
        if events.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = events.iter().map(|_| Uuid::new_v4()).collect();
        let keys: Vec<String> = events
            .iter()
            .map(|e| e.conversation_id().to_string())
            .collect();
        let types: Vec<&str> = events.iter().map(ChatEvent::event_type).collect();
        let payloads: Vec<Vec<u8>> = events.iter().map(|e| self.codec.encode(e)).collect();
        // One home for the outbox INSERT: chat_outbox_write (migrations/…000003), which
        // keeps the events' order in the WAL and deletes the rows again when configured to.
        sqlx::query("SELECT chat_outbox_write($1, $2, $3, $4, $5, $6)")
            .bind(&ids)
            .bind(AGGREGATE_TYPE)
            .bind(&keys)
            .bind(&types)
            .bind(&payloads)
            .bind(self.delete_after_write)
            .execute(&mut *conn)
            .await?;
        for t in types {
            metrics::counter!("outbox_events_written_total", "type" => t).increment(1);
        }
        Ok(())
    }
}

/// Now, at the database's precision (microseconds), so what a service returns equals
/// what it stores.
pub fn now() -> chrono::DateTime<chrono::Utc> {
    let now = chrono::Utc::now();
    chrono::DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}
