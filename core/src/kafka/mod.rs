//! Kafka client settings every chatpipe producer and consumer starts from, and the one
//! way to make a client ([`create`]), which keeps it from losing every broker
//! ([`rebootstrap`]).

use rdkafka::ClientConfig;

pub mod rebootstrap;

pub use rebootstrap::{create, create_with, CreateGuarded, Guarded, NativeClient, Rebootstrap};

/// The producer most of our code sends with (records awaited one by one), guarded.
pub type FutureProducer = rdkafka::producer::FutureProducer<Guarded>;
/// A producer polled by its owner (delivery reports in the owner's loop), guarded.
pub type BaseProducer = rdkafka::producer::BaseProducer<Guarded>;
/// A consumer polled by its owner, guarded.
pub type BaseConsumer = rdkafka::consumer::BaseConsumer<Guarded>;
/// An admin client (topics, configs), guarded.
pub type AdminClient = rdkafka::admin::AdminClient<Guarded>;
/// A consumer read as a stream (tail, tests), guarded.
pub type StreamConsumer = rdkafka::consumer::StreamConsumer<Guarded>;

/// How long a client may go without metadata from any broker before it starts again from
/// `bootstrap.servers` (librdkafka's `metadata.recovery.rebootstrap.trigger.ms`, KIP-1102;
/// its default is five minutes). It does not rescue a client that a broker-less metadata
/// response stranded (that response counts as metadata and stops this timer): that is
/// [`rebootstrap`]'s work.
const REBOOTSTRAP_AFTER_MS: &str = "10000";

/// How long a connection to a broker may take to become usable (TCP, TLS, SASL and the
/// ApiVersion exchange) before librdkafka drops it and tries again
/// (`socket.connection.setup.timeout.ms`; its default is 30 s). A broker that is
/// starting, or stopped (SIGSTOP), accepts connections and does not answer them: seen as
/// "Connection setup timed out in state APIVERSION_QUERY" in the broker tests. With this
/// bound a client tries again within seconds of the broker serving.
const CONNECTION_SETUP_MS: &str = "5000";

/// How long a request may wait for its answer before librdkafka fails it and tries again
/// on a new connection (`socket.timeout.ms`; its default is 60 s). Seen after a 90 s
/// broker stall (2026-12-01, a full run): a FindCoordinator request sent 2 s after the
/// broker resumed was never answered and timed out after 60 s, and with it the group's
/// coordinator, so the member could not rejoin for a minute. A broker here answers in
/// milliseconds; 15 s leaves room for a loaded machine and bounds such a request.
const REQUEST_TIMEOUT_MS: &str = "15000";

/// What every client of ours starts from.
fn base(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set(
            "metadata.recovery.rebootstrap.trigger.ms",
            REBOOTSTRAP_AFTER_MS,
        )
        .set("socket.connection.setup.timeout.ms", CONNECTION_SETUP_MS)
        .set("socket.timeout.ms", REQUEST_TIMEOUT_MS);
    config
}

/// A producer that neither loses nor duplicates nor reorders what it was acknowledged:
/// idempotent, `acks=all`, and keys hashed with murmur2 like Java's default partitioner,
/// so a conversation's records land on the partition Debezium (Java) puts its events on.
pub fn producer_config(brokers: &str) -> ClientConfig {
    let mut config = base(brokers);
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "2")
        .set("compression.type", "lz4");
    config
}

/// Sets an operator's librdkafka `properties` on `config` (`[kafka.properties]` in each
/// service's config, or `CHATPIPE_KAFKA__PROPERTIES='{security.protocol="SASL_SSL", …}'`):
/// TLS and SASL (`security.protocol`, `ssl.ca.location`, `sasl.mechanisms`,
/// `sasl.username`, `sasl.password`), or any other tuning. They are set last, so they win
/// over ours; librdkafka refuses an unknown one when the client is created.
pub fn apply(mut config: ClientConfig, properties: &Properties) -> ClientConfig {
    for (key, value) in properties.iter() {
        config.set(key, value);
    }
    config
}

/// An operator's librdkafka properties (`[kafka.properties]`). Printed with their
/// credentials masked ([`crate::redact::properties`]): a `Debug` of the settings, in a
/// log line or an error, never shows `sasl.password`.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Properties(std::collections::BTreeMap<String, String>);

impl std::ops::Deref for Properties {
    type Target = std::collections::BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl From<std::collections::BTreeMap<String, String>> for Properties {
    fn from(map: std::collections::BTreeMap<String, String>) -> Self {
        Self(map)
    }
}

impl FromIterator<(String, String)> for Properties {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl std::fmt::Debug for Properties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(crate::redact::properties(&self.0))
            .finish()
    }
}

/// The properties of `config` that say how to reach the cluster (`security.protocol`,
/// `ssl.*`, `sasl.*`): a client made for the same cluster from another start (the
/// dead-letter producer of a reader) copies them. Values are read with `get`:
/// `config_map` hides the secrets (`sasl.password` reads "[sanitized for safety]"), and
/// a copy of that logged in with the wrong password, so no dead letter ever reached a
/// SASL listener.
pub fn transport_of(config: &ClientConfig) -> Properties {
    config
        .config_map()
        .keys()
        .filter(|k| **k == "security.protocol" || k.starts_with("ssl.") || k.starts_with("sasl."))
        .filter_map(|k| Some((k.to_string(), config.get(k)?.to_owned())))
        .collect()
}

/// A client of `brokers`, nothing else set: the start of a reader's consumer.
pub fn client_config(brokers: &str) -> ClientConfig {
    base(brokers)
}

/// A consumer in `group` that commits offsets itself, after its side effects, and reads
/// only committed records.
pub fn consumer_config(brokers: &str, group: &str) -> ClientConfig {
    let mut config = base(brokers);
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed");
    config
}

/// The partition Kafka's default partitioner (and ours, `murmur2_random`) gives a keyed
/// record: `murmur2(key) & 0x7fffffff` modulo the partitions, murmur2 as Kafka's
/// `Utils.murmur2` (seed 0x9747b28c).
pub fn partition_of(key: &[u8], partitions: i32) -> i32 {
    ((murmur2(key) & 0x7fff_ffff) % partitions.max(1) as u32) as i32
}

fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        for (i, &b) in rest.iter().enumerate().rev() {
            h ^= u32::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

#[cfg(test)]
mod partition_tests {
    use super::{murmur2, partition_of};

    #[test]
    fn keys_hash_as_kafka_hashes_them() {
        // Kafka's own vectors (UtilsTest.testMurmur2).
        for (key, hash) in [
            ("21", -973932308),
            ("foobar", -790332482),
            ("a-little-bit-long-string", -985981536),
            ("a-little-bit-longer-string", -1486304829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            ("abc", 479470107),
        ] {
            assert_eq!(murmur2(key.as_bytes()) as i32, hash, "{key}");
        }
        assert_eq!(partition_of(b"21", 6), (-973932308i32 & 0x7fff_ffff) % 6);
    }
}

#[cfg(test)]
mod properties_tests {
    use super::Properties;

    #[test]
    fn debug_masks_the_sasl_password() {
        let props: Properties = [
            ("sasl.username".to_owned(), "svc".to_owned()),
            ("sasl.password".to_owned(), "hunter2-hunter2".to_owned()),
        ]
        .into_iter()
        .collect();
        let shown = format!("{props:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("svc"), "{shown}");
    }

    #[test]
    fn the_transport_copied_for_a_dead_letter_producer_keeps_the_real_password() {
        let mut config = super::client_config("broker:9094");
        config
            .set("security.protocol", "SASL_SSL")
            .set("sasl.username", "chatpipe_pipeline")
            .set("sasl.password", "hunter2-hunter2")
            .set("group.id", "not-transport");
        let transport = super::transport_of(&config);
        let copied = super::apply(super::producer_config("broker:9094"), &transport);
        assert_eq!(copied.get("sasl.password"), Some("hunter2-hunter2"));
        assert_eq!(copied.get("sasl.username"), Some("chatpipe_pipeline"));
        assert_eq!(copied.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(copied.get("group.id"), None);
    }
}
