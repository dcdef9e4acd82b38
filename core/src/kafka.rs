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

/// A client of `brokers`, nothing else set: the start of a reader's consumer.
pub fn client_config(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
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
