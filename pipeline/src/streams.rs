//! What every processor's consumer loop needs: writer schemas by id without awaiting in
//! the loop, and consumer lag from librdkafka's statistics.

use std::collections::HashMap;

use apache_avro::Schema;
use chatpipe_schemas::avro::split_frame;
use chatpipe_schemas::registry::EventDecoder;
use tokio::runtime::Handle;

/// What a processor thread starts with: a runtime for its async calls (database,
/// registry) and the registry client. One worker thread drives the runtime's IO, so code
/// inside a Kafka callback can `block_on` through a Handle (a current-thread runtime
/// would not drive IO there and the call would never finish).
pub fn processor_runtime(
    settings: &crate::settings::Settings,
) -> anyhow::Result<(
    tokio::runtime::Runtime,
    chatpipe_schemas::registry::Registry,
)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let registry = chatpipe_schemas::registry::Registry::new(
        &settings.registry.url,
        std::time::Duration::from_millis(settings.registry.timeout_ms),
    )?;
    Ok((rt, registry))
}

/// Writer schemas by id, held by one consumer thread: decoding stays synchronous, the
/// registry is asked once per schema version.
pub struct WriterSchemas {
    cache: HashMap<u32, Schema>,
    decoder: EventDecoder,
    handle: Handle,
}

impl WriterSchemas {
    pub fn new(decoder: EventDecoder, handle: Handle) -> Self {
        Self {
            cache: HashMap::new(),
            decoder,
            handle,
        }
    }

    /// The schema the framed `bytes` were written with.
    pub fn of(&mut self, bytes: &[u8]) -> Result<&Schema, String> {
        let (id, _) = split_frame(bytes).map_err(|e| e.to_string())?;
        match self.cache.entry(id) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => Ok(e.insert(
                self.handle
                    .block_on(self.decoder.writer_schema(id))
                    .map_err(|e| e.to_string())?,
            )),
        }
    }
}

/// Sets `gauge{partition}` to the consumer lag of each partition of `topic`, from
/// librdkafka's statistics (no broker round trip: a watermark query would queue behind
/// the long-poll fetch and stall the loop).
pub fn record_lag(statistics: &rdkafka::Statistics, topic: &str, gauge: &'static str) {
    if let Some(topic) = statistics.topics.get(topic) {
        for (partition, p) in &topic.partitions {
            if *partition >= 0 && p.consumer_lag >= 0 {
                metrics::gauge!(gauge, "partition" => partition.to_string())
                    .set(p.consumer_lag as f64);
            }
        }
    }
}
