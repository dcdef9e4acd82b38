//! SQL lives here and only here. Every function that changes state writes its events to
//! the outbox inside the same transaction.

pub mod conversations;
pub mod inbox;
pub mod messages;
pub mod reads;

use chatpipe_schemas::{ChatEvent, AGGREGATE_TYPE};
use sqlx::PgConnection;

/// Writes events to the outbox in the caller's transaction, in the given order.
pub async fn write_outbox(
    conn: &mut PgConnection,
    events: &[ChatEvent],
) -> Result<(), sqlx::Error> {
    if events.is_empty() {
        return Ok(());
    }
    let keys: Vec<String> = events
        .iter()
        .map(|e| e.conversation_id().to_string())
        .collect();
    let types: Vec<&str> = events.iter().map(ChatEvent::event_type).collect();
    let payloads: Vec<Vec<u8>> = events.iter().map(ChatEvent::encode).collect();
    // WITH ORDINALITY keeps the order of the events in the WAL, and so on the topic.
    sqlx::query(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
         SELECT $1, k, t, p
           FROM unnest($2::text[], $3::text[], $4::bytea[]) WITH ORDINALITY AS e(k, t, p, n)
          ORDER BY n",
    )
    .bind(AGGREGATE_TYPE)
    .bind(&keys)
    .bind(&types)
    .bind(&payloads)
    .execute(&mut *conn)
    .await?;
    for t in types {
        metrics::counter!("outbox_events_written_total", "type" => t).increment(1);
    }
    Ok(())
}

/// Now, at the database's precision (microseconds), so what we return equals what we store.
pub fn now() -> chrono::DateTime<chrono::Utc> {
    let now = chrono::Utc::now();
    chrono::DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}
