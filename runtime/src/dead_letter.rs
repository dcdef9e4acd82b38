//! The dead-letter topic: a copy of a bad record with the error and its origin in
//! headers (`error`, `source.topic`, `source.partition`, `source.offset`).

use chatpipe_core::kafka::FutureProducer;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::Message;

/// Copies `message` to `dlq_topic` and waits for the broker's ack (bounded by the
/// producer's `message.timeout.ms`): only then may the reader move past it.
pub async fn write(
    producer: &FutureProducer,
    dlq_topic: &str,
    message: &impl Message,
    error: &str,
) -> anyhow::Result<()> {
    let partition = message.partition().to_string();
    let offset = message.offset().to_string();
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "error",
            value: Some(error),
        })
        .insert(Header {
            key: "source.topic",
            value: Some(message.topic()),
        })
        .insert(Header {
            key: "source.partition",
            value: Some(&partition),
        })
        .insert(Header {
            key: "source.offset",
            value: Some(&offset),
        });
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(dlq_topic).headers(headers);
    if let Some(key) = message.key() {
        record = record.key(key);
    }
    if let Some(payload) = message.payload() {
        record = record.payload(payload);
    }
    producer
        .send(record, std::time::Duration::ZERO)
        .await
        .map_err(|(e, _)| anyhow::anyhow!("producing to {dlq_topic}: {e}"))?;
    Ok(())
}
