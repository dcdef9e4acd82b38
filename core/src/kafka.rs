//! Kafka client settings every chatpipe producer and consumer starts from.

use rdkafka::ClientConfig;

/// A producer that neither loses nor duplicates nor reorders what it was acknowledged:
/// idempotent, `acks=all`, and keys hashed with murmur2 like Java's default partitioner,
/// so a conversation's records land on the partition Debezium (Java) puts its events on.
pub fn producer_config(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "2")
        .set("compression.type", "lz4");
    config
}

/// A consumer in `group` that commits offsets itself, after its side effects, and reads
/// only committed records.
pub fn consumer_config(brokers: &str, group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed");
    config
}

/// Copies an undecodable `message` to `dlq_topic` with the error and its origin in
/// headers (`error`, `source.topic`, `source.partition`, `source.offset`), and waits for
/// the broker's ack: only then may the caller move past it.
pub async fn dead_letter(
    producer: &rdkafka::producer::FutureProducer,
    dlq_topic: &str,
    message: &impl rdkafka::Message,
    error: &str,
) -> anyhow::Result<()> {
    use rdkafka::message::{Header, OwnedHeaders};
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
    let mut record: rdkafka::producer::FutureRecord<'_, [u8], [u8]> =
        rdkafka::producer::FutureRecord::to(dlq_topic).headers(headers);
    if let Some(key) = message.key() {
        record = record.key(key);
    }
    if let Some(payload) = message.payload() {
        record = record.payload(payload);
    }
    producer
        .send(record, std::time::Duration::from_secs(10))
        .await
        .map_err(|(e, _)| anyhow::anyhow!("producing to {dlq_topic}: {e}"))?;
    Ok(())
}
